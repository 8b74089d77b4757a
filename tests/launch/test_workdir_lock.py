"""One job per workdir: a second job is refused, naming the first; the lock
goes with the process that held it."""

import errno
import fcntl
import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from sparsepipe.launch import LOCK_FILENAME
from sparsepipe.launch import WorkdirInUseError
from sparsepipe.launch import exclusive_workdir
from sparsepipe.launch import train_and_evaluate

import launch_testing  # pylint: disable=g-bad-import-order
import subprocess_harness as harness  # pylint: disable=g-bad-import-order


def _in_use(workdir, pid):
  """The refusal, as a regex (the start time varies)."""
  who = f"pid {pid} on {socket.gethostname()}, started "
  return (
    re.escape(f"workdir {workdir} is in use by another job ({who}")
    + r"[^)]+"
    + re.escape(
      "); two jobs in one workdir overwrite each other's checkpoints and metrics: stop that"
      " job first, or give this one another workdir"
    )
  )


def test_a_second_job_is_refused_before_it_touches_the_workdir(tmp_path):
  workdir = str(tmp_path / "job")
  with exclusive_workdir(workdir):
    with open(os.path.join(workdir, LOCK_FILENAME)) as f:
      owner = json.load(f)
    assert (owner["pid"], owner["host"]) == (os.getpid(), socket.gethostname())
    with pytest.raises(WorkdirInUseError, match=f"^{_in_use(workdir, os.getpid())}$"):
      train_and_evaluate(launch_testing.tiny_config(), workdir)
    assert os.listdir(workdir) == [LOCK_FILENAME]
  with exclusive_workdir(workdir):  # released at the end of the block
    pass


def test_the_launcher_reports_a_held_workdir_in_one_line(tmp_path):
  workdir = str(tmp_path / "job")
  command = launch_testing.launch_command(workdir)
  with exclusive_workdir(workdir):
    out = subprocess.run(
      command, env=harness.cpu_env(8), capture_output=True, text=True, timeout=300
    )
  assert out.returncode == 1, out.stderr
  assert re.fullmatch(f"error: {_in_use(workdir, os.getpid())}\n", out.stderr), out.stderr


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
  workdir = str(tmp_path / "job")
  holder = subprocess.Popen(
    [
      sys.executable,
      "-c",
      "import sys, time; from sparsepipe.launch import exclusive_workdir\n"
      "with exclusive_workdir(sys.argv[1]):\n"
      "  print('held', flush=True); time.sleep(600)",
      workdir,
    ],
    env=harness.cpu_env(1),
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(WorkdirInUseError, match=f"^{_in_use(workdir, holder.pid)}$"):
      with exclusive_workdir(workdir):
        pass
  finally:
    holder.kill()
    holder.wait()
  deadline = time.monotonic() + 30
  while True:  # the kernel drops the lock when the killed process is reaped
    try:
      with exclusive_workdir(workdir):
        break
    except WorkdirInUseError:
      assert time.monotonic() < deadline, "the lock outlived its killed holder"
      time.sleep(0.1)


def test_a_file_system_without_locks_runs_unguarded_with_a_warning(tmp_path, monkeypatch, caplog):
  import fcntl  # pylint: disable=g-import-not-at-top

  def no_locks(fd, operation):
    raise OSError(errno.ENOLCK, "No locks available")

  monkeypatch.setattr(fcntl, "flock", no_locks)
  workdir = str(tmp_path / "job")
  # The absl logger's own level: other tests' code sets absl's verbosity.
  with caplog.at_level("WARNING", logger="absl"):
    with exclusive_workdir(workdir):
      pass
  path = os.path.join(workdir, LOCK_FILENAME)
  assert [r.getMessage() for r in caplog.records] == [
    f"cannot lock {path} ([Errno {errno.ENOLCK}] No locks available): a second job in it"
    " would not be detected"
  ]


def test_a_failed_launch_leaves_no_lock_file_and_no_empty_workdir(tmp_path):
  workdir = str(tmp_path / "new")
  out = subprocess.run(
    [sys.executable, "-m", "sparsepipe.launch", "--config=dataset", f"--workdir={workdir}"],
    env=harness.cpu_env(1),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert (out.returncode, out.stderr) == (
    1,
    "error: config.features_from_manifest: the features come from the train data, set"
    " --config.data.dir to a dataset directory (with manifest.json)\n",
  )
  assert not os.path.exists(workdir)
  existing = tmp_path / "existing"
  existing.mkdir()
  with exclusive_workdir(str(existing)):
    assert os.listdir(existing) == [LOCK_FILENAME]
  assert os.path.isdir(existing) and os.listdir(existing) == []  # not made here: kept


def test_a_workdir_made_by_a_launch_that_fails_before_keeping_it_is_removed(tmp_path):
  made = tmp_path / "made"
  with pytest.raises(RuntimeError, match="late"):
    with exclusive_workdir(str(made)):
      (made / "data").mkdir()
      (made / "data" / "manifest.json").write_text("{}")
      (made / "job.json").write_text("{}")
      raise RuntimeError("late")
  assert not os.path.exists(made)
  with exclusive_workdir(str(made)) as lease:
    (made / "job.json").write_text("{}")
    lease.keep()
  assert os.listdir(made) == ["job.json"]  # kept: the job started
  with pytest.raises(RuntimeError, match="late"):
    with exclusive_workdir(str(made)):  # not made by this launch: nothing removed
      (made / "metrics.jsonl").write_text("")
      raise RuntimeError("late")
  assert sorted(os.listdir(made)) == ["job.json", "metrics.jsonl"]
  # An existing workdir loses only the named entries this launch wrote (generated data).
  (made / "data_eval").mkdir()
  with pytest.raises(RuntimeError, match="late"):
    with exclusive_workdir(str(made), discard=("data", "data_eval")):
      (made / "data").mkdir()
      (made / "data" / "manifest.json").write_text("{}")
      (made / "notes.txt").write_text("")
      raise RuntimeError("late")
  assert sorted(os.listdir(made)) == ["data_eval", "job.json", "metrics.jsonl", "notes.txt"]
  # The folders made above a new workdir go with it; the one that existed stays.
  deep = tmp_path / "a" / "b" / "c"
  with pytest.raises(RuntimeError, match="late"):
    with exclusive_workdir(str(deep)):
      raise RuntimeError("late")
  assert not os.path.exists(tmp_path / "a") and os.path.isdir(tmp_path)


def test_a_lock_file_removed_by_its_holder_is_not_held_twice(tmp_path, monkeypatch):
  """The holder removes the file as a second job opens it: the second locks a new one."""
  workdir = str(tmp_path / "job")
  os.makedirs(workdir)
  path = os.path.join(workdir, LOCK_FILENAME)
  opened = []
  real_open = open

  def racing_open(name, *args, **kwargs):
    handle = real_open(name, *args, **kwargs)
    if name == path and not opened:
      opened.append(os.fstat(handle.fileno()).st_ino)
      os.unlink(path)  # as a releasing holder would, right after this open
    return handle

  monkeypatch.setattr("builtins.open", racing_open)
  with exclusive_workdir(workdir):
    with real_open(path) as other:  # the file at the path now is the one held
      with pytest.raises(BlockingIOError):
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
  assert len(opened) == 1

"""A job or converter killed with SIGKILL leaves no process, and no folder for long.

Data workers ignore SIGTERM (the main process saves first), so they must
end by themselves when the main process is gone; so must Python's resource
tracker, which ends once no process holds its pipe. A converter killed
mid-write leaves its hidden temporary dataset folder; the next write to the
same output removes it, and only one whose writer is provably dead.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil

from sparsepipe.launch.job.training_data import ensure_dataset

import launch_testing  # pylint: disable=g-bad-import-order
import subprocess_harness as harness  # pylint: disable=g-bad-import-order

_STARTUP_TIMEOUT_S = 480  # generous: the tests share two busy cores
_GONE_TIMEOUT_S = 10


def _wait_for_line(proc: subprocess.Popen, prefix: str, timeout_s: float) -> list[str]:
  """stdout lines up to the first that starts with `prefix` (AssertionError after timeout_s)."""
  lines: list[str] = []
  found = threading.Event()

  def read() -> None:
    for line in proc.stdout:
      lines.append(line.rstrip("\n"))
      if line.startswith(prefix):
        found.set()

  threading.Thread(target=read, daemon=True).start()
  assert found.wait(timeout_s), f"no line starting with {prefix!r} in {timeout_s}s: {lines}"
  return lines


def _command_line(process: psutil.Process) -> str:
  try:
    return " ".join(process.cmdline())
  except psutil.NoSuchProcess:  # e.g. a short-lived helper process that ended meanwhile
    return ""


def _gone(processes: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
  """The processes still running (zombies count as gone) after up to timeout_s."""
  deadline = time.monotonic() + timeout_s
  while True:
    alive = []
    for p in processes:
      try:
        if p.status() != psutil.STATUS_ZOMBIE:
          alive.append(p)
      except psutil.NoSuchProcess:
        pass
    if not alive or time.monotonic() > deadline:
      return alive
    time.sleep(0.1)


def test_sigkilled_launch_leaves_no_data_worker_or_resource_tracker(tmp_path):
  data_dir = ensure_dataset(launch_testing.tiny_config(), str(tmp_path), show_progress=False)
  command = launch_testing.launch_command(
    tmp_path / "job", data__dir=data_dir, num_steps=100000, data__num_workers=2
  )
  proc = subprocess.Popen(
    command,
    stdout=subprocess.PIPE,
    stderr=subprocess.DEVNULL,
    env=harness.cpu_env(8),
    text=True,
    start_new_session=True,
  )
  children: list[psutil.Process] = []
  try:
    _wait_for_line(proc, "batch 2/", _STARTUP_TIMEOUT_S)
    children = psutil.Process(proc.pid).children(recursive=True)
    names = [_command_line(c) for c in children]
    assert sum("multiprocessing.spawn" in n for n in names) >= 2, names
    assert any("resource_tracker" in n for n in names), names
    os.kill(proc.pid, signal.SIGKILL)  # the launcher only, not its process group
    proc.wait(timeout=_GONE_TIMEOUT_S)
    alive = _gone(children, _GONE_TIMEOUT_S)
    assert alive == [], [_command_line(p) for p in alive]
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
    for p in children:
      try:
        p.kill()
      except psutil.NoSuchProcess:
        pass


def _work_directories(output: str) -> list[str]:
  parent, base = os.path.split(output)
  return sorted(n for n in os.listdir(parent) if n.startswith(f".{base}.tmp-"))


def test_a_sigkilled_converters_temporary_folder_is_removed_by_the_next(tmp_path):
  output = str(tmp_path / "data")
  command = [sys.executable, "-m", "sparsepipe.data.synthetic", f"--output={output}"]
  command += ["--num_sparse=2", "--max_ids=2", "--examples_per_record=1"]
  proc = subprocess.Popen(
    [*command, "--num_examples=100000000"],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
    env=harness.cpu_env(1),
  )
  try:  # killed once its first shard is being written
    deadline = time.monotonic() + _STARTUP_TIMEOUT_S
    while not any(
      n.endswith(".arrayrecord.tmp")
      for w in _work_directories(output)
      for n in os.listdir(tmp_path / w)
    ):
      assert proc.poll() is None and time.monotonic() < deadline, "no shard started"
      time.sleep(0.2)
  finally:
    proc.kill()
    proc.wait()
  killed = _work_directories(output)
  assert killed == [f".data.tmp-{socket.gethostname()}-{proc.pid}"]
  # A live writer's folder of this host and a folder of another host stay.
  with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) as live:
    try:
      kept = [f".data.tmp-{socket.gethostname()}-{live.pid}", f".data.tmp-elsewhere-{proc.pid}"]
      for name in kept:
        os.makedirs(tmp_path / name / "part-00000.arrayrecord")
      done = subprocess.run(
        [*command, "--num_examples=64"],
        capture_output=True,
        text=True,
        env=harness.cpu_env(1),
        timeout=_STARTUP_TIMEOUT_S,
      )
    finally:
      live.kill()
  assert done.returncode == 0, done.stderr
  assert _work_directories(output) == sorted(kept)
  assert sorted(os.listdir(output)) == ["manifest.json", "part-00000.arrayrecord"]

"""A launch stopped outside training, or aborted, says so in one line, with its status.

SIGTERM while a launch started used to end it with status 143 and no word,
and a second Ctrl-C while training with a traceback of 189 lines; a
checkpoint directory that cannot be written, after training to the first
save, with a 5-minute wait and 78 lines.
"""

import gc
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from sparsepipe import checkpointing
from sparsepipe.launch import stopping
from sparsepipe.launch.job.training_data import ensure_dataset
from sparsepipe.launch.workdir.lock import LOCK_FILENAME

import launch_testing  # pylint: disable=g-bad-import-order
import subprocess_harness as harness  # pylint: disable=g-bad-import-order

_TIMEOUT_S = 300
_STARTING = (
  "sparsepipe: stopped by SIGTERM while starting, before training: nothing to save; run the"
  " same command again to go on"
)


class _Launch:
  """`python -m sparsepipe.launch` in its own session, its stdout and stderr lines kept."""

  def __init__(self, workdir, *flags: str, site_dir=None):
    """`site_dir`: a folder whose sitecustomize.py the launch runs first."""
    env = harness.cpu_env(8)
    env["PYTHONFAULTHANDLER"] = "1"  # a launch that hangs shows its threads (finish)
    if site_dir is not None:
      env["PYTHONPATH"] = os.pathsep.join((str(site_dir), env["PYTHONPATH"]))
    self.proc = subprocess.Popen(
      [sys.executable, "-m", "sparsepipe.launch", f"--workdir={workdir}"]
      + [f"--config={launch_testing.DEMO_CONFIG}", *flags],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      env=env,
      text=True,
      start_new_session=True,
    )
    self.out: list[str] = []
    self.err: list[str] = []
    self._readers = [
      threading.Thread(target=self._read, args=(self.proc.stdout, self.out)),
      threading.Thread(target=self._read, args=(self.proc.stderr, self.err)),
    ]
    for reader in self._readers:
      reader.start()

  @staticmethod
  def _read(stream, lines):
    for line in stream:
      lines.append(line.rstrip("\n"))

  def wait_for(self, lines: list[str], pattern: str) -> None:
    deadline = time.monotonic() + _TIMEOUT_S
    while not any(re.match(pattern, line) for line in lines):
      assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.out} {self.err}"
      assert time.monotonic() < deadline, f"no line {pattern!r}: {self.out} {self.err}"
      time.sleep(0.05)

  def signal(self, signum: int) -> None:
    os.killpg(self.proc.pid, signum)  # as a terminal or a scheduler sends it

  def finish(self) -> int:
    try:
      self.proc.wait(timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
      os.kill(self.proc.pid, signal.SIGABRT)  # faulthandler: every thread's stack on stderr
      self.proc.wait(timeout=60)
      if harness.group_alive(self.proc.pid):  # its data workers hold the pipes open
        os.killpg(self.proc.pid, signal.SIGKILL)
      for reader in self._readers:
        reader.join()
      raise AssertionError(
        f"no exit in {_TIMEOUT_S} s; stdout: {self.out[-5:]}\nstderr:\n" + "\n".join(self.err)
      ) from None
    finally:
      if self.proc.poll() is None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
      for reader in self._readers:
        reader.join()
    return self.proc.returncode


def test_the_launchers_stop_status_is_the_preemption_status_and_its_start_is_light():
  assert stopping.STOPPED_EXIT_CODE == checkpointing.PREEMPTED_EXIT_CODE
  probe = (
    "import sys, sparsepipe.launch; print(sorted({'jax', 'grain', 'orbax'} & sys.modules.keys()))"
  )
  out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
  assert out.stdout == "[]\n"


def test_sigterm_while_starting_is_one_line_and_the_rerun_trains(tmp_path):
  workdir = tmp_path / "job"
  flags = launch_testing.flag_overrides(num_steps=2, checkpoint__every_steps=2)
  launch = _Launch(workdir, *flags)
  deadline = time.monotonic() + _TIMEOUT_S
  while not (workdir / LOCK_FILENAME).exists():  # in train_and_evaluate: making the data
    assert launch.proc.poll() is None and time.monotonic() < deadline, launch.err
    time.sleep(0.02)
  launch.signal(signal.SIGTERM)
  assert launch.finish() == stopping.STOPPED_EXIT_CODE, launch.err
  # The stop is one line; the data's progress line comes before it when the
  # 1,024 examples were made before the signal arrived.
  *before, last = launch.err
  assert last == _STARTING, launch.err
  assert all(line.startswith("synthetic train: ") for line in before), launch.err
  assert not any(line.startswith("batch ") for line in launch.out)
  again = _Launch(workdir, *flags)
  assert again.finish() == 0, again.err
  assert launch_testing.batch_losses(str(workdir)).keys() == {1, 2}


# Orbax's CheckpointManager starts cleaning up interrupted saves' temporary
# directories in a thread as it opens. Here a SIGTERM lands right after that
# thread starts, and the thread lists the directory only once the launch has
# ended, as on a loaded machine: the list then fails at interpreter shutdown
# ("cannot schedule new futures"), and Orbax logged that, with its traceback,
# after the stop line (1 launch in about 30 in CI's test above).
_STOP_AS_THE_CHECKPOINTS_OPEN = """
import asyncio, os, signal
from orbax.checkpoint._src.futures import future
from orbax.checkpoint._src.path import temporary_paths

cleanup = temporary_paths.cleanup_temporary_paths

async def slow_cleanup(*args, **kwargs):
  await asyncio.sleep(1.0)
  await cleanup(*args, **kwargs)

class StoppedOnceStarted(future.CommitFuture):
  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, in the main thread

temporary_paths.cleanup_temporary_paths = slow_cleanup
future.CommitFuture = StoppedOnceStarted
"""


def test_a_stop_as_the_checkpoints_open_is_the_last_line_and_leaves_no_workdir(tmp_path):
  """Also: the workdir the launch made, with the data it generated there, is
  removed (it was kept from the end of the data on, though no job was in it yet,
  and a launch of other data settings then tripped over that data)."""
  (tmp_path / "site").mkdir()
  (tmp_path / "site" / "sitecustomize.py").write_text(_STOP_AS_THE_CHECKPOINTS_OPEN)
  launch = _Launch(
    tmp_path / "job", *launch_testing.flag_overrides(num_steps=2), site_dir=tmp_path / "site"
  )
  assert launch.finish() == stopping.STOPPED_EXIT_CODE, launch.err
  *before, last = launch.err
  assert last == _STARTING, launch.err
  assert all(line.startswith("synthetic train: ") for line in before), launch.err
  assert sorted(os.listdir(tmp_path)) == ["site"]


# SIGTERM once the job has made or restored its state, before its first step.
_STOP_ONCE_THE_STATE_IS_MADE = """
import os, signal
from sparsepipe.launch.job import run

start = run._Job._start

def start_then_stop(self, *args):
  job = start(self, *args)
  os.kill(os.getpid(), signal.SIGTERM)  # the job's watcher takes it
  return job

run._Job._start = start_then_stop
"""


def test_a_stop_while_the_state_is_made_trains_no_batch_first(tmp_path):
  """It trained batch 1 (compiling the step first) and saved it before it exited."""
  (tmp_path / "site").mkdir()
  (tmp_path / "site" / "sitecustomize.py").write_text(_STOP_ONCE_THE_STATE_IS_MADE)
  workdir = tmp_path / "job"
  flags = launch_testing.flag_overrides(num_steps=4, checkpoint__every_steps=2)
  assert _Launch(workdir, *flags).finish() == 0  # checkpoints 2 and 4
  flags = launch_testing.flag_overrides(num_steps=6, checkpoint__every_steps=2)
  for kept in ("nothing trained yet", "checkpoint 4 kept"):
    if kept.startswith("nothing"):
      launch = _Launch(tmp_path / "fresh", *flags, site_dir=tmp_path / "site")
    else:
      launch = _Launch(workdir, *flags, site_dir=tmp_path / "site")
    assert launch.finish() == stopping.STOPPED_EXIT_CODE, launch.err
    assert launch.out[-1] == (
      f"sparsepipe: preempted before training; {kept}, exiting (run the same command again to"
      " go on)"
    ), launch.out
    assert not any(line.startswith("batch ") for line in launch.out), launch.out
  assert not os.path.exists(tmp_path / "fresh" / "checkpoints" / "1")
  assert sorted(os.listdir(workdir / "checkpoints")) == ["2", "4"]
  again = _Launch(workdir, *flags)
  assert again.finish() == 0, again.err
  assert launch_testing.batch_losses(str(workdir)).keys() == set(range(1, 7))
  again = _Launch(tmp_path / "fresh", *flags)
  assert again.finish() == 0, again.err
  assert launch_testing.batch_losses(str(tmp_path / "fresh")).keys() == set(range(1, 7))


# SIGTERM at the very end of a launch that finished (an atexit callback runs
# after main() returned). The launcher's handler printed "stopped by SIGTERM
# while closing ... run the same command again" and the status stayed 0; later
# in the teardown, SIGTERM's default action ended the finished job with 143.
_STOP_AT_EXIT = """
import atexit, os, signal, time

def stop_at_exit():
  os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(0.5)  # a handler would run here

atexit.register(stop_at_exit)
"""


def test_a_stop_after_the_launch_ended_changes_nothing(tmp_path):
  (tmp_path / "site").mkdir()
  (tmp_path / "site" / "sitecustomize.py").write_text(_STOP_AT_EXIT)
  data_dir = ensure_dataset(launch_testing.tiny_config(), str(tmp_path), show_progress=False)
  flags = launch_testing.flag_overrides(data__dir=data_dir, num_steps=2)
  launch = _Launch(tmp_path / "job", *flags, site_dir=tmp_path / "site")
  assert launch.finish() == 0, launch.err
  assert launch.err == [], launch.err
  assert launch_testing.batch_losses(str(tmp_path / "job")).keys() == {1, 2}


def test_a_stop_whose_exit_python_swallowed_ends_the_launch_before_training(capfd):
  """A signal handled inside a gc callback (jax has one) raises the handler's
  SystemExit there; Python only reports it and goes on. Such a stop once let a
  launch train to its end with status 0."""
  handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  hook = sys.unraisablehook

  def collecting(phase, info):
    del info
    if phase == "start":
      gc.callbacks.remove(collecting)
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(0.01)  # the handler runs here, inside the callback

  try:
    stopping.stop_outside_training()
    gc.callbacks.append(collecting)
    gc.collect()
    assert stopping.stop_requested()
    with pytest.raises(SystemExit) as stopped:
      stopping.training_begins()
    assert stopped.value.code == stopping.STOPPED_EXIT_CODE
  finally:
    for signum, handler in handlers.items():
      signal.signal(signum, handler)
    sys.unraisablehook = hook
    stopping._HANDLER.stopping = False  # pylint: disable=protected-access
  assert capfd.readouterr().err == _STARTING + "\n"  # no "Exception ignored" report


def test_a_stop_while_importing_says_its_line_at_once_and_exits_when_the_imports_end(capfd):
  """Raised inside TensorStore's initialisation, the stop's SystemExit once aborted the
  launch (SIGABRT and a dump after the stop line)."""
  handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  hook = sys.unraisablehook
  imported = []
  try:
    stopping.stop_outside_training()
    with pytest.raises(SystemExit) as stopped:
      with stopping.imports_uninterrupted():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)  # the handler runs here: the line, no exit
        assert capfd.readouterr().err == _STARTING.replace("SIGTERM", "Ctrl-C") + "\n"
        imported.append(True)  # the rest of the block runs
    assert stopped.value.code == stopping.STOPPED_EXIT_CODE and imported == [True]
    stopping._HANDLER.stopping = False  # pylint: disable=protected-access
    with pytest.raises(SystemExit):  # outside the block, at once as before
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(0.01)
    assert capfd.readouterr().err == _STARTING + "\n"
  finally:
    for signum, handler in handlers.items():
      signal.signal(signum, handler)
    sys.unraisablehook = hook
    stopping._HANDLER.stopping = False  # pylint: disable=protected-access


def test_a_second_ctrl_c_is_one_line_and_status_130(tmp_path):
  data_dir = ensure_dataset(launch_testing.tiny_config(), str(tmp_path), show_progress=False)
  launch = _Launch(
    tmp_path / "job", *launch_testing.flag_overrides(data__dir=data_dir, num_steps=100000)
  )
  launch.wait_for(launch.out, r"batch 2/")
  launch.signal(signal.SIGINT)
  launch.wait_for(launch.err, r"sparsepipe: Ctrl-C: saving at the next")
  launch.signal(signal.SIGINT)
  assert launch.finish() == stopping.ABORTED_EXIT_CODE, launch.err
  assert launch.err[-1] == stopping.aborted_line()
  assert not any("Traceback" in line or "KeyboardInterrupt" in line for line in launch.err)


def test_a_second_ctrl_c_after_the_save_while_the_workers_close_is_the_closing_stop(tmp_path):
  """Once the stop's checkpoint is saved, a second Ctrl-C (while the data workers
  close) ended the launch with 130 and "without saving", and two tracebacks of
  Grain's closing threads."""
  data_dir = ensure_dataset(launch_testing.tiny_config(), str(tmp_path), show_progress=False)
  flags = launch_testing.flag_overrides(data__dir=data_dir, num_steps=100000, data__num_workers=2)
  launch = _Launch(tmp_path / "job", *flags)
  launch.wait_for(launch.out, r"batch 2/")
  launch.signal(signal.SIGINT)
  launch.wait_for(launch.out, r"sparsepipe: preempted; checkpoint after batch \d+ saved, exiting")
  launch.signal(signal.SIGINT)
  assert launch.finish() == stopping.STOPPED_EXIT_CODE, launch.err
  saving = launch.err[0]
  assert saving.startswith("sparsepipe: Ctrl-C: saving at the next pipeline step boundary")
  # No absl "Received signal 2: saving step N and exiting" beside it (the same news).
  # The closing stop's line, unless the signal came after the launch had its status.
  closing = (
    "sparsepipe: stopped by Ctrl-C while closing, after the last save: nothing is lost; run"
    " the same command again to go on"
  )
  assert launch.err[1:] in ([closing], []), launch.err


# What the second Ctrl-C interrupted, in loaded runs of the test above: an object
# half made (an asyncio event loop of a save's threads) that fails in its teardown
# at exit, and a save's coroutine never awaited.
_HALF_MADE_AT_EXIT = """
import sys
from sparsepipe.launch import stopping

class HalfMade:
  def __del__(self):
    raise AttributeError("'_UnixSelectorEventLoop' object has no attribute '_ssock'")

async def async_save():
  pass

kept_until_exit = HalfMade()
never_awaited = async_save()
stopping.report_aborted()
"""


def test_the_aborted_line_stays_last_when_something_interrupted_fails_at_exit():
  ran = subprocess.run(
    [sys.executable, "-c", _HALF_MADE_AT_EXIT], capture_output=True, text=True, timeout=60
  )
  assert (ran.returncode, ran.stderr.splitlines()) == (0, [stopping.aborted_line()])


def test_an_unwritable_checkpoint_directory_is_named_before_training(tmp_path):
  workdir = tmp_path / "job"
  workdir.mkdir()
  (workdir / "checkpoints").symlink_to("/sys")  # even root cannot write there
  data_dir = ensure_dataset(launch_testing.tiny_config(), str(tmp_path), show_progress=False)
  launch = _Launch(workdir, *launch_testing.flag_overrides(data__dir=data_dir))
  assert launch.finish() == 1
  assert launch.err == [
    f"error: the checkpoint directory '{workdir / 'checkpoints'}' cannot be written"
    " (Operation not permitted): no checkpoint could be saved there; make it writable, or"
    " use another directory"
  ]
  assert not any(line.startswith("batch ") for line in launch.out)


def test_an_error_raised_while_a_second_ctrl_c_unwinds_counts_as_the_interrupt():
  # A second Ctrl-C inside a save abandons it; the error that reaches the launcher
  # is then the save's RuntimeError, raised from the KeyboardInterrupt (it exited 1
  # with a traceback).
  try:
    try:
      raise KeyboardInterrupt
    except KeyboardInterrupt as interrupt:
      raise RuntimeError("the save was abandoned before its arrays were copied") from interrupt
  except RuntimeError as error:
    abandoned = error
  try:
    try:
      raise KeyboardInterrupt
    except KeyboardInterrupt:
      raise ValueError("raised in a finally block while unwinding")  # __context__ only
  except ValueError as error:
    in_cleanup = error
  assert stopping.interrupted(abandoned) and stopping.interrupted(in_cleanup)
  assert not stopping.interrupted(RuntimeError("a plain error"))
  assert not stopping.interrupted(SystemExit(42))


def test_the_abandoned_save_logs_nothing_after_the_abort():
  quiet = stopping.QuietAfterTheStopLine()
  logger = logging.getLogger("test_abandoned_saves")
  logger.addFilter(quiet)
  seen = []
  handler = logging.Handler()
  handler.emit = lambda record: seen.append(record.getMessage())
  logger.addHandler(handler)
  logger.error("a save before the abort")
  try:
    try:
      raise KeyboardInterrupt
    except KeyboardInterrupt as interrupt:
      raise RuntimeError("the save was abandoned") from interrupt
  except RuntimeError:
    logger.exception("_SignalingThread.run() raised an exception")
  logger.error("cannot schedule new futures after shutdown")
  assert seen == ["a save before the abort"]

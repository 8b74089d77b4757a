"""Run training commands as subprocesses, interrupt them, restart them.

Reusable by any test of a job that checkpoints and resumes (the toy job of
checkpoint_toy.py, the launcher's full job). A job prints progress lines
(e.g. `step 7`, `save 10`); an `Interruption` names the line to wait for
(and which occurrence of it), the signal, a delay and, for multi-process
jobs, which process gets it. `run_interrupted` runs the job once per
interruption, checks every exit status (SIGTERM: the job saves and exits
PREEMPTED_EXIT_CODE; SIGKILL: -9), then once more to completion.

Every process is started in its own session: a signal goes to the whole
process group of its target (data workers included), as a scheduler sends
it to one host.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Mapping, Sequence

from sparsepipe.checkpointing import PREEMPTED_EXIT_CODE
from sparsepipe.core import compile_cache

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS)

Command = Sequence[str]

# The jobs' default cache (config.compilation_cache_dir "auto"), in the test
# session's own XDG_CACHE_HOME (conftest.py): processes that compile the same
# programs (the tiny demo job on a device count, a toy job) compile them once
# per session, whichever module runs them first.
SESSION_JAX_CACHE = os.path.join(compile_cache.default_root(), "jax")


def cpu_env(
  num_devices: int = 8,
  *,
  compilation_cache_dir: str | os.PathLike[str] | None = None,
  **extra: str,
) -> dict[str, str]:
  """Environment for a JAX subprocess on `num_devices` CPU devices.

  `compilation_cache_dir` turns on JAX's persistent compilation cache for
  every program, so restarted jobs load their executables instead of
  compiling them again (SESSION_JAX_CACHE: shared by every test's jobs).
  """
  env = dict(os.environ)
  flags = [
    f
    for f in env.get("XLA_FLAGS", "").split()
    if not f.startswith("--xla_force_host_platform_device_count")
  ]
  flags.append(f"--xla_force_host_platform_device_count={num_devices}")
  env["XLA_FLAGS"] = " ".join(flags)
  env["JAX_PLATFORMS"] = "cpu"
  # The package, and the tests' helper modules for scripts in any test folder.
  env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, TESTS, env.get("PYTHONPATH", "")) if p)
  env["PYTHONUNBUFFERED"] = "1"
  if compilation_cache_dir is not None:
    env["JAX_COMPILATION_CACHE_DIR"] = os.fspath(compilation_cache_dir)
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
  env.update(extra)
  return env


def python_command(script: str, *args: str) -> list[str]:
  """[python, script, args...] with the interpreter running the tests."""
  return [sys.executable, script, *args]


def run_module(
  module: str, *args: str, timeout_s: float = 300.0, **kwargs
) -> subprocess.CompletedProcess:
  """`python -m module args...` from the repository root, its output captured as text
  (`kwargs`: subprocess.run's, e.g. env)."""
  import paths  # pylint: disable=g-import-not-at-top

  return subprocess.run(
    [sys.executable, "-m", module, *args],
    capture_output=True,
    text=True,
    check=False,
    timeout=timeout_s,
    cwd=paths.REPO_ROOT,
    **kwargs,
  )


def free_port() -> int:
  """A TCP port free on localhost now (for a jax.distributed coordinator)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@dataclasses.dataclass(frozen=True)
class Interruption:
  """Send `signal` to process `target` after its output matches `after`.

  Attributes:
    signal: e.g. signal.SIGTERM or signal.SIGKILL.
    after: regular expression matched against whole stdout lines.
    occurrence: signal at the n-th matching line (1: the first).
    delay_s: seconds to wait after that line before signalling.
    target: index of the process (in a multi-process job) to signal.
  """

  signal: int
  after: str
  occurrence: int = 1
  delay_s: float = 0.0
  target: int = 0

  @property
  def expected_returncode(self) -> int:
    if self.signal in (signal.SIGTERM, signal.SIGINT):  # Ctrl-C is a stop request too
      return PREEMPTED_EXIT_CODE
    return -int(self.signal)


@dataclasses.dataclass
class Result:
  """One finished process: exit status, stdout lines, stderr, signal sent."""

  returncode: int
  lines: list[str]
  stderr: str
  signalled: bool
  pgid: int

  def describe(self) -> str:
    tail = "\n".join(self.stderr.strip().splitlines()[-25:])
    return (
      f"exit status {self.returncode}, signalled={self.signalled}\n"
      f"stdout: {self.lines}\nstderr tail:\n{tail}"
    )


def group_alive(pgid: int) -> bool:
  """Whether any process of the process group still exists."""
  try:
    os.killpg(pgid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def wait_group_gone(pgid: int, timeout_s: float = 10.0) -> bool:
  """Waits until the process group is empty; False if it is not by then."""
  deadline = time.monotonic() + timeout_s
  while group_alive(pgid):
    if time.monotonic() > deadline:
      return False
    time.sleep(0.05)
  return True


def _signal_group(pgid: int, signum: int) -> None:
  try:
    os.killpg(pgid, signum)
  except ProcessLookupError:
    pass


class _Process:
  """A started command whose stdout is read (and watched) by a thread."""

  def __init__(self, command: Command, env: Mapping[str, str]):
    self.stderr = tempfile.TemporaryFile("w+")
    self.proc = subprocess.Popen(
      list(command),
      stdout=subprocess.PIPE,
      stderr=self.stderr,
      env=dict(env),
      text=True,
      start_new_session=True,
    )
    self.lines: list[str] = []
    self.signalled = False
    self.thread: threading.Thread | None = None

  def watch(self, interruption: Interruption | None) -> None:
    self.thread = threading.Thread(target=self._read, args=(interruption,))
    self.thread.start()

  def _read(self, interruption: Interruption | None) -> None:
    pattern = re.compile(interruption.after) if interruption else None
    seen = 0
    for raw in self.proc.stdout:
      line = raw.rstrip("\n")
      self.lines.append(line)
      if pattern is None or self.signalled or not pattern.fullmatch(line):
        continue
      seen += 1
      if seen == interruption.occurrence:
        if interruption.delay_s:
          time.sleep(interruption.delay_s)
        _signal_group(self.proc.pid, interruption.signal)
        self.signalled = True

  def result(self) -> Result:
    self.stderr.seek(0)
    text = self.stderr.read()
    self.stderr.close()
    return Result(self.proc.returncode, self.lines, text, self.signalled, self.proc.pid)


def run_many(
  commands: Sequence[Command],
  *,
  env: Mapping[str, str] | Sequence[Mapping[str, str]],
  interruption: Interruption | None = None,
  timeout_s: float = 120.0,
) -> list[Result]:
  """Runs the commands concurrently (e.g. one per JAX process).

  `env` is one environment for all or one per command. On timeout every
  process group is SIGKILLed and a TimeoutError raised with the output.
  """
  envs = [env] * len(commands) if isinstance(env, Mapping) else list(env)
  procs = [_Process(c, e) for c, e in zip(commands, envs)]
  for i, p in enumerate(procs):
    p.watch(interruption if interruption and interruption.target == i else None)
  deadline = time.monotonic() + timeout_s
  timed_out = False
  for p in procs:
    try:
      p.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      timed_out = True
      break
  if timed_out:
    for p in procs:
      _signal_group(p.proc.pid, signal.SIGKILL)
  for p in procs:
    p.proc.wait()
    p.thread.join()
  results = [p.result() for p in procs]
  if timed_out:
    raise TimeoutError(
      f"{commands} ran over {timeout_s}s:\n" + "\n".join(r.describe() for r in results)
    )
  return results


def run(
  command: Command,
  *,
  env: Mapping[str, str],
  interruption: Interruption | None = None,
  timeout_s: float = 120.0,
) -> Result:
  """Runs one command (see run_many)."""
  return run_many([command], env=env, interruption=interruption, timeout_s=timeout_s)[0]


def run_interrupted(
  commands: Command | Sequence[Command],
  interruptions: Sequence[Interruption],
  *,
  env: Mapping[str, str] | Sequence[Mapping[str, str]],
  timeout_s: float = 120.0,
) -> list[list[Result]]:
  """Runs the job once per interruption, then until it exits 0.

  `commands` is one command or one per process. In an interrupted run
  every process must exit with the interruption's expected status (all of
  them save and exit on a SIGTERM to one); a run that exits 0 finished
  before the signal could act and ends the sequence. The last run must
  exit 0. Returns the Results of every run.
  """
  if isinstance(commands[0], str):
    commands = [commands]
  runs = []
  for interruption in interruptions:
    results = run_many(commands, env=env, interruption=interruption, timeout_s=timeout_s)
    runs.append(results)
    if all(r.returncode == 0 for r in results):
      return runs
    target = results[interruption.target]
    expected = interruption.expected_returncode
    others_ok = all(
      r.returncode == PREEMPTED_EXIT_CODE for i, r in enumerate(results) if i != interruption.target
    )
    if not target.signalled or target.returncode != expected or not others_ok:
      raise AssertionError(
        f"run interrupted by {interruption} should exit {expected}:\n"
        + "\n".join(r.describe() for r in results)
      )
  final = run_many(commands, env=env, timeout_s=timeout_s)
  runs.append(final)
  if any(r.returncode != 0 for r in final):
    raise AssertionError("final run failed:\n" + "\n".join(r.describe() for r in final))
  return runs

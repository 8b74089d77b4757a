"""The launcher's stop signals outside training: one line and a documented status.

While the job trains, checkpointing.PreemptionWatcher takes SIGTERM and
Ctrl-C: it saves at the next batch boundary and the launcher exits 42.
Outside it (importing, making the dataset and the model, until the
checkpoints are open; closing after the last save) Python's defaults ended a
launch with status 143 and no word (SIGTERM) or a KeyboardInterrupt
traceback (Ctrl-C). `python -m sparsepipe.launch` installs
`stop_outside_training` before anything else (this module imports only
the standard library, and sparsepipe.launch loads its parts lazily): a
stop signal there prints one line and exits STOPPED_EXIT_CODE, at once
while starting; while closing, once the launch has closed (a moment: the
data workers stop, the files close), and a second signal ends it at once.
Nothing trained goes unsaved: before training there is nothing to save, and
closing begins after the last save; running the same command again goes on.
Once the launch has its exit status, both signals are ignored (launch_ended).
Python may swallow the handler's SystemExit: a signal handled while a gc
or weakref callback runs (jax's, among others) raises there, and Python
only reports it as unraisable and goes on. The stop is kept: the launch
ends at `training_begins`, before any batch is trained; the unraisable
report is dropped.

A second Ctrl-C while training aborts without saving (the watcher's
KeyboardInterrupt); the launcher prints one line and exits
ABORTED_EXIT_CODE, and a rerun trains again from the newest checkpoint.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import warnings
from typing import Any, Iterator

# Equals checkpointing.PREEMPTED_EXIT_CODE (a test checks; importing it here
# would import JAX before the handlers are installed).
STOPPED_EXIT_CODE = 42
# A second Ctrl-C: stopped without saving (the shell's status for Ctrl-C).
ABORTED_EXIT_CODE = 130

_SIGNAL_NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}
_NOTHING_TO_SAVE = {
  "starting": "while starting, before training: nothing to save",
  "closing": "while closing, after the last save: nothing is lost",
}


class _StopOutsideTraining:
  """The SIGTERM and SIGINT handler of the launcher's phases outside training.

  `stopping` stays set once a signal came, so that a SystemExit that Python
  swallowed still stops the launch (see the module docstring).
  """

  def __init__(self) -> None:
    self.phase = "starting"
    self.stopping = False
    self.importing = False  # the exit waits for the block's end (imports_uninterrupted)
    self.line = ""  # the stop line printed

  def __call__(self, signum: int, frame: Any) -> None:
    del frame
    if self.stopping:  # a second signal while the first one's cleanup runs: at once
      os._exit(STOPPED_EXIT_CODE)  # pylint: disable=protected-access
    self.stopping = True
    # os.write, not print: the main thread may be inside a print to stderr.
    self.line = (
      f"sparsepipe: stopped by {_SIGNAL_NAMES.get(signum, signum)}"
      f" {_NOTHING_TO_SAVE[self.phase]}; run the same command again to go on"
    )
    os.write(2, (self.line + "\n").encode())
    if self.phase == "starting" and not self.importing:
      raise SystemExit(STOPPED_EXIT_CODE)
    # Closing (saved and written): it finishes, a moment, and the launch exits 42.
    # Raised here, the exit cut the data workers' close short, and their threads and
    # exit handlers failed with tracebacks after this line.


_HANDLER = _StopOutsideTraining()


def _drop_swallowed_stop(unraisable: Any, report: Any = sys.unraisablehook) -> None:
  """sys.unraisablehook: the handler's SystemExit raised where Python could
  only report it is not reported (its line was printed); anything else is."""
  if not (_HANDLER.stopping and isinstance(unraisable.exc_value, SystemExit)):
    report(unraisable)


def stop_outside_training() -> None:
  """Installs the launcher's handler of SIGTERM and SIGINT (main thread only)."""
  _HANDLER.phase, _HANDLER.stopping = "starting", False
  signal.signal(signal.SIGTERM, _HANDLER)
  signal.signal(signal.SIGINT, _HANDLER)
  if getattr(sys.unraisablehook, "func", None) is not _drop_swallowed_stop:
    sys.unraisablehook = functools.partial(_drop_swallowed_stop, report=sys.unraisablehook)


@contextlib.contextmanager
def imports_uninterrupted() -> Iterator[None]:
  """While starting, a stop signal during the block prints its line at once and ends
  the launch when the block ends. The block imports native extensions (jaxlib,
  TensorStore): a SystemExit raised inside one's initialisation once aborted the
  process (SIGABRT, "SetTimeZone() has already been called") after the stop line."""
  _HANDLER.importing = True
  try:
    yield
  finally:
    _HANDLER.importing = False
  if _HANDLER.stopping and _HANDLER.phase == "starting":
    raise SystemExit(STOPPED_EXIT_CODE)


def stop_requested() -> bool:
  """Whether a stop signal came outside training (its SystemExit may have been swallowed)."""
  return _HANDLER.stopping


def stop_line() -> str:
  """The stop line printed for a signal outside training ("" if none came)."""
  return _HANDLER.line


def training_begins() -> None:
  """From here a stop signal is the PreemptionWatcher's; once it gives them back,
  the job has saved and is closing. A stop that came while starting, and
  whose SystemExit Python swallowed, ends the launch here, before training."""
  if _HANDLER.stopping:
    raise SystemExit(STOPPED_EXIT_CODE)
  _HANDLER.phase = "closing"


def interrupted(error: BaseException | None) -> bool:
  """Whether `error` is a KeyboardInterrupt or was raised while one unwound.

  A second Ctrl-C that lands while a checkpoint is being saved abandons the
  save; the save's background commit then fails, and the error that reaches
  the launcher may be that failure (a RuntimeError) with the interrupt as
  its cause or context.
  """
  seen: set[int] = set()
  while error is not None and id(error) not in seen:
    if isinstance(error, KeyboardInterrupt):
      return True
    seen.add(id(error))
    error = error.__cause__ or error.__context__
  return False


class QuietAfterTheStopLine(logging.Filter):
  """Drops the log records that would come after the launcher's stop line.

  Once the launcher has said how the job stopped, Orbax's background threads
  may still log, at ERROR and with a traceback, the failure of work the stop
  cut short:
  - a save abandoned by a second Ctrl-C (some 100 lines);
  - the clean-up of interrupted saves' temporary directories that a
    CheckpointManager starts as it opens: a stop while starting can end the
    process before that thread has listed the directory, and it then fails
    with "cannot schedule new futures after interpreter shutdown".
  Neither loses anything: the abandoned save was never complete, and the
  next launch cleans up again. So once the line is printed, they say nothing.
  """

  def __init__(self) -> None:
    super().__init__()
    self.aborted = False

  def filter(self, record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    if interrupted(error):
      self.aborted = True
    return not (self.aborted or _HANDLER.stopping)


def launch_ended() -> None:
  """Ignores SIGTERM and Ctrl-C from here on: the launch has its exit status,
  and only the interpreter's teardown is left.

  There, the launcher's handler would print a stop line that the status
  contradicts (0, for a job that finished), and late in the teardown Python
  gives the signals back their default action, which ended a finished job
  with SIGTERM's status (143) and no word. Ignored signals stay ignored
  through the teardown, which then ends as it would have.
  """
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  signal.signal(signal.SIGINT, signal.SIG_IGN)


def report_aborted() -> None:
  """Prints `aborted_line` as the launch's last line on stderr.

  The interrupt may have landed inside an object's construction (e.g. an
  asyncio event loop of a save's threads, half made) or left a save's
  coroutine never awaited; their teardown at exit would then print
  "Exception ignored in ..." and a traceback, or a RuntimeWarning, after the
  line. Neither is reported after an abort (sys.unraisablehook, warnings):
  the job stopped without saving, and a rerun goes on from the newest
  checkpoint.
  """
  sys.unraisablehook = lambda unraisable: None
  warnings.simplefilter("ignore")
  print(aborted_line(), file=sys.stderr, flush=True)


def aborted_line() -> str:
  """What the launcher prints when a second Ctrl-C aborted the training."""
  return (
    "sparsepipe: stopped by a second Ctrl-C without saving; run the same command again to"
    " train on from the newest checkpoint"
  )

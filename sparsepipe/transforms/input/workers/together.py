"""The data workers start together and stop together, not one after another.

Grain's `mp_prefetch` interleaves one worker process per shard of the
batches, and takes each worker in turn:
- start: when anything asks for the pipeline's state before its first
  element (the thread prefetch above it does), the interleave makes every
  worker's iterator without starting it, then starts each only when its
  turn comes, after the one before has handed over its first batch. A
  worker's start (a fresh interpreter importing the program) takes seconds:
  12 workers took about 40 s to all run (on an H200 host, the job's first
  50 batches waited that long for data);
- stop: closing tells one worker to stop and waits for it to exit before
  telling the next, about 1 s each (9 s after the last batch with 12).

`WorkersTogether` sits right after `mp_prefetch`. At its first element it
starts every worker at once (Grain's own `start_prefetch`), so they all
start while the job makes its state; at `close` it closes every worker's
iterator from a thread of its own, so they exit side by side. Batches and
their order are unchanged.
"""

from __future__ import annotations

import re
import signal
import sys
import threading
from typing import Any

import grain

from sparsepipe.core.signals import stop_signals_blocked
from sparsepipe.transforms.errors import DataWorkerExitedError


class WorkersTogether(grain.IterDataset):
  """The workers of the `mp_prefetch` dataset it wraps start and stop together."""

  def __iter__(self) -> grain.DatasetIterator:
    return _WorkersTogetherIterator(self._parent.__iter__())


class _WorkersTogetherIterator(grain.DatasetIterator):
  def __init__(self, parent: grain.DatasetIterator):
    super().__init__(parent)
    self._started = False
    self._closing = False

  def __next__(self) -> Any:
    if not self._started:
      self._started = True
      self._parent.get_state()  # makes every worker's iterator, none started yet
      start = getattr(self._parent, "start_prefetch", None)
      if start is not None:
        with stop_signals_blocked():  # until each worker ignores them (core.signals)
          start()  # each worker's process starts from a thread of its own
    try:
      return next(self._parent)
    except RuntimeError as e:
      raise _named_worker_exit(e) or e

  def get_state(self) -> Any:
    return self._parent.get_state()

  def set_state(self, state: Any) -> None:
    self._parent.set_state(state)

  def close(self) -> None:
    """Closes every worker's iterator at once, each from a thread of its own.

    Once only: a close interrupted by a stop signal (which then ends the
    process; the threads still finish) and the close of `__del__` would
    close the same workers side by side (Grain then failed in the threads).
    Nothing at interpreter exit: no new thread starts then (it hung), and
    Grain's own exit handlers end the workers.
    """
    if self._closing or sys.is_finalizing():
      return
    self._closing = True
    # Grain 0.2.18's interleave keeps the workers' iterators in
    # `_iterators_in_use`; without it, Grain closes them in turn.
    workers = [it for it in getattr(self._parent, "_iterators_in_use", ()) if it is not None]
    threads = [threading.Thread(target=it.close, name="close-data-worker") for it in workers]
    for thread in threads:
      thread.start()
    for thread in threads:
      thread.join()
    super().close()


# Grain 0.2.18's words (process_prefetch.py) for a worker process that ended.
_WORKER_EXIT = re.compile(r"Worker process was terminated unexpectedly with exit code (-?\d+)")
_SIGNAL_NUMBERS = {s.value for s in signal.Signals}


def _named_worker_exit(error: RuntimeError) -> DataWorkerExitedError | None:
  """Grain's RuntimeError for a worker process that ended, as a DataWorkerExitedError
  naming the signal that ended it (an error of the environment, not of the program)."""
  found = _WORKER_EXIT.match(str(error))
  if found is None:
    return None
  code = int(found.group(1))
  how = f"with exit code {code}"
  if code < 0:
    how = f"by {signal.Signals(-code).name}" if -code in _SIGNAL_NUMBERS else how
    if -code == signal.SIGKILL:
      how += " (e.g. the kernel's out-of-memory killer)"
  return DataWorkerExitedError(
    f"a data worker process ended {how} while the input needed it; its messages above may"
    " say why. The input cannot go on without it (a job resumes from its newest checkpoint)"
  )

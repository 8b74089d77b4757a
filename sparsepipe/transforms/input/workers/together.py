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

import threading
from typing import Any

import grain


class WorkersTogether(grain.IterDataset):
  """The workers of the `mp_prefetch` dataset it wraps start and stop together."""

  def __iter__(self) -> grain.DatasetIterator:
    return _WorkersTogetherIterator(self._parent.__iter__())


class _WorkersTogetherIterator(grain.DatasetIterator):
  def __init__(self, parent: grain.DatasetIterator):
    super().__init__(parent)
    self._started = False

  def __next__(self) -> Any:
    if not self._started:
      self._started = True
      self._parent.get_state()  # makes every worker's iterator, none started yet
      start = getattr(self._parent, "start_prefetch", None)
      if start is not None:
        start()  # each worker's process starts from a thread of its own
    return next(self._parent)

  def get_state(self) -> Any:
    return self._parent.get_state()

  def set_state(self, state: Any) -> None:
    self._parent.set_state(state)

  def close(self) -> None:
    # Grain 0.2.18's interleave keeps the workers' iterators in
    # `_iterators_in_use`; without it, Grain closes them in turn.
    workers = [it for it in getattr(self._parent, "_iterators_in_use", ()) if it is not None]
    threads = [threading.Thread(target=it.close, name="close-data-worker") for it in workers]
    for thread in threads:
      thread.start()
    for thread in threads:
      thread.join()
    super().close()

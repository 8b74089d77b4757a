"""The training input's iterator: batches by index, a JSON state of plain numbers.

A batch is a function of its global index (train_batches.py), so the
iterator's position is one number, the index of the next batch to hand
out. Its state is

    {"metadata": {...}, "next_batch": k, "stats": StatsTotals.to_state()}

The Grain pipeline behind it (read-ahead threads, worker processes, device
placement) is built from batch k when the first batch is asked for (or at
`start_prefetch`), and rebuilt after `set_state`; what it has read ahead is
never part of the state. The statistics are added up here, in the main
process, as batches are handed out. So the state does not depend on the
worker count, and a restored iterator continues exactly where the saved one
stopped, with any number of workers.

`read_ahead_paused()` holds this process's read-ahead threads before their
next batch (an asynchronous checkpoint save does, while the loop waits on
it: every thread Orbax starts there would otherwise wait for the GIL while
they run Python).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Callable, Iterator, Mapping

import grain
import numpy as np

from sparsepipe.transforms.input.limits_board import LimitsBoard
from sparsepipe.transforms.input.coo_transform import PreprocessedBatch
from sparsepipe.transforms.input.stats import StatsSizes
from sparsepipe.transforms.input.stats import StatsTotals

STATE_VERSION = 2
# Metadata keys that states saved by older versions lack: compared only where the
# saved state has them, so those checkpoints still resume.
ADDED_METADATA_KEYS = ("conversion",)


class IteratorStateMismatchError(ValueError):
  """A saved iterator state that does not belong to this pipeline."""


class _Gated(grain.MapDataset):
  """`parent`'s elements; each read waits while `flowing` is clear.

  The wait comes before the element is computed, so paused read-ahead
  threads sleep instead of running Python. Data worker processes get a copy
  without the event (Grain pickles the dataset for them): they do not
  share this process's GIL and never wait.
  """

  _MUTATES_ELEMENT_SPEC = False

  def __init__(self, parent: grain.MapDataset, flowing: threading.Event):
    super().__init__(parent)
    self._flowing: threading.Event | None = flowing

  def __len__(self) -> int:
    return len(self._parent)

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    if self._flowing is not None and not self._flowing.is_set():
      self._flowing.wait()
    return self._parent[index]

  def __getstate__(self) -> dict[str, Any]:
    return {**self.__dict__, "_flowing": None}

  def __str__(self) -> str:
    return "Gated"


class InputIterator(grain.DatasetIterator):
  """Hands out the batches of `batches` from index `next_batch` on.

  Args:
    batches: MapDataset, global batch index -> PreprocessedBatch (host numpy).
    build: what runs the batches: a MapDataset from the start index on ->
      an IterDataset (read-ahead threads, workers, placement).
    place: the placement applied to one element (for `batch_at`), or None.
    metadata: JSON describing the pipeline; a state saved by another
      pipeline (other data, batch size, host, seed) is refused on restore.
    stats_sizes: the lengths of the statistics per stack (stats.stats_sizes),
      so the state has the same shape before and after the first batch.
    fdo_client: optional, gets `record(stats)` for every batch handed out.
    output: what a batch is handed out as (default: the PreprocessedBatch).
    limits_board: the LimitsBoard that `batches` preprocess by (limits_board.py),
      so FDO can change the limits of later batches while the workers run
      (`publish_limits`); None: fixed limits.
  """

  def __init__(
    self,
    batches: grain.MapDataset,
    build: Callable[[grain.MapDataset], grain.IterDataset],
    *,
    place: Callable[[PreprocessedBatch], PreprocessedBatch] | None,
    metadata: Mapping[str, Any],
    stats_sizes: StatsSizes | None = None,
    fdo_client: Any = None,
    output: Callable[[PreprocessedBatch], Any] = lambda element: element,
    limits_board: LimitsBoard | None = None,
  ):
    self._chain: Iterator[Any] | None = None  # first: __del__ closes it
    self._board = limits_board
    super().__init__()
    self._batches = batches
    self._build = build
    self._place = place
    self.metadata = dict(metadata)
    self._fdo_client = fdo_client
    self._output = output
    self._next = 0
    self._sizes = stats_sizes
    self._totals = StatsTotals(stats_sizes)
    self._flowing = threading.Event()
    self._flowing.set()
    # Times the workers and read-ahead threads were started (tests, benchmarks).
    self.pipeline_starts = 0
    # An input still open when the program exits is closed before the interpreter
    # tears its modules down: Grain's iterators closed then (by their __del__)
    # failed with tracebacks, and the workers' close hung.
    weakref.finalize(self, _close_if_alive, weakref.ref(self))

  # -- iteration ---------------------------------------------------------------

  def _running(self) -> Iterator[Any]:
    if self._chain is None:
      if self._board is not None:
        self._board.open()
      self.pipeline_starts += 1
      self._chain = iter(self._build(_Gated(self._batches[self._next :], self._flowing)))
    return self._chain

  def __next__(self) -> Any:
    if not self._flowing.is_set():  # the batch may wait on the paused threads
      raise RuntimeError(f"next batch ({self._next}) asked for inside read_ahead_paused()")
    element = next(self._running())
    self._totals.add(element.stats, element.num_corrupt_records)
    if self._fdo_client is not None:
      self._fdo_client.record(element.stats)
    self._next += 1
    return self._output(element)

  def start_prefetch(self) -> None:
    """Starts reading ahead (workers, threads) from the current position.

    Making Grain's iterators starts nothing: its read-ahead threads and
    worker processes start at the first batch asked for, or at the
    iterator's `start_prefetch` (Grain's own, for making the input while a
    model is restored). Without it, the workers started at the first
    training step, after the state was made.
    """
    running = self._running()
    start = getattr(running, "start_prefetch", None)
    if start is not None:
      start()

  @contextlib.contextmanager
  def read_ahead_paused(self) -> Iterator[None]:
    """Holds the read-ahead threads of this process while the block runs.

    Each thread finishes the batch it is computing, then waits before its
    next one; they go on when the block ends. What they compute, and so
    every batch, is unchanged. Asking for a batch inside the block raises.
    """
    if not self._flowing.is_set():  # nested: the outermost block resumes
      yield
      return
    self._flowing.clear()
    try:
      yield
    finally:
      self._flowing.set()

  def publish_limits(self, after_batch: int, feature_specs: Any) -> None:
    """Batches from index `after_batch` (an FDO retune point: batches after it)
    on are preprocessed with `feature_specs`' limits; the running workers
    switch there (they wait for this call when they reach that batch)."""
    if self._board is None:
      raise ValueError("this input's limits are fixed: it was made without a LimitsBoard")
    if after_batch < self._next:
      raise ValueError(
        f"limits after batch {after_batch} published after batch {self._next} was handed out"
      )
    self._board.publish(after_batch, feature_specs)

  def _stop(self) -> None:
    if self._board is not None:
      self._board.close()  # first: ends the waits of threads that are then joined
    chain, self._chain = self._chain, None
    close = getattr(chain, "close", None)
    if close is not None:
      close()

  def close(self) -> None:
    """Stops the workers and read-ahead threads (a later batch restarts them)."""
    self._stop()

  def batch_at(self, index: int) -> Any:
    """Batch `index` made again in this process, as `__next__` hands it out.

    Nothing is recorded and the position does not move: for rebuilding the
    batches a checkpoint had in flight (e.g. for another mesh).
    """
    if self._board is not None and not self._board.published(index):
      raise ValueError(
        f"batch {int(index)} is preprocessed with the limits of the FDO retune after batch"
        f" {self._board.retune_of(index)}, which are not published yet"
      )
    element = self._batches[int(index)]
    if self._place is not None:
      element = self._place(element)
    return self._output(element)

  # -- state -------------------------------------------------------------------

  @property
  def next_batch(self) -> int:
    """The global index of the next batch this iterator hands out."""
    return self._next

  def get_state(self) -> dict[str, Any]:
    return {
      "metadata": dict(self.metadata),
      "next_batch": int(self._next),
      "stats": self._totals.to_state(),
    }

  def set_state(self, state: Mapping[str, Any]) -> None:
    saved = state.get("metadata", {})
    for key in sorted(self.metadata):
      if key in ADDED_METADATA_KEYS and key not in saved:
        continue
      if saved.get(key) != self.metadata[key]:
        raise IteratorStateMismatchError(
          f"data iterator state was saved with {key}={saved.get(key)!r}, but this"
          f" pipeline has {key}={self.metadata[key]!r}"
        )
    self._stop()
    self._next = int(state["next_batch"])
    if self._board is not None:
      self._board.rebase(self._next)
    self._totals = StatsTotals.from_state(state["stats"], self._sizes)

  def stats_totals(self) -> StatsTotals:
    """Running totals of the statistics of the batches handed out so far."""
    return StatsTotals.from_state(self._totals.to_state())

  def carry_stats_maxima(self, carry: Callable[[str, str, int], int]) -> None:
    """Maps the FDO maxima to this pipeline's layout after a device-count change.

    Their shapes (L*N, L*S per stack) and meaning follow the device layout.
    Each stack's maximum of each field m (of the saved layout) becomes
    `carry(field, stack, m)` on every entry of this layout's arrays (e.g.
    transforms.carry_stats_maximum: a bound on what the same batches give
    here). Batch, corrupt-record and drop counters are kept.
    """
    sizes = self._sizes or {}
    for field, stacks in sizes.items():
      saved = self._totals.maxima.get(field, {})
      for stack, size in stacks.items():
        old = saved.get(stack)
        m = int(old.max()) if old is not None and old.size else 0
        self._totals.maxima[field][stack] = np.full(size, carry(field, stack, m), np.int64)

  def __str__(self) -> str:
    return f"InputIterator(next_batch={self._next}, {self.metadata})"


def _close_if_alive(iterator: weakref.ref) -> None:
  """At exit: closes the InputIterator if it is still alive (weakref.finalize)."""
  alive = iterator()
  if alive is not None:
    alive.close()

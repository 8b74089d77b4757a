"""Reading a range of a window-shuffled lane: each window decoded once per process.

With the window shuffle (example_order.py) a batch holds examples of most
records of its window, so decoding a batch's records for each batch would
decode every record once per batch of its window. Instead each process
(the main one, or each Grain worker: it gets its own copy) decodes a
window's records once, keeps the last two windows of each lane it reads
(at most 2 * lanes windows), and gathers each batch's examples from them.
Train batches read the windows in lanes (train_batches.py): batch k reads
lane k mod S, and Grain hands worker j of N the batches j, j+N, ..., so
with N dividing S each lane, hence each window, is read by one worker
only: decoded once in all, and a worker keeps at most 2 * S / N windows.

Corrupt records (with skip_corrupt) leave their examples out of the
batches that would hold them, and count once in each such batch, as when
records are read per batch (read_examples.py).
"""

from __future__ import annotations

import collections
import threading
from typing import Any

import numpy as np

from sparsepipe.core import compile_cache
from sparsepipe.data.example import ExampleBatch
from sparsepipe.data.example import concat_batches
from sparsepipe.data.ragged import RaggedBatch
from sparsepipe.transforms.input.example_order import ExampleOrder
from sparsepipe.transforms.input.read_examples import ExampleReader
from sparsepipe.transforms.input.read_examples import ReadExamples


@compile_cache.njit(nogil=True)
def _gather_rows(values, splits, indices, out):
  """out = the rows `indices` of ragged `values` (row i: values[splits[i]:splits[i+1]])."""
  k = 0
  for i in indices:
    for j in range(splits[i], splits[i + 1]):
      out[k] = values[j]
      k += 1


def take_examples(
  batch: ExampleBatch,
  indices: np.ndarray,
  splits: dict[str, np.ndarray] | None = None,
) -> ExampleBatch:
  """The examples `indices` of `batch` ([n] ints in [0, num_examples), any order, repeats allowed).

  One compiled pass per feature (numpy's gathers of the ids cost about as
  much as decoding them). `splits` ({feature: RaggedBatch.row_splits()})
  saves recomputing them when one batch is gathered from many times.
  """
  indices = np.asarray(indices, np.int64)
  sparse = {}
  for name, rb in batch.sparse.items():
    row_splits = rb.row_splits() if splits is None else splits[name]
    lengths = rb.row_lengths[indices]
    total = int(lengths.sum())
    values = np.empty(total, rb.values.dtype)
    _gather_rows(rb.values, row_splits, indices, values)
    weights = None
    if rb.weights is not None:
      weights = np.empty(total, rb.weights.dtype)
      _gather_rows(rb.weights, row_splits, indices, weights)
    sparse[name] = RaggedBatch(values, lengths, weights)
  return ExampleBatch(batch.labels[indices], batch.dense[indices], sparse)


class _Window:
  """A window's records, decoded, laid out for gathering examples.

  Features with exactly one id per example keep their ids (and weights) in
  one [n, features] matrix, so a batch's rows are one gather that touches
  each example once (gathered per feature, each row was a trip to memory);
  the others are gathered row by row (take_examples), from own copies (the
  decoder's views of the record bytes gathered several times slower).

  Attributes:
    index: [n] where each of the window's n examples is among the decoded
      ones, -1 for an example of a corrupt record.
    record: [n] which of the window's records holds each example.
  """

  def __init__(self, examples: ExampleBatch | None, index: np.ndarray, record: np.ndarray):
    self.index, self.record = index, record
    if examples is None:  # every record corrupt: index is all -1, nothing is taken
      return
    self._names = list(examples.sparse)
    self._single = [
      n
      for n, rb in examples.sparse.items()
      if rb.values.size == rb.row_lengths.size and bool(np.all(rb.row_lengths == 1))
    ]
    single = [examples.sparse[n] for n in self._single]
    self._ids = np.stack([rb.values for rb in single], 1) if single else None
    self._weighted = [n for n, rb in zip(self._single, single) if rb.weights is not None]
    self._weights = None
    if self._weighted:
      self._weights = np.stack([examples.sparse[n].weights for n in self._weighted], 1)
    rest = {
      n: RaggedBatch(rb.values.copy(), rb.row_lengths, rb.weights)
      for n, rb in examples.sparse.items()
      if n not in self._single
    }
    self._rest = ExampleBatch(examples.labels.copy(), examples.dense.copy(), rest)
    self._splits = {n: rb.row_splits() for n, rb in rest.items()}

  def take(self, indices: np.ndarray) -> ExampleBatch:
    """The decoded examples `indices`, in that order."""
    part = take_examples(self._rest, indices, self._splits)
    sparse = dict(part.sparse)
    if self._single:
      ids = np.ascontiguousarray(self._ids[indices].T)
      weights = None
      if self._weights is not None:
        weights = np.ascontiguousarray(self._weights[indices].T)
      ones = np.ones(len(indices), np.int32)
      for j, name in enumerate(self._single):
        w = weights[self._weighted.index(name)] if name in self._weighted else None
        sparse[name] = RaggedBatch(ids[j], ones, w)
    return ExampleBatch(part.labels, part.dense, {n: sparse[n] for n in self._names})


class _Entry:
  def __init__(self):
    self.lock = threading.Lock()
    self.window: _Window | None = None


class WindowReader:
  """Reads ranges of `order`'s lanes (a window shuffle) through a cache of windows.

  Args:
    order: the example stream; `order.shuffles_examples` must be true.
    reader: reads and decodes records.
    cache_windows: decoded windows kept per lane (a range may straddle two
      windows of its lane, and read-ahead threads may read both at once).
  """

  def __init__(self, order: ExampleOrder, reader: ExampleReader, *, cache_windows: int = 2):
    if not order.shuffles_examples:
      raise ValueError("WindowReader needs an ExampleOrder with a window shuffle")
    self._order = order
    self._reader = reader
    self._size = int(cache_windows)
    self._lock = threading.Lock()
    self._cache: dict[int, collections.OrderedDict[int, _Entry]] = {}
    self.windows_decoded = 0

  def __getstate__(self) -> dict[str, Any]:
    state = dict(self.__dict__)
    del state["_lock"], state["_cache"]
    return state

  def __setstate__(self, state: dict[str, Any]) -> None:
    self.__dict__.update(state)
    self._lock = threading.Lock()
    self._cache = {}

  def _decode(self, window: int) -> _Window:
    run = self._order.window_records(window)
    examples, got, _ = self._reader.read_records(run)
    record = np.repeat(np.arange(len(run.counts)), run.counts)
    good = np.repeat(got > 0, run.counts)
    index = np.where(good, np.cumsum(good) - 1, -1)
    self.windows_decoded += 1
    return _Window(examples, index, record)

  def _window(self, window: int, lane: int) -> _Window:
    with self._lock:
      cache = self._cache.setdefault(lane, collections.OrderedDict())
      entry = cache.get(window)
      if entry is None:
        entry = cache[window] = _Entry()
        while len(cache) > self._size:
          cache.popitem(last=False)
      else:
        cache.move_to_end(window)
    with entry.lock:
      if entry.window is None:
        entry.window = self._decode(window)
      return entry.window

  @property
  def windows_kept(self) -> int:
    """Decoded windows held now (at most cache_windows per lane read)."""
    with self._lock:
      return sum(len(cache) for cache in self._cache.values())

  def read(self, start: int, stop: int, lane: int = 0, lanes: int = 1) -> ReadExamples:
    """The examples of positions [start, stop) of lane `lane` of `lanes`, in order."""
    slots = self._order.window_slots(start, stop, lane, lanes)
    parts, corrupt = [], 0
    cuts = np.searchsorted(slots.window, np.arange(len(slots.windows) + 1))
    for i, number in enumerate(slots.windows):
      window = self._window(int(number), lane)
      slot = slots.slot[cuts[i] : cuts[i + 1]]  # the window's examples, in stream order
      index = window.index[slot]
      bad = index < 0
      if bad.any():
        corrupt += len(np.unique(window.record[slot[bad]]))
        index = index[~bad]
      if index.size:
        parts.append(window.take(index))
    return ReadExamples(concat_batches(parts) if parts else None, corrupt)

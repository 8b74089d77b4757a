"""Reading a range of a window-shuffled stream: each window decoded once per process.

With the window shuffle (example_order.py) a batch holds examples of most
records of its window, so decoding a batch's records for each batch would
decode every record once per batch of its window. Instead each process
(the main one, or each Grain worker: it gets its own copy) decodes a
window's records once, keeps the last few windows, and gathers each
batch's examples from them. Grain hands worker j of N the batches j, j+N,
...: each worker decodes every window it reads from, so a window spanning
k batches is decoded min(N, k) times in all (benchmarks/loader.py).

Corrupt records (with skip_corrupt) leave their examples out of the
batches that would hold them, and count once in each such batch, as when
records are read per batch (read_examples.py).
"""

from __future__ import annotations

import collections
import threading
from typing import Any, NamedTuple

import numpy as np

from sparsepipe.data.example import ExampleBatch
from sparsepipe.data.example import concat_batches
from sparsepipe.data.example import take_examples
from sparsepipe.transforms.input.example_order import ExampleOrder
from sparsepipe.transforms.input.read_examples import ExampleReader
from sparsepipe.transforms.input.read_examples import ReadExamples


class _Window(NamedTuple):
  """A window's records, decoded.

  Attributes:
    examples: the examples of its good records, in sequence order (None if
      every record was corrupt).
    splits: {feature: row splits of `examples`}, for the gathers.
    index: [n] where each of the window's n examples is in `examples`, -1
      for an example of a corrupt record.
    record: [n] which of the window's records holds each example.
  """

  examples: ExampleBatch | None
  splits: dict[str, np.ndarray]
  index: np.ndarray
  record: np.ndarray


class _Entry:
  def __init__(self):
    self.lock = threading.Lock()
    self.window: _Window | None = None


class WindowReader:
  """Reads ranges of `order`'s stream (a window shuffle) through a cache of windows.

  Args:
    order: the example stream; `order.shuffles_examples` must be true.
    reader: reads and decodes records.
    cache_windows: decoded windows kept (the read-ahead threads of one
      process may read from neighbouring windows at once).
  """

  def __init__(self, order: ExampleOrder, reader: ExampleReader, *, cache_windows: int = 3):
    if not order.shuffles_examples:
      raise ValueError("WindowReader needs an ExampleOrder with a window shuffle")
    self._order = order
    self._reader = reader
    self._size = int(cache_windows)
    self._lock = threading.Lock()
    self._cache: collections.OrderedDict[int, _Entry] = collections.OrderedDict()
    self.windows_decoded = 0

  def __getstate__(self) -> dict[str, Any]:
    state = dict(self.__dict__)
    del state["_lock"], state["_cache"]
    return state

  def __setstate__(self, state: dict[str, Any]) -> None:
    self.__dict__.update(state)
    self._lock = threading.Lock()
    self._cache = collections.OrderedDict()

  def _decode(self, window: int) -> _Window:
    run = self._order.window_records(window)
    examples, got, _ = self._reader.read_records(run)
    record = np.repeat(np.arange(len(run.counts)), run.counts)
    good = np.repeat(got > 0, run.counts)
    index = np.where(good, np.cumsum(good) - 1, -1)
    splits = {} if examples is None else {n: rb.row_splits() for n, rb in examples.sparse.items()}
    self.windows_decoded += 1
    return _Window(examples, splits, index, record)

  def _window(self, window: int) -> _Window:
    with self._lock:
      entry = self._cache.get(window)
      if entry is None:
        entry = self._cache[window] = _Entry()
        while len(self._cache) > self._size:
          self._cache.popitem(last=False)
      else:
        self._cache.move_to_end(window)
    with entry.lock:
      if entry.window is None:
        entry.window = self._decode(window)
      return entry.window

  def read(self, start: int, stop: int) -> ReadExamples:
    """The examples of stream positions [start, stop), in stream order."""
    slots = self._order.window_slots(start, stop)
    parts, corrupt = [], 0
    for i, number in enumerate(slots.windows):
      window = self._window(int(number))
      index = window.index[slots.slot[slots.window == i]]
      bad = index < 0
      if bad.any():
        corrupt += len(np.unique(window.record[slots.slot[slots.window == i][bad]]))
        index = index[~bad]
      if index.size:
        parts.append(take_examples(window.examples, index, window.splits))
    return ReadExamples(concat_batches(parts) if parts else None, corrupt)

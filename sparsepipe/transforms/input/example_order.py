"""Where each example of a dataset's example stream is: records and offsets.

The training input reads an endless stream of examples, epoch after epoch;
a batch is a contiguous range of it (train_batches.py). Its order:

* shuffled (the default): in epoch e, the dataset's full records (holding
  examples_per_record R examples each) in a seeded random order
  (index_shuffle.permute, another order every epoch), then its short
  records (the last record of a shard may hold fewer than R), in file
  order. With `window` W = 0, or records of one example, that is the
  stream: examples inside a record stay together and in order.
  With W > 0 and R > 1 the examples are shuffled across records too: the
  epoch's record sequence is cut into windows of W consecutive records,
  and the n examples of a window are put in a seeded random order of
  their own (permute over [0, n), stream = window number + 1, another
  order every epoch): stream slot s of window w holds the q-th example
  of w's records (in sequence order), q = permute(s). So the examples of
  one record spread over the window's part of the stream, and any two
  examples of one window can land in the same batch.
* in file order (shuffle off, and evaluation): record after record.

Positions are plain arithmetic on the manifest's counts, so any range of
the stream is located without reading anything before it: a batch is a
function of its index, not of how many batches were read before it, by
which worker, or on how many hosts.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sparsepipe.data.manifest import Manifest
from sparsepipe.transforms.input.index_shuffle import permute


def record_starts(manifest: Manifest) -> np.ndarray:
  """[num_records + 1] position of each record's first example (and the total), file order.

  Raises:
    ValueError: a shard whose counts are not full records plus one last
      record of 1..R examples.
  """
  r = manifest.examples_per_record
  counts = []
  for shard in manifest.shards:
    if shard.num_records == shard.num_examples == 0:
      continue
    last = shard.num_examples - r * (shard.num_records - 1)
    if shard.num_records < 1 or not 1 <= last <= r:
      raise ValueError(
        f"shard '{shard.path}' of '{manifest.directory}': {shard.num_records} records hold"
        f" {shard.num_examples} examples, not full records of examples_per_record={r}"
        " and a last one of 1 to R: its examples cannot be located"
      )
    counts += [r] * (shard.num_records - 1) + [last]
  return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])


class RecordRun(NamedTuple):
  """The records holding a contiguous range of the stream, in stream order.

  Attributes:
    records: [n] int64 record indices (into the dataset's global record order).
    counts: [n] examples each record holds (the manifest's numbers).
    skip: examples of the first record before the range.
    take: examples in the range (from `skip` on, across the records).
  """

  records: np.ndarray
  counts: np.ndarray
  skip: int
  take: int


class WindowSlots(NamedTuple):
  """Where the examples of a range of a window-shuffled stream are.

  Attributes:
    windows: [m] the distinct windows the range reads, ascending (global
      numbers: epoch * windows_per_epoch + window of the epoch).
    window: [take] index into `windows` of each example, in stream order.
    slot: [take] the example's index among its window's examples
      (`ExampleOrder.window_records` order).
  """

  windows: np.ndarray
  window: np.ndarray
  slot: np.ndarray


class ExampleOrder:
  """The example stream of a dataset: shuffled per epoch (seeded), or in file order.

  `window` > 0 (records) shuffles examples across the records of each
  window (module doc) when the dataset packs more than one example per
  record and `shuffle` is on; `shuffles_examples` says whether it does.
  """

  def __init__(self, manifest: Manifest, *, shuffle: bool, seed: int = 0, window: int = 0):
    if window < 0:
      raise ValueError(f"shuffle window={window} records must be >= 0")
    self._starts = record_starts(manifest)
    self._counts = np.diff(self._starts)
    self._r = int(manifest.examples_per_record)
    self._shuffle = bool(shuffle)
    self._seed = int(seed)
    self.epoch_examples = int(self._starts[-1])
    if self.epoch_examples == 0:
      raise ValueError(f"dataset '{manifest.directory}' holds no examples")
    self._short = np.flatnonzero(self._counts < self._r)
    self._num_full = len(self._counts) - len(self._short)
    # Stream positions (within an epoch) of the short records, after the full ones.
    self._short_starts = self._num_full * self._r + np.concatenate(
      [[0], np.cumsum(self._counts[self._short])]
    )
    shuffles = self._shuffle and self._r > 1 and window > 0
    self.window = int(window) if shuffles else 0
    if self.window:
      # Epoch position where each window starts (and the epoch's end).
      ranks = np.arange(0, len(self._counts), self.window)
      full_pos = np.minimum(ranks, self._num_full) * self._r
      short_pos = self._short_starts[np.maximum(ranks - self._num_full, 0)]
      starts = np.where(ranks < self._num_full, full_pos, short_pos)
      self._window_starts = np.append(starts, self.epoch_examples).astype(np.int64)
      self.windows_per_epoch = len(ranks)
      self._lane_cache: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}

  @property
  def shuffles_examples(self) -> bool:
    """Whether examples are shuffled across records (a window shuffle)."""
    return self.window > 0

  def _full_record(self, ranks: np.ndarray) -> np.ndarray:
    """Record index of the full records of rank `ranks` (the i-th record that is not short)."""
    if not self._short.size:
      return ranks
    gaps = self._short - np.arange(self._short.size)
    return ranks + np.searchsorted(gaps, ranks, side="right")

  def _epoch_records(self, epoch: int, lo: int, hi: int) -> tuple[np.ndarray, int]:
    """(records holding epoch positions [lo, hi), examples of the first before lo)."""
    if not self._shuffle:
      first = int(np.searchsorted(self._starts, lo, side="right")) - 1
      last = int(np.searchsorted(self._starts, hi, side="left"))
      return np.arange(first, last, dtype=np.int64), lo - int(self._starts[first])
    parts, skip = [], None
    full_end = self._num_full * self._r
    if lo < full_end:
      first, last = lo // self._r, (min(hi, full_end) - 1) // self._r
      ranks = permute(np.arange(first, last + 1), self._num_full, seed=self._seed, epoch=epoch)
      parts.append(self._full_record(ranks))
      skip = lo - first * self._r
    if hi > full_end:
      a, b = max(lo, full_end), hi
      first = int(np.searchsorted(self._short_starts, a, side="right")) - 1
      last = int(np.searchsorted(self._short_starts, b, side="left"))
      parts.append(self._short[first:last].astype(np.int64))
      if skip is None:
        skip = a - int(self._short_starts[first])
    return np.concatenate(parts), int(skip)

  def locate(self, start: int, stop: int) -> RecordRun:
    """The records of stream positions [start, stop) (any epochs), in stream order."""
    if not 0 <= start < stop:
      raise ValueError(f"an example range [{start}, {stop}) must be non-empty and non-negative")
    runs, skip = [], None
    position = start
    while position < stop:
      epoch, lo = divmod(position, self.epoch_examples)
      hi = min(self.epoch_examples, lo + (stop - position))
      records, first_skip = self._epoch_records(epoch, lo, hi)
      runs.append(records)
      skip = first_skip if skip is None else skip
      position += hi - lo
    records = np.concatenate(runs)
    return RecordRun(records, self._counts[records], int(skip), stop - start)

  def window_records(self, window: int) -> RecordRun:
    """The records of global window `window`, in sequence order (all their examples)."""
    epoch, w = divmod(int(window), self.windows_per_epoch)
    lo, hi = int(self._window_starts[w]), int(self._window_starts[w + 1])
    records, _ = self._epoch_records(epoch, lo, hi)
    return RecordRun(records, self._counts[records], 0, hi - lo)

  def _lane_windows(self, lane: int, lanes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One cycle of lane `lane` of `lanes`: (epoch of the cycle, window, start) of its windows.

    In epoch e of a cycle of `lanes` epochs the lane holds the windows w
    with (w + e) mod lanes == lane, so over a cycle it holds every window
    of an epoch once: epoch_examples examples, as every other lane. Starts
    has one more entry, epoch_examples.
    """
    key = (lane, lanes)
    if key not in self._lane_cache:
      wpe = self.windows_per_epoch
      ws = [np.arange((lane - e) % lanes, wpe, lanes) for e in range(lanes)]
      epochs = np.repeat(np.arange(lanes), [len(w) for w in ws])
      windows = np.concatenate(ws)
      sizes = self._window_starts[windows + 1] - self._window_starts[windows]
      starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
      self._lane_cache[key] = (epochs, windows, starts)
    return self._lane_cache[key]

  def window_slots(self, start: int, stop: int, lane: int = 0, lanes: int = 1) -> WindowSlots:
    """The windows and slots of positions [start, stop) of a lane (window shuffle only).

    Lane `lane` of `lanes` holds, in cycles of `lanes` epochs (cycle c:
    epochs c * lanes + e, e < lanes), the windows w of epoch c * lanes + e
    with (w + e) mod lanes == lane, in that order, each in its own order.
    One lane (the default) is the stream itself.
    """
    if not self.window:
      raise ValueError("window_slots needs a window shuffle (shuffles_examples)")
    if not 0 <= start < stop:
      raise ValueError(f"an example range [{start}, {stop}) must be non-empty and non-negative")
    if not 0 <= lane < lanes:
      raise ValueError(f"lane {lane} of {lanes} lanes: must be in [0, {lanes})")
    epochs, windows, starts = self._lane_windows(int(lane), int(lanes))
    positions = np.arange(start, stop, dtype=np.int64)
    cycle, p = np.divmod(positions, self.epoch_examples)
    i = np.searchsorted(starts, p, side="right") - 1
    offset = p - starts[i]
    w = windows[i]
    glob = (cycle * lanes + epochs[i]) * self.windows_per_epoch + w
    size = self._window_starts[w + 1] - self._window_starts[w]
    # Positions ascend, so each window's positions are one run of the range.
    cuts = np.concatenate([[0], np.flatnonzero(np.diff(glob)) + 1, [len(glob)]])
    slot = np.empty_like(offset)
    for a, b in zip(cuts[:-1], cuts[1:]):
      e, ww = divmod(int(glob[a]), self.windows_per_epoch)
      n = int(size[a])
      slot[a:b] = permute(offset[a:b], n, seed=self._seed, epoch=e, stream=ww + 1)
    index = np.repeat(np.arange(len(cuts) - 1), np.diff(cuts))
    return WindowSlots(glob[cuts[:-1]], index, slot)

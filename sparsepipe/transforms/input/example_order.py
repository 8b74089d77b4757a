"""Where each example of a dataset's example stream is: records and offsets.

The training input reads an endless stream of examples, epoch after epoch;
a batch is a contiguous range of it (train_batches.py). Its order:

* shuffled (the default): in epoch e, the dataset's full records (holding
  examples_per_record R examples each) in a seeded random order
  (index_shuffle.permute, another order every epoch), then its short
  records (the last record of a shard may hold fewer than R), in file
  order. Examples inside a record stay together and in order.
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


class ExampleOrder:
  """The example stream of a dataset: shuffled per epoch (seeded), or in file order."""

  def __init__(self, manifest: Manifest, *, shuffle: bool, seed: int = 0):
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

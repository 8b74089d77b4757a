"""Grain dataset: a stream of record indices -> decoded batches of exactly B examples.

The parent is a MapDataset of source record indices (the shuffled, sliced,
repeated order). The iterator reads the records it needs in one batched
source read, decodes them together (sparsepipe.data.bulk_decode) and cuts
batches of `batch_size` examples from consecutive records; a record may
straddle two batches. Reading and decoding in bulk keeps the per-record
Python cost small, which matters for records of one or a few examples.

Like Grain's own iterators, it records its time and output spec in Grain's
per-iterator statistics (the execution summary of STAGE_TIMING / debug mode).

State: `{"next_record": r, "offset": k}`, the position (in the parent's
order) of the next example to emit. Records read ahead of that position are
only a cache: restoring re-reads from record r and skips k examples. A
skipped corrupt record is counted in the batch during which the position
moves past it, so the counts do not depend on read-ahead either.
"""

from __future__ import annotations

import collections
from typing import Any, NamedTuple

from absl import logging
import grain
from grain._src.python.dataset import stats as grain_stats

from sparsepipe.data.bulk_decode import decode_records
from sparsepipe.data.codec import RecordCodec
from sparsepipe.data.example import ExampleBatch, concat_batches, slice_batch
from sparsepipe.data.manifest import RecordLocator
from sparsepipe.data.schema import ExampleSchema

# This many corrupt records in a row means the data is beyond skipping.
MAX_CONSECUTIVE_CORRUPT = 1000
# Most records read in one go.
MAX_READ = 8192


class ParsedBatch(NamedTuple):
  """Examples with the number of corrupt records skipped to get them.

  Attributes:
    examples: columnar examples, or None for a skipped corrupt record.
    num_corrupt_records: corrupt records skipped (0 unless skip_corrupt).
  """

  examples: ExampleBatch | None
  num_corrupt_records: int = 0


class DecodeBatchIterDataset(grain.IterDataset):
  """Batches of `batch_size` examples (ParsedBatch) from record indices.

  Args:
    record_indices: MapDataset of source record indices (values past the
      source length wrap around, as a repeated shuffle produces them).
    source: the random-access record source (e.g. manifest_source(...)).
    batch_size: examples per batch.
    schema: the records' example schema.
    locator: names (file, index) of a corrupt record in errors.
    skip_corrupt: skip and count corrupt records instead of raising.
    examples_per_record: expected R, only to size the first read.

  A finite index stream ends with a partial batch, which is dropped with a
  logged warning (the pipeline repeats its data, so this concerns finite
  evaluation runs only).
  """

  def __init__(
    self,
    record_indices: grain.MapDataset,
    source: Any,
    batch_size: int,
    *,
    schema: ExampleSchema,
    locator: RecordLocator | None = None,
    skip_corrupt: bool = False,
    examples_per_record: int = 1,
  ):
    super().__init__(record_indices)
    if batch_size < 1:
      raise ValueError(f"batch_size={batch_size} must be >= 1")
    self._source = source
    self._batch_size = batch_size
    self._schema = schema
    self._locator = locator
    self._skip_corrupt = skip_corrupt
    self._examples_per_record = max(1, int(examples_per_record))

  def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
    """Reads only the slice `sl` of the record stream (mp_prefetch's worker split)."""
    if sequential_slice:
      raise ValueError("DecodeBatchIterDataset does not support sequential_slice")
    self._parents = (self._parent.slice(sl),)

  def __iter__(self) -> grain.DatasetIterator:
    return _DecodeBatchIterator(
      self._parent,
      self._source,
      self._batch_size,
      RecordCodec(self._schema),
      self._locator,
      self._skip_corrupt,
      self._examples_per_record,
    )

  def __str__(self) -> str:
    return f"DecodeBatchIterDataset(batch_size={self._batch_size})"


class _DecodeBatchIterator(grain.DatasetIterator):
  """See the module docstring for the state and the read-ahead cache."""

  def __init__(self, indices, source, batch_size, codec, locator, skip_corrupt, per_record):
    super().__init__()
    self._indices = indices
    self._length = len(indices)
    self._source = source
    self._num_source = len(source)
    self._batch_size = batch_size
    self._codec = codec
    self._locator = locator
    self._skip_corrupt = skip_corrupt
    self._per_record = float(per_record)
    self._next_record = 0
    self._offset = 0
    self._reset_cache()

  def _reset_cache(self) -> None:
    self._cache: ExampleBatch | None = None  # examples from (_next_record, _offset) on
    self._cached = 0  # examples in the cache
    self._counts: collections.deque[int] = collections.deque()  # records _next_record..
    self._read_end = self._next_record
    self._corrupt_run = 0

  def _read_more(self, short: int) -> None:
    """Reads and decodes enough records for `short` more examples (estimated)."""
    if self._read_end >= self._length:
      raise StopIteration
    m = int(
      min(MAX_READ, max(1, -(-short // max(self._per_record, 1.0))), self._length - self._read_end)
    )
    positions = range(self._read_end, self._read_end + m)
    indices = [int(self._indices[p]) % self._num_source for p in positions]
    if hasattr(self._source, "__getitems__"):
      records = self._source.__getitems__(indices)
    else:
      records = [self._source[i] for i in indices]
    where = None
    if self._locator is not None:
      where = lambda j: self._locator.locate(indices[j])  # pylint: disable=unnecessary-lambda-assignment
    decoded = decode_records(self._codec, records, where=where, skip_corrupt=self._skip_corrupt)
    for error in decoded.errors:
      logging.warning("skipping %s", error)
    got = int(decoded.examples_per_record.sum())
    if got:
      self._per_record = got / (m - len(decoded.errors))
      if self._cached:
        self._cache = concat_batches([self._cache, decoded.examples])
      else:  # Nothing left over (batches ending on record ends): no copy.
        self._cache = decoded.examples
      self._cached += got
    for c in decoded.examples_per_record:
      self._corrupt_run = 0 if c else self._corrupt_run + 1
      if self._corrupt_run >= MAX_CONSECUTIVE_CORRUPT:
        raise ValueError(
          f"{self._corrupt_run} corrupt records in a row (up to record position"
          f" {self._read_end + m - 1}): the data is damaged beyond skipping"
        )
    self._counts.extend(int(c) for c in decoded.examples_per_record)
    self._read_end += m

  @grain_stats.record_next_duration_if_output
  @grain_stats.trace_input_pipeline_next(stage_category=grain_stats.IPL_CAT_READ)
  def __next__(self) -> ParsedBatch:
    with self._stats.record_self_time():
      return self._stats.record_output_spec(self._next_batch())

  def _next_batch(self) -> ParsedBatch:
    while self._cached < self._batch_size:
      try:
        self._read_more(self._batch_size - self._cached)
      except StopIteration:
        if self._cached:
          logging.warning(
            "dropping the final partial batch of %d examples (batch_size=%d)",
            self._cached,
            self._batch_size,
          )
        raise
    batch = slice_batch(self._cache, 0, self._batch_size)
    self._cache = slice_batch(self._cache, self._batch_size, self._cached)
    self._cached -= self._batch_size
    return ParsedBatch(batch, self._advance(self._batch_size))

  def _advance(self, n: int) -> int:
    """Moves the position past n examples; returns corrupt records passed."""
    corrupt = 0
    while n:
      count = self._counts[0]
      if count == 0:  # a skipped corrupt record
        corrupt += 1
        self._counts.popleft()
        self._next_record += 1
        continue
      take = min(n, count - self._offset)
      n -= take
      self._offset += take
      if self._offset == count:
        self._counts.popleft()
        self._next_record += 1
        self._offset = 0
    return corrupt

  def get_state(self) -> dict[str, Any]:
    return {"next_record": int(self._next_record), "offset": int(self._offset)}

  def set_state(self, state: dict[str, Any]) -> None:
    self._next_record = int(state["next_record"])
    self._offset = int(state["offset"])
    self._reset_cache()
    # The cache must start at the offset inside the first record: read it now.
    if self._offset:
      self._read_more(1)
      first = self._counts[0]
      if self._offset >= first:
        raise ValueError(
          f"iterator state offset {self._offset} is past the {first} examples of"
          f" record position {self._next_record}"
        )
      self._cache = slice_batch(self._cache, self._offset, self._cached)
      self._cached -= self._offset

  def __str__(self) -> str:
    return f"_DecodeBatchIterator(batch_size={self._batch_size})"

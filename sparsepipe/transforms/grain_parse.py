"""Grain transform: record bytes -> columnar examples (skipping corrupt ones if asked)."""

from __future__ import annotations

from typing import NamedTuple

from absl import logging
import grain

from sparsepipe.data.codec import CorruptRecordError, RecordCodec
from sparsepipe.data.example import ExampleBatch
from sparsepipe.data.manifest import RecordLocator
from sparsepipe.data.schema import ExampleSchema


class ParsedBatch(NamedTuple):
  """Examples with the number of corrupt records skipped to get them.

  Attributes:
    examples: columnar examples, or None for a skipped corrupt record.
    num_corrupt_records: corrupt records skipped (0 unless skip_corrupt).
  """

  examples: ExampleBatch | None
  num_corrupt_records: int = 0


class ParseRecords(grain.transforms.MapWithIndex):
  """Decodes a record into a ParsedBatch.

  Apply it directly on the source (`MapDataset.source(src).map_with_index(...)`,
  before any shuffle) so that `index` is the global record index: a corrupt
  record is then reported by file and index inside that file. Indices past
  the end (later epochs of a repeated dataset) wrap around.

  Args:
    schema: the dataset's example schema.
    locator: maps global record indices to (file, index) for error messages.
    skip_corrupt: return ParsedBatch(None, 1) for a corrupt record (with a
      logged warning) instead of raising CorruptRecordError.
  """

  def __init__(
      self,
      schema: ExampleSchema,
      locator: RecordLocator | None = None,
      *,
      skip_corrupt: bool = False,
  ):
    self.schema = schema
    self.locator = locator
    self.skip_corrupt = skip_corrupt
    self._codec = RecordCodec(schema)

  def map_with_index(self, index: int, element: bytes) -> ParsedBatch:
    try:
      return ParsedBatch(self._codec.decode_batch(element), 0)
    except CorruptRecordError as e:
      error = self._located(e, index)
    if not self.skip_corrupt:
      raise error
    logging.warning("skipping %s", error)
    return ParsedBatch(None, 1)

  def _located(self, error: CorruptRecordError, index: int) -> CorruptRecordError:
    if self.locator is None:
      return CorruptRecordError(error.reason, index=index)
    path, in_file = self.locator.locate(index % self.locator.num_records)
    return CorruptRecordError(error.reason, path=path, index=in_file)

"""Reading a range of the example stream: its records, decoded in bulk, cut to the range.

Train batches and eval batches both read this way: `ExampleOrder.locate`
says which records hold the range; they are read in one batched source
read, decoded together (data.bulk_decode) and cut to the range. Every
record must hold the examples the manifest says, else an error names the
file and record. With `skip_corrupt`, a corrupt record is skipped, logged
and counted; its examples are missing from what is returned.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

import numpy as np
from absl import logging

from sparsepipe.data.bulk_decode import decode_records
from sparsepipe.data.codec import RecordCodec
from sparsepipe.data.example import ExampleBatch
from sparsepipe.data.example import concat_batches
from sparsepipe.data.example import slice_batch
from sparsepipe.data.manifest import Manifest
from sparsepipe.data.manifest import RecordLocator
from sparsepipe.data.source import manifest_source
from sparsepipe.transforms.input.example_order import RecordRun


class ReadExamples(NamedTuple):
  """Examples read for a range, and the corrupt records skipped.

  Attributes:
    examples: the examples of the range in stream order (None if all were
      in skipped records); fewer than the range when records were skipped.
    num_corrupt_records: corrupt records skipped (0 unless skip_corrupt).
  """

  examples: ExampleBatch | None
  num_corrupt_records: int


class ExampleReader:
  """Reads record runs of one dataset (picklable: Grain workers get a copy).

  Args:
    manifest: the dataset.
    reader_options: ArrayRecord reader options.
    skip_corrupt: skip (log and count) corrupt records instead of raising.
  """

  def __init__(
    self,
    manifest: Manifest,
    *,
    reader_options: Mapping[str, str] | None = None,
    skip_corrupt: bool = False,
  ):
    self._source = manifest_source(manifest, reader_options=reader_options)
    self._codec = RecordCodec(manifest.schema)
    self._locator = RecordLocator.from_manifest(manifest)
    self._skip_corrupt = bool(skip_corrupt)

  def read(self, run: RecordRun) -> ReadExamples:
    """The examples of `run` (ExampleOrder.locate's result)."""
    examples, got, corrupt = self.read_records(run)
    if examples is None:
      return ReadExamples(None, corrupt)
    if not corrupt:
      return ReadExamples(slice_batch(examples, run.skip, run.skip + run.take), 0)
    return ReadExamples(_cut_around_gaps(examples, got, run), corrupt)

  def read_records(self, run: RecordRun) -> tuple[ExampleBatch | None, np.ndarray, int]:
    """(all examples of `run`'s good records, examples each record gave, corrupt records).

    A record whose examples differ from the manifest's count is an error.
    """
    indices = run.records
    records = self._source.__getitems__(indices)
    decoded = decode_records(
      self._codec,
      records,
      where=lambda j: self._locator.locate(int(indices[j])),
      skip_corrupt=self._skip_corrupt,
    )
    for error in decoded.errors:
      logging.warning("skipping %s", error)
    got = decoded.examples_per_record
    wrong = np.flatnonzero((got != run.counts) & (got != 0))
    if wrong.size:
      j = int(wrong[0])
      path, index = self._locator.locate(int(indices[j]))
      raise ValueError(
        f"record {index} of '{path}' holds {got[j]} examples, the manifest implies {run.counts[j]}"
      )
    return decoded.examples, got, len(decoded.errors)


def _cut_around_gaps(
  examples: ExampleBatch, got: np.ndarray, run: RecordRun
) -> ExampleBatch | None:
  """The range's examples of the records that decoded (`got` > 0), in order."""
  # Window [lo, hi) of each record within the range: whole records, except
  # the first (from `skip`) and the last (up to the end of the range).
  ends = np.cumsum(run.counts) - run.skip
  starts = ends - run.counts
  lo = np.clip(starts, 0, run.take) - starts
  hi = np.clip(ends, 0, run.take) - starts
  parts, offset = [], 0
  for j in np.flatnonzero(got):
    if hi[j] > lo[j]:
      parts.append(slice_batch(examples, offset + int(lo[j]), offset + int(hi[j])))
    offset += int(got[j])
  return concat_batches(parts) if parts else None

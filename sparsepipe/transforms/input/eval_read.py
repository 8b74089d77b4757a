"""Grain stages of the eval input: one ordered pass, every example exactly once.

    MapDataset.range(num_global_batches * B * P)   # example positions, padded
      -> HostBlocksMapDataset(block=B)     # this host's block of each global batch
      -> batch(B)                          # [B] example positions per host batch
      -> map(ReadEvalExamples)             # read + decode, pad, mask
      -> map(PreprocessEval)               # COO buffers -> EvalBatch

Positions address examples, not records, so any batch size works with any
examples_per_record and nothing is dropped: the example count is rounded up
to whole global batches, and positions past the end are padding (label 0,
dense 0, no sparse ids, mask 0). Every host gets the same number of batches
(the step is a collective); a host whose block of the last global batch is
past the end gets a batch of padding only. Global batch g holds examples
[g*B*P, (g+1)*B*P) in order, on one host or many.

An example's record is found from the manifest: every record of a shard
holds examples_per_record (R) examples except the shard's last, which holds
the rest. Eval never skips a corrupt record (it would silently shrink the
eval set): decoding errors name the file and record.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import grain
import numpy as np

from sparsepipe.core.batch import EvalBatch
from sparsepipe.data.bulk_decode import decode_records
from sparsepipe.data.codec import RecordCodec
from sparsepipe.data.example import ExampleBatch, concat_batches, slice_batch
from sparsepipe.data.manifest import Manifest, RecordLocator
from sparsepipe.data.ragged import RaggedBatch
from sparsepipe.data.schema import ExampleSchema
from sparsepipe.data.source import manifest_source
from sparsepipe.transforms.input.host_blocks import HostBlocksMapDataset
from sparsepipe.transforms.input.preprocess import PreprocessSparse


class EvalExamples(NamedTuple):
  """A host batch of examples padded to the static size, and its mask.

  Attributes:
    examples: [B] columnar examples, padding at the end.
    mask: [B] float32, 1 for a real example, 0 for padding.
  """

  examples: ExampleBatch
  mask: np.ndarray


def eval_positions(
  num_examples: int, per_host_batch_size: int, *, process_index: int, process_count: int
) -> grain.MapDataset:
  """[B] int64 example positions of each of this host's batches (>= num_examples: padding)."""
  global_batch = per_host_batch_size * process_count
  num_batches = -(-num_examples // global_batch)
  positions = grain.MapDataset.range(num_batches * global_batch)
  positions = HostBlocksMapDataset(
    positions, block=per_host_batch_size, index=process_index, count=process_count
  )
  return positions.batch(per_host_batch_size)


def record_starts(manifest: Manifest) -> np.ndarray:
  """[num_records + 1] position of each record's first example (and the total).

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
        " and a last one of 1 to R: eval cannot locate its examples"
      )
    counts += [r] * (shard.num_records - 1) + [last]
  return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])


def padding_examples(schema: ExampleSchema, n: int) -> ExampleBatch:
  """n examples with label 0, dense 0 and no sparse ids."""
  sparse = {
    f.name: RaggedBatch(
      np.zeros(0, np.int32),
      np.zeros(n, np.int32),
      np.zeros(0, np.float32) if f.weighted else None,
    )
    for f in schema.sparse
  }
  return ExampleBatch(np.zeros(n, np.float32), np.zeros((n, schema.num_dense), np.float32), sparse)


class ReadEvalExamples(grain.transforms.Map):
  """Example positions -> EvalExamples: read, decode, pad to the batch size.

  Args:
    manifest: the eval dataset.
    reader_options: ArrayRecord reader options.
  """

  def __init__(self, manifest: Manifest, *, reader_options: dict[str, str] | None = None):
    self._source = manifest_source(manifest, reader_options=reader_options)
    self._codec = RecordCodec(manifest.schema)
    self._schema = manifest.schema
    self._locator = RecordLocator.from_manifest(manifest)
    self._starts = record_starts(manifest)

  def map(self, positions: np.ndarray) -> EvalExamples:
    size = int(positions.shape[0])
    real = int(np.count_nonzero(positions < self._starts[-1]))
    parts = [self._read(int(positions[0]), int(positions[0]) + real)] if real else []
    if real < size:
      parts.append(padding_examples(self._schema, size - real))
    mask = (np.arange(size) < real).astype(np.float32)
    return EvalExamples(concat_batches(parts), mask)

  def _read(self, start: int, stop: int) -> ExampleBatch:
    """Examples [start, stop) from the records that hold them."""
    first = int(np.searchsorted(self._starts, start, side="right")) - 1
    end = int(np.searchsorted(self._starts, stop, side="left"))
    indices = list(range(first, end))
    if hasattr(self._source, "__getitems__"):
      records = self._source.__getitems__(indices)
    else:
      records = [self._source[i] for i in indices]
    decoded = decode_records(self._codec, records, where=lambda j: self._locator.locate(indices[j]))
    expected = np.diff(self._starts[first : end + 1])
    wrong = np.flatnonzero(decoded.examples_per_record != expected)
    if wrong.size:
      j = int(wrong[0])
      path, index = self._locator.locate(indices[j])
      raise ValueError(
        f"record {index} of '{path}' holds {decoded.examples_per_record[j]} examples,"
        f" the manifest implies {expected[j]}"
      )
    offset = int(self._starts[first])
    return slice_batch(decoded.examples, start - offset, stop - offset)


class PreprocessEval(grain.transforms.Map):
  """EvalExamples -> EvalBatch: the training COO preprocessing, mask kept.

  Takes the arguments of PreprocessSparse (the same specs and limits as the
  train step, so the eval step compiles with the same buffer sizes).
  """

  def __init__(self, feature_specs: Any, **kwargs: Any):
    self._preprocess = PreprocessSparse(feature_specs, **kwargs)

  def map(self, element: EvalExamples) -> EvalBatch:
    return EvalBatch(self._preprocess.map(element.examples).batch, element.mask)

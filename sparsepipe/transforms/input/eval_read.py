"""Grain stages of the eval input: one ordered pass, every example exactly once.

    MapDataset.range(num_batches)          # this host's eval batches
      -> map(ReadEvalExamples)             # read + decode in file order, pad, mask
      -> map(PreprocessEval)               # COO buffers -> EvalBatch

Eval batch g of host h is examples [g*G + h*B, g*G + (h+1)*B) of the
dataset in file order (example_order.py), B per host, G = B * hosts; any
batch size works with any examples_per_record and nothing is dropped: the
example count is rounded up to whole global batches, and positions past the
end are padding (label 0, dense 0, no sparse ids, mask 0). Every host gets
the same number of batches (the step is a collective); a host whose block of
the last global batch is past the end gets a batch of padding only. Global
batch g holds examples [g*G, (g+1)*G) in order, on one host or many.

Eval never skips a corrupt record (it would silently shrink the eval set):
decoding errors name the file and record.
"""

from __future__ import annotations

from typing import NamedTuple

import grain
import numpy as np

from sparsepipe.core.batch import EvalBatch
from sparsepipe.data.example import ExampleBatch, concat_batches
from sparsepipe.data.manifest import Manifest
from sparsepipe.data.ragged import RaggedBatch
from sparsepipe.data.schema import ExampleSchema
from sparsepipe.transforms.input.example_order import ExampleOrder
from sparsepipe.transforms.input.coo_transform import PreprocessSparse
from sparsepipe.transforms.input.read_examples import ExampleReader


class EvalExamples(NamedTuple):
  """A host batch of examples padded to the static size, and its mask.

  Attributes:
    examples: [B] columnar examples, padding at the end.
    mask: [B] float32, 1 for a real example, 0 for padding.
  """

  examples: ExampleBatch
  mask: np.ndarray


def num_eval_batches(num_examples: int, global_batch_size: int) -> int:
  """Global batches of one eval pass: every example once, the last batch padded."""
  if int(global_batch_size) < 1 or int(num_examples) < 0:
    raise ValueError(
      f"an eval pass of {num_examples} examples in global batches of {global_batch_size}:"
      " the batch size must be >= 1 and the examples >= 0"
    )
  return -(-int(num_examples) // int(global_batch_size))


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
  """Eval batch index -> EvalExamples of this host: read, decode, pad to the batch size.

  Args:
    manifest: the eval dataset.
    per_host_batch_size: B.
    process_index, process_count: this host and the host count.
    reader_options: ArrayRecord reader options.
  """

  def __init__(
    self,
    manifest: Manifest,
    *,
    per_host_batch_size: int,
    process_index: int,
    process_count: int,
    reader_options: dict[str, str] | None = None,
  ):
    self._order = ExampleOrder(manifest, shuffle=False)
    self._reader = ExampleReader(manifest, reader_options=reader_options)
    self._schema = manifest.schema
    self._b = int(per_host_batch_size)
    self._offset = int(process_index) * self._b
    self._global = self._b * int(process_count)
    self._total = self._order.epoch_examples

  def map(self, batch_index: int) -> EvalExamples:
    start = int(batch_index) * self._global + self._offset
    real = max(0, min(self._b, self._total - start))
    parts = [self._reader.read(self._order.locate(start, start + real)).examples] if real else []
    if real < self._b:
      parts.append(padding_examples(self._schema, self._b - real))
    mask = (np.arange(self._b) < real).astype(np.float32)
    return EvalExamples(concat_batches(parts), mask)


class PreprocessEval(grain.transforms.Map):
  """EvalExamples -> EvalBatch: the training COO preprocessing, mask kept.

  Takes a PreprocessSparse (the same specs and limits as the train step, so
  the eval step compiles with the same buffer sizes).
  """

  def __init__(self, preprocess: PreprocessSparse):
    self._preprocess = preprocess

  def map(self, element: EvalExamples) -> EvalBatch:
    return EvalBatch(self._preprocess.map(element.examples).batch, element.mask)

"""Bulk encoding writes exactly the bytes of encoding each record on its own."""

import struct

import numpy as np
import pytest

from sparsepipe.data import Example
from sparsepipe.data import ExampleSchema
from sparsepipe.data import RecordCodec
from sparsepipe.data import SparseFeatureSchema
from sparsepipe.data import batch_from_examples
from sparsepipe.data import example_at
from sparsepipe.data import slice_batch
from sparsepipe.data.bulk_encode import encode_records


def _schema(weighted: bool, num_dense: int = 2) -> ExampleSchema:
  return ExampleSchema(
    num_dense=num_dense,
    sparse=(
      SparseFeatureSchema("a", 10),
      SparseFeatureSchema("b", 100, weighted=weighted),
      SparseFeatureSchema("c", 5),
      SparseFeatureSchema("d", 7, weighted=weighted),
    ),
  )


def _examples(schema: ExampleSchema, n: int = 11) -> list[Example]:
  """n examples with 0..3 ids per feature: many empty id lists, some all empty."""
  rng = np.random.default_rng(3)
  out = []
  for i in range(n):
    ids, weights = {}, {}
    for f in schema.sparse:
      k = 0 if i % 4 == 2 else int(rng.integers(0, 4))
      ids[f.name] = rng.integers(0, f.vocab_size, k)
      if f.weighted:
        weights[f.name] = rng.uniform(-2, 2, k).astype(np.float32)
    dense = rng.normal(size=schema.num_dense).astype(np.float32)
    out.append(Example(float(i % 3 == 0), dense, ids, weights))
  return out


def _reference(examples: list[Example], schema: ExampleSchema) -> bytes:
  """One record, written field by field from codec.py's layout description."""
  f = schema.sparse
  out = struct.pack("<3sBIII", b"SPR", 1, len(examples), schema.num_dense, len(f))
  out += b"".join(struct.pack("<I", sum(len(e.ids[x.name]) for e in examples)) for x in f)
  out += b"".join(struct.pack("<I", int(x.weighted)) for x in f)
  out += np.float32([e.label for e in examples]).tobytes()
  out += b"".join(np.float32(e.dense).tobytes() for e in examples)
  for x in f:
    out += np.int32([len(e.ids[x.name]) for e in examples]).tobytes()
  for x in f:
    out += b"".join(np.int32(e.ids[x.name]).tobytes() for e in examples)
  for x in f:
    if x.weighted:
      out += b"".join(np.float32(e.weights[x.name]).tobytes() for e in examples)
  return out


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("per_record", [1, 2, 4, 11, 20])
def test_records_equal_one_by_one_encoding(weighted, per_record):
  schema = _schema(weighted)
  codec = RecordCodec(schema)
  examples = _examples(schema)
  batch = batch_from_examples(examples, schema)
  records, counts = encode_records(codec, batch, per_record)
  starts = range(0, len(examples), per_record)
  expected = [_reference(examples[s : s + per_record], schema) for s in starts]
  assert records == expected
  assert records == [
    codec.encode_batch(slice_batch(batch, s, min(s + per_record, len(examples)))) for s in starts
  ]
  assert counts.tolist() == [len(examples[s : s + per_record]) for s in starts]
  if per_record == 1:
    assert records == [codec.encode_example(example_at(batch, i)) for i in range(len(examples))]


def test_records_without_dense_values_or_ids():
  schema = _schema(True, num_dense=0)
  examples = [
    Example(1.0, np.zeros(0, np.float32), {f.name: [] for f in schema.sparse}, {"b": [], "d": []})
  ] * 3
  records, counts = encode_records(RecordCodec(schema), batch_from_examples(examples, schema), 2)
  assert records == [_reference(examples[:2], schema), _reference(examples[2:], schema)]
  assert counts.tolist() == [2, 1]


@pytest.mark.parametrize(
  "mutate, message",
  [
    (
      lambda b: b._replace(
        sparse={**b.sparse, "a": b.sparse["a"]._replace(values=b.sparse["a"].values * 0 + 12)}
      ),
      r"feature 'a': id 12 out of range \[0, 10\)",
    ),
    (
      lambda b: b._replace(sparse={**b.sparse, "d": b.sparse["d"]._replace(weights=None)}),
      r"feature 'd' is weighted in the schema but has no weights",
    ),
    (
      lambda b: b._replace(dense=np.zeros((11, 3), np.float32)),
      r"dense has shape \(11, 3\), expected \(11, 2\)",
    ),
  ],
)
def test_bad_batches_raise_what_encode_batch_raises(mutate, message):
  schema = _schema(True)
  codec = RecordCodec(schema)
  batch = mutate(batch_from_examples(_examples(schema), schema))
  with pytest.raises(ValueError, match=message) as bulk:
    encode_records(codec, batch, 3)
  with pytest.raises(ValueError) as single:
    codec.encode_batch(batch)
  assert str(bulk.value) == str(single.value)


def test_examples_per_record_must_be_positive():
  schema = _schema(False)
  batch = batch_from_examples(_examples(schema), schema)
  with pytest.raises(ValueError, match=r"^examples_per_record=0 must be >= 1$"):
    encode_records(RecordCodec(schema), batch, 0)

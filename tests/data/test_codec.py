"""Schema JSON round-trip and the record codec (single, packed, corrupt)."""

import struct

import numpy as np
import pytest

from sparsepipe.data import CorruptRecordError
from sparsepipe.data import Example
from sparsepipe.data import ExampleBatch
from sparsepipe.data import ExampleSchema
from sparsepipe.data import RaggedBatch
from sparsepipe.data import RecordCodec
from sparsepipe.data import SparseFeatureSchema
from sparsepipe.data import batch_from_examples
from sparsepipe.data import concat_batches
from sparsepipe.data import decode_batch
from sparsepipe.data import decode_example
from sparsepipe.data import encode_batch
from sparsepipe.data import encode_example
from sparsepipe.data import example_at
from sparsepipe.data import make_schema
from sparsepipe.data import slice_batch

SCHEMA = ExampleSchema(
  num_dense=2,
  sparse=(SparseFeatureSchema("a", 10), SparseFeatureSchema("b", 100, weighted=True)),
)


def _examples():
  return [
    Example(
      1.0,
      np.array([0.5, -1.0], np.float32),
      {"a": np.array([1, 2, 3]), "b": np.array([7])},
      {"b": np.array([0.25], np.float32)},
    ),
    Example(
      0.0,
      np.array([2.0, 3.0], np.float32),
      {"a": np.array([], np.int64), "b": np.array([99, 0])},
      {"b": np.array([1.5, 2.5], np.float32)},
    ),
    Example(
      1.0,
      np.array([0.0, 0.0], np.float32),
      {"a": np.array([9]), "b": np.array([], np.int32)},
      {"b": np.array([], np.float32)},
    ),
  ]


def _assert_batch_equal(x: ExampleBatch, y: ExampleBatch):
  np.testing.assert_array_equal(x.labels, y.labels)
  np.testing.assert_array_equal(x.dense, y.dense)
  assert list(x.sparse) == list(y.sparse)
  for name in x.sparse:
    np.testing.assert_array_equal(x.sparse[name].values, y.sparse[name].values)
    np.testing.assert_array_equal(x.sparse[name].row_lengths, y.sparse[name].row_lengths)
    if x.sparse[name].weights is None:
      assert y.sparse[name].weights is None
    else:
      np.testing.assert_array_equal(x.sparse[name].weights, y.sparse[name].weights)


def test_schema_json_round_trip():
  schema = make_schema(
    3, {"x": 5, "y": 7}, weighted=["y"], dense_names=["d0", "d1", "d2"], label_name="click"
  )
  assert ExampleSchema.from_json(schema.to_json()) == schema
  assert schema.feature("y") == SparseFeatureSchema("y", 7, True)
  assert hash(schema) == hash(ExampleSchema.from_json(schema.to_json()))


@pytest.mark.parametrize(
  "kwargs, message",
  [
    (
      dict(num_dense=1, sparse=(SparseFeatureSchema("a", 3), SparseFeatureSchema("a", 4))),
      r"duplicate sparse feature names: \['a'\]",
    ),
    (dict(num_dense=2, sparse=(), dense_names=("x",)), r"dense_names has 1 names but num_dense=2"),
    (dict(num_dense=-1, sparse=()), r"num_dense=-1 must be >= 0"),
  ],
)
def test_schema_rejects(kwargs, message):
  with pytest.raises(ValueError, match=message):
    ExampleSchema(**kwargs)


def test_schema_rejects_vocab_size():
  with pytest.raises(
    ValueError, match=r"sparse feature 'v': vocab_size=2147483648 must be in \[1, 2147483647\]"
  ):
    SparseFeatureSchema("v", 2**31)


def test_single_example_round_trip():
  for example in _examples():
    data = encode_example(example, SCHEMA)
    assert data[:4] == b"SPR\x01"
    back = decode_example(data, SCHEMA)
    assert back.label == example.label
    np.testing.assert_array_equal(back.dense, example.dense)
    for name in ("a", "b"):
      np.testing.assert_array_equal(back.ids[name], example.ids[name])
    np.testing.assert_array_equal(back.weights["b"], example.weights["b"])
    assert set(back.weights) == {"b"}


def test_packed_round_trip_and_layout():
  batch = batch_from_examples(_examples(), SCHEMA)
  data = encode_batch(batch, SCHEMA)
  # header 16 + 8*F, labels 3, dense 6, lengths 2*3, ids 4+3, weights 3 (words).
  assert len(data) == 16 + 16 + 4 * (3 + 6 + 6 + 7 + 3)
  assert struct.unpack_from("<3sBIII", data) == (b"SPR", 1, 3, 2, 2)
  back = decode_batch(data, SCHEMA)
  _assert_batch_equal(back, batch)
  assert back.num_examples == 3
  np.testing.assert_array_equal(back.sparse["a"].values, [1, 2, 3, 9])
  np.testing.assert_array_equal(back.sparse["a"].row_lengths, [3, 0, 1])
  np.testing.assert_array_equal(back.sparse["b"].values, [7, 99, 0])
  np.testing.assert_array_equal(back.sparse["b"].weights, np.float32([0.25, 1.5, 2.5]))
  assert back.sparse["a"].weights is None
  assert back.sparse["a"].values.dtype == np.int32 and back.dense.dtype == np.float32
  second = example_at(back, 1)
  np.testing.assert_array_equal(second.ids["b"], [99, 0])


def test_slice_and_concat_are_inverse():
  batch = batch_from_examples(_examples(), SCHEMA)
  parts = [slice_batch(batch, 0, 1), slice_batch(batch, 1, 1), slice_batch(batch, 1, 3)]
  assert [p.num_examples for p in parts] == [1, 0, 2]
  _assert_batch_equal(concat_batches(parts), batch)


def test_decode_example_of_packed_record_is_an_error():
  data = encode_batch(batch_from_examples(_examples(), SCHEMA), SCHEMA)
  with pytest.raises(ValueError, match=r"record holds 3 examples, not 1: use decode_batch"):
    decode_example(data, SCHEMA)


def _record() -> bytes:
  return encode_batch(batch_from_examples(_examples(), SCHEMA), SCHEMA)


def _patch(data: bytes, offset: int, fmt: str, value) -> bytes:
  b = bytearray(data)
  struct.pack_into(fmt, b, offset, value)
  return bytes(b)


@pytest.mark.parametrize(
  "make, reason",
  [
    (lambda d: d[:10], "record has 10 bytes, fewer than the 16-byte header"),
    (lambda d: d[:20], "truncated header: expected at least 32 bytes, got 20"),
    (lambda d: d[:-4], "expected 132 bytes, got 128 (truncated)"),
    (lambda d: d + b"\0" * 8, "expected 132 bytes, got 140 (8 trailing bytes)"),
    (lambda d: b"XYZ" + d[3:], "bad magic b'XYZ' (expected b'SPR')"),
    (lambda d: _patch(d, 3, "<B", 2), "format version 2 is not supported (expected 1)"),
    (lambda d: _patch(d, 8, "<I", 5), "record has 5 dense values per example, schema has 2"),
    (lambda d: _patch(d, 12, "<I", 3), "record has 3 sparse features, schema has 2"),
    (lambda d: _patch(d, 4, "<I", 0), "record holds 0 examples"),
    (lambda d: _patch(d, 28, "<I", 0), "feature 'b' has flags 0, schema says weighted=True"),
    (lambda d: _patch(d, 24, "<I", 1), "feature 'a' has flags 1, schema says weighted=False"),
    # Row length of example 0 of 'a' (offset 32 + 4*(3+6)) set to 2: sums no longer match.
    (lambda d: _patch(d, 68, "<i", 2), "feature 'a': row lengths sum to 3, header says 4 ids"),
    (lambda d: _patch(d, 68, "<i", -1), "feature 'a': negative row length -1"),
    # First id of 'b' (after 6 lengths and 4 ids of 'a') set to 100 (vocab 100).
    (
      lambda d: _patch(d, 32 + 4 * (3 + 6 + 6 + 4), "<i", 100),
      r"feature 'b': id 100 out of range [0, 100)",
    ),
    (
      lambda d: _patch(d, 32 + 4 * (3 + 6 + 6), "<i", -3),
      r"feature 'a': id -3 out of range [0, 10)",
    ),
  ],
)
def test_corrupt_records_raise_exact_errors(make, reason):
  data = make(_record())
  with pytest.raises(CorruptRecordError) as info:
    decode_batch(data, SCHEMA, path="/data/part-00007.arrayrecord", index=41)
  assert str(info.value) == f"corrupt record 41 in '/data/part-00007.arrayrecord': {reason}"
  assert info.value.reason == reason
  assert info.value.index == 41 and info.value.path == "/data/part-00007.arrayrecord"
  assert isinstance(info.value, ValueError)


def test_corrupt_record_without_location():
  with pytest.raises(CorruptRecordError, match=r"^corrupt record: record has 3 bytes"):
    decode_batch(b"abc", SCHEMA)


@pytest.mark.parametrize(
  "mutate, message",
  [
    (
      lambda b: b._replace(
        sparse={**b.sparse, "a": b.sparse["a"]._replace(values=np.array([1, 2, 3, 10]))}
      ),
      r"feature 'a': id 10 out of range \[0, 10\)",
    ),
    (
      lambda b: b._replace(
        sparse={**b.sparse, "a": b.sparse["a"]._replace(row_lengths=np.array([3, 0, 2]))}
      ),
      r"feature 'a': row lengths sum to 5 but there are 4 ids",
    ),
    (
      lambda b: b._replace(sparse={**b.sparse, "b": b.sparse["b"]._replace(weights=None)}),
      r"feature 'b' is weighted in the schema but has no weights",
    ),
    (
      lambda b: b._replace(
        sparse={**b.sparse, "a": b.sparse["a"]._replace(weights=np.ones(4, np.float32))}
      ),
      r"feature 'a' is unweighted in the schema but has weights",
    ),
    (
      lambda b: b._replace(sparse={"a": b.sparse["a"]}),
      r"sparse features \['a'\] do not match the schema's \['a', 'b'\]",
    ),
    (
      lambda b: b._replace(dense=np.zeros((3, 1), np.float32)),
      r"dense has shape \(3, 1\), expected \(3, 2\)",
    ),
    (
      lambda b: b._replace(
        sparse={**b.sparse, "a": b.sparse["a"]._replace(values=np.array([1.0, 2, 3, 9]))}
      ),
      r"feature 'a': ids have dtype float64, not integer",
    ),
  ],
)
def test_encode_rejects_bad_batches(mutate, message):
  batch = mutate(batch_from_examples(_examples(), SCHEMA))
  with pytest.raises(ValueError, match=message):
    RecordCodec(SCHEMA).encode_batch(batch)


def test_batch_from_examples_rejects_bad_examples():
  bad = Example(
    0.0,
    np.zeros(2, np.float32),
    {"a": np.array([1]), "b": np.array([2, 3])},
    {"b": np.array([1.0], np.float32)},
  )
  with pytest.raises(ValueError, match=r"example 0: feature 'b' has 2 ids but 1 weights"):
    batch_from_examples([bad], SCHEMA)
  extra = Example(
    0.0,
    np.zeros(2, np.float32),
    {"a": np.array([1]), "b": np.array([2]), "c": np.array([1])},
    {"b": np.array([1.0], np.float32)},
  )
  with pytest.raises(ValueError, match=r"examples hold sparse features not in the schema: \['c'\]"):
    batch_from_examples([extra], SCHEMA)


def test_decoded_ragged_batch_is_columnar():
  back = decode_batch(_record(), SCHEMA)
  assert isinstance(back.sparse["a"], RaggedBatch)
  np.testing.assert_array_equal(back.sparse["a"].row_splits(), [0, 3, 3, 4])

"""Bulk decoding of many records equals decoding them one by one, errors included."""

import re
import struct

import numpy as np
import pytest

from sparsepipe.data import CorruptRecordError
from sparsepipe.data import RecordCodec
from sparsepipe.data import SyntheticFeature
from sparsepipe.data import concat_batches
from sparsepipe.data import decode_records
from sparsepipe.data import bulk_decode
from sparsepipe.data import slice_batch
from sparsepipe.data.synthetic.generate import generate_batches
from sparsepipe.data.synthetic.generate import synthetic_schema

FEATURES = (
  SyntheticFeature("a", 30, 0, 3),
  SyntheticFeature("b", 9, 1, 2, weighted=True),
  SyntheticFeature("c", 5, 0, 0),  # always empty
)
SCHEMA = synthetic_schema(FEATURES, 2)
CODEC = RecordCodec(SCHEMA)


def _records(sizes):
  """Records holding `sizes[i]` consecutive examples of one synthetic stream."""
  total = sum(sizes)
  # Seed 7: example 6 (record 3 of the error cases) has ids of 'a' for _bad_id to damage.
  stream = concat_batches(list(generate_batches(FEATURES, 2, total, seed=7)))
  out, start = [], 0
  for size in sizes:
    out.append(CODEC.encode_batch(slice_batch(stream, start, start + size)))
    start += size
  return out, stream


def _assert_same(x, y):
  np.testing.assert_array_equal(x.labels, y.labels)
  np.testing.assert_array_equal(x.dense, y.dense)
  assert list(x.sparse) == list(y.sparse)
  for name in y.sparse:
    for a, b in zip(x.sparse[name], y.sparse[name]):
      if b is None:
        assert a is None
      else:
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype


# The last case has records over 8 KiB: decoded one by one, then concatenated.
@pytest.mark.parametrize("sizes", [[1] * 9, [3, 1, 4, 1, 5], [1200, 900]])
def test_bulk_equals_one_by_one(sizes):
  records, stream = _records(sizes)
  out = decode_records(CODEC, records)
  _assert_same(out.examples, stream)
  np.testing.assert_array_equal(out.examples_per_record, sizes)
  assert out.errors == []


def test_bulk_decodes_examples_without_dense_features():
  """Ratings data has no dense columns: dense is [n, 0], not a reshape error."""
  schema = synthetic_schema(FEATURES, 0)
  codec = RecordCodec(schema)
  stream = concat_batches(list(generate_batches(FEATURES, 0, 7, seed=3)))
  records = [codec.encode_batch(slice_batch(stream, i, i + 1)) for i in range(7)]
  out = decode_records(codec, records)
  assert out.examples.dense.shape == (7, 0)
  _assert_same(out.examples, stream)


def _truncate(r):
  return r[:-4]


def _bad_id(r):  # first id of 'a' := 30 (vocab 30)
  b = bytearray(r)
  n = struct.unpack_from("<I", r, 4)[0]
  ids = 16 + 8 * 3 + 4 * (n + 2 * n + 3 * n)
  struct.pack_into("<i", b, ids, 30)
  return bytes(b)


def _bad_lengths(r):  # row length of example 0 of 'a' += 1
  b = bytearray(r)
  n = struct.unpack_from("<I", r, 4)[0]
  pos = 16 + 8 * 3 + 4 * (n + 2 * n)
  struct.pack_into("<i", b, pos, struct.unpack_from("<i", r, pos)[0] + 1)
  return bytes(b)


@pytest.mark.parametrize(
  "damage, reason",
  [
    (_truncate, r"expected \d+ bytes, got \d+ \(truncated\)"),
    (lambda r: r[:6], r"record has 6 bytes, fewer than the 16-byte header"),
    (lambda r: r[:-2], r"expected \d+ bytes, got \d+ \(truncated\)"),
    (_bad_lengths, r"feature 'a': row lengths sum to \d+, header says \d+ ids"),
    (_bad_id, r"feature 'a': id 30 out of range \[0, 30\)"),
  ],
)
def test_bulk_errors_equal_single_record_errors(damage, reason):
  records, stream = _records([2, 1, 3, 1, 2])
  records[3] = damage(records[3])
  single = None
  try:
    CODEC.decode_batch(records[3], path="f", index=13)
  except CorruptRecordError as e:
    single = e
  assert single is not None and re.fullmatch(reason, single.reason), single.reason
  where = lambda i: ("f", 10 + i)  # pylint: disable=unnecessary-lambda-assignment
  with pytest.raises(CorruptRecordError) as info:
    decode_records(CODEC, records, where=where)
  assert str(info.value) == str(single)
  out = decode_records(CODEC, records, where=where, skip_corrupt=True)
  np.testing.assert_array_equal(out.examples_per_record, [2, 1, 3, 0, 2])
  assert [str(e) for e in out.errors] == [str(single)]
  keep = concat_batches([slice_batch(stream, 0, 6), slice_batch(stream, 7, 9)])
  _assert_same(out.examples, keep)


def test_bulk_all_corrupt():
  nothing = decode_records(CODEC, [b"xx", b"yyyy"], skip_corrupt=True)
  assert nothing.examples is None and list(nothing.examples_per_record) == [0, 0]
  assert [e.reason for e in nothing.errors] == [
    "record has 2 bytes, fewer than the 16-byte header",
    "record has 4 bytes, fewer than the 16-byte header",
  ]


def test_bulk_raises_the_first_error_in_record_order():
  records, _ = _records([1, 2, 1, 2])
  records[1] = _bad_lengths(records[1])  # found only by the content checks
  records[3] = records[3][:9]  # found by the size check
  with pytest.raises(
    CorruptRecordError, match=r"^corrupt record 1: feature 'a': row lengths sum to"
  ):
    decode_records(CODEC, records, where=lambda i: (None, i))
  out = decode_records(CODEC, records, where=lambda i: (None, i), skip_corrupt=True)
  assert [e.index for e in out.errors] == [1, 3]
  np.testing.assert_array_equal(out.examples_per_record, [1, 0, 1, 0])


def test_segments_are_the_concatenated_ranges():
  starts = np.array([5, 0, 9, 2, 40, 1], np.int64)
  lengths = np.array([3, 0, 2, 4, 0, 1], np.int64)
  got = bulk_decode._segments(starts, lengths)  # pylint: disable=protected-access
  assert got.tolist() == [5, 6, 7, 9, 10, 2, 3, 4, 5, 1]
  assert got.dtype == np.int32
  assert bulk_decode._segments(starts, lengths * 0).tolist() == []  # pylint: disable=protected-access
  # Indices past int32 (a batch of more than 8 GiB of words) stay exact in int64.
  big = bulk_decode._segments(np.array([2**31 - 2, 3]), np.array([3, 2]))  # pylint: disable=protected-access
  assert big.tolist() == [2**31 - 2, 2**31 - 1, 2**31, 3, 4] and big.dtype == np.int64

"""Decode many records into one columnar batch with a few vectorised passes.

Decoding records one at a time costs Python work per record and per
feature, then a concatenation per feature; for single-example records that
dominates the input pipeline. Here all records are joined into one int32
word array, their headers read as one [R, 4 + 2F] matrix, every check of
`RecordCodec.decode_batch` done on whole columns, and labels, dense values,
row lengths, ids and weights gathered feature-major with one fancy index
each. Any record that fails a check is decoded alone by `decode_batch`, so
the error (or the skip) is exactly the one-record behaviour. Large records
(many examples each) are decoded one by one and concatenated instead.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import numpy as np

from sparsepipe.data.codec import FORMAT_VERSION, MAGIC, CorruptRecordError, RecordCodec
from sparsepipe.data.example import ExampleBatch, concat_batches
from sparsepipe.data.ragged import RaggedBatch

_MAGIC_WORD = int.from_bytes(MAGIC + bytes([FORMAT_VERSION]), "little")
_NO_WHERE = lambda i: (None, None)  # pylint: disable=unnecessary-lambda-assignment
# From this mean record size on, per-record views + one concatenation beat
# the fancy-index gathers (long contiguous runs copy faster with memcpy).
_LARGE_RECORD_BYTES = 8192


class DecodedRecords(NamedTuple):
  """Records decoded together.

  Attributes:
    examples: the examples of all good records, in record order (None if
      there are none).
    examples_per_record: [num_records] examples each record gave (0 for a
      skipped corrupt record).
    errors: the CorruptRecordErrors of the skipped records.
  """

  examples: ExampleBatch | None
  examples_per_record: np.ndarray
  errors: list[CorruptRecordError]


def _segments(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
  """Indices of the concatenated ranges [starts[i], starts[i] + lengths[i]).

  One cumulative sum of steps: +1 inside a range, a jump at each range's
  first index (from the last index of the range before). In int32 where the
  indices fit: half the memory traffic of int64, the hot loop of decoding
  small records.
  """
  total = int(lengths.sum())
  if not total:
    return np.zeros(0, np.int64)
  used = lengths > 0
  s, n = starts[used], lengths[used]
  dtype = np.int32 if int((s + n).max()) < 2**31 else np.int64
  steps = np.ones(total, dtype)
  steps[(np.cumsum(n) - n)[1:]] = s[1:] - (s[:-1] + n[:-1] - 1)
  steps[0] = s[0]
  return np.cumsum(steps, dtype=dtype)


def decode_records(
  codec: RecordCodec,
  records: Sequence[bytes],
  *,
  where: Callable[[int], tuple[str | None, int | None]] | None = None,
  skip_corrupt: bool = False,
) -> DecodedRecords:
  """Decodes `records` (each holding >= 1 examples) into one batch.

  Args:
    codec: the schema's codec.
    records: record bytes.
    where: i -> (file, index in file) of records[i], for error messages.
    skip_corrupt: skip corrupt records (reported in `errors`) instead of raising.

  Raises:
    CorruptRecordError: the first corrupt record, unless skip_corrupt.
  """
  where = where or _NO_WHERE
  if records and sum(map(len, records)) >= _LARGE_RECORD_BYTES * len(records):
    return _decode_one_by_one(codec, records, where, skip_corrupt)
  counts = np.zeros(len(records), np.int64)
  bad: set[int] = set()
  errors: dict[int, CorruptRecordError] = {}
  while True:
    good = [i for i in range(len(records)) if i not in bad]
    if not good:
      return DecodedRecords(None, counts, [errors[i] for i in sorted(errors)])
    examples, suspects = _try_decode(codec, [records[i] for i in good])
    if examples is not None:
      counts[good] = examples[1]
      return DecodedRecords(examples[0], counts, [errors[i] for i in sorted(errors)])
    if not skip_corrupt:  # raise exactly the first error, as one by one would
      return _decode_one_by_one(codec, records, where, skip_corrupt=False)
    for j in suspects:
      i = good[j]
      bad.add(i)
      path, index = where(i)
      try:
        codec.decode_batch(records[i], path=path, index=index)
      except CorruptRecordError as e:
        errors[i] = e
        continue
      raise AssertionError(f"record {i} failed a vectorised check but decodes alone")


def _decode_one_by_one(codec, records, where, skip_corrupt) -> DecodedRecords:
  batches, errors = [], []
  counts = np.zeros(len(records), np.int64)
  for i, record in enumerate(records):
    path, index = where(i)
    try:
      batch = codec.decode_batch(record, path=path, index=index)
    except CorruptRecordError as e:
      if not skip_corrupt:
        raise
      errors.append(e)
      continue
    batches.append(batch)
    counts[i] = batch.num_examples
  return DecodedRecords(concat_batches(batches) if batches else None, counts, errors)


def _try_decode(codec: RecordCodec, records: Sequence[bytes]):
  """((batch, examples per record), []) or (None, positions of suspect records)."""
  schema = codec.schema
  f = len(schema.sparse)
  d = schema.num_dense
  header_words = 4 + 2 * f
  sizes = np.fromiter(map(len, records), np.int64, len(records))
  short = np.flatnonzero((sizes % 4 != 0) | (sizes < 4 * header_words))
  if short.size:
    return None, short.tolist()
  words = np.frombuffer(b"".join(records), "<i4")
  starts = np.concatenate([[0], np.cumsum(sizes // 4)[:-1]])
  head = words[starts[:, None] + np.arange(header_words)]
  b = head[:, 1].astype(np.int64)
  n = head[:, 4 : 4 + f].astype(np.int64)  # [R, F] ids per record and feature
  weighted = codec._weighted  # pylint: disable=protected-access
  nw = n * weighted[None, :]
  expected = 4 * (header_words + b + b * d + f * b + n.sum(1) + nw.sum(1))
  ok = (
    (head[:, 0] == np.int32(_MAGIC_WORD))
    & (head[:, 2] == d)
    & (head[:, 3] == f)
    & (b >= 1)
    & (expected == sizes)
  )
  if f:
    ok &= (head[:, 4 + f :] == codec._flags.astype(np.int32)).all(axis=1)  # pylint: disable=protected-access
  if not ok.all():
    return None, np.flatnonzero(~ok).tolist()

  payload = starts + header_words
  labels = words[_segments(payload, b)].view("<f4")
  dense = words[_segments(payload + b, b * d)].view("<f4").reshape(int(b.sum()), d)
  # Row lengths, feature-major: feature i of record r at payload + b + b*d + i*b.
  len_starts = (payload + b + b * d)[None, :] + np.arange(f)[:, None] * b[None, :]
  lengths = words[_segments(len_starts.reshape(-1), np.tile(b, f))]
  ids_base = payload + b + b * d + f * b
  before = np.cumsum(n, axis=1) - n  # ids of earlier features in the same record
  ids = words[_segments((ids_base[:, None] + before).T.reshape(-1), n.T.reshape(-1))]
  w_base = ids_base + n.sum(1)
  w_before = np.cumsum(nw, axis=1) - nw
  weights = words[_segments((w_base[:, None] + w_before).T.reshape(-1), nw.T.reshape(-1))]
  suspects = _content_bad(codec, lengths, ids, n, b)
  if suspects:
    return None, suspects

  total_b = int(b.sum())
  per_feature = n.sum(0)
  id_ends = np.cumsum(per_feature)
  w_ends = np.cumsum(per_feature * weighted)
  weights = weights.view("<f4")
  sparse = {}
  for i, name in enumerate(schema.feature_names):
    vals = ids[id_ends[i] - per_feature[i] : id_ends[i]]
    w = weights[w_ends[i] - per_feature[i] : w_ends[i]] if weighted[i] else None
    sparse[name] = RaggedBatch(vals, lengths[i * total_b : (i + 1) * total_b], w)
  return (ExampleBatch(labels, dense, sparse), b), []


def _content_bad(codec, lengths, ids, n, b) -> list[int]:
  """Records with negative or mismatched row lengths or out-of-range ids."""
  r, f = n.shape
  if f == 0:
    return []
  bad = np.zeros(r, bool)
  owner = np.tile(np.arange(r), f)  # record of each (feature, record) segment
  seg_starts = np.concatenate([[0], np.cumsum(np.tile(b, f))[:-1]])
  if lengths.size and lengths.min() < 0:
    bad[owner[np.minimum.reduceat(lengths, seg_starts) < 0]] = True
  sums = np.add.reduceat(lengths.astype(np.int64), seg_starts)
  bad[owner[sums != n.T.reshape(-1)]] = True
  per_feature = n.sum(0)
  nonempty = per_feature > 0
  if nonempty.any():
    fstarts = (np.cumsum(per_feature) - per_feature)[nonempty]
    vocab = codec._vocab[nonempty]  # pylint: disable=protected-access
    if (np.minimum.reduceat(ids, fstarts) < 0).any() or (
      np.maximum.reduceat(ids, fstarts) >= vocab
    ).any():
      out = (ids < 0) | (ids >= np.repeat(codec._vocab, per_feature))  # pylint: disable=protected-access
      seg = np.repeat(np.arange(f * r), n.T.reshape(-1))
      bad[owner[np.unique(seg[out])]] = True
  return np.flatnonzero(bad).tolist()

"""Record codec: bytes <-> columnar examples, a fixed little-endian layout.

One record holds B >= 1 examples (B = 1 is a "single example" record). Every
field is a 4-byte word, so the whole payload is decoded with one
`np.frombuffer` and views into it (no pickle, no per-example objects).

Layout, format version 1 (all little-endian):

    bytes 0-2   magic b"SPR"
    byte  3     format version (1)
    uint32      B  examples in the record
    uint32      D  dense values per example (must equal schema.num_dense)
    uint32      F  sparse features (must equal len(schema.sparse))
    uint32[F]   n_f: ids of feature f in the record
    uint32[F]   flags_f: bit 0 = feature f carries weights (must match schema)
    float32[B]      labels
    float32[B*D]    dense, row-major [B, D]
    int32[F*B]      row lengths, feature-major [F, B]
    int32[sum n_f]  ids, feature after feature
    float32[sum of n_f over weighted features]  weights, same order

Decoding checks every size against the header, the header against the
schema, row lengths against n_f, and ids against [0, vocab_size): a damaged
record raises `CorruptRecordError` naming the file, the record index and
what was wrong, never a misread.
"""

from __future__ import annotations

import functools
import struct
from typing import NamedTuple

import numpy as np

from sparsepipe.data.example import Example, ExampleBatch, batch_from_examples, example_at
from sparsepipe.data.ragged import RaggedBatch
from sparsepipe.data.schema import ExampleSchema, SparseFeatureSchema

MAGIC = b"SPR"
FORMAT_VERSION = 1
_HEAD = struct.Struct("<3sBIII")  # magic, version, B, D, F
_FLAG_WEIGHTED = 1


class CorruptRecordError(ValueError):
  """A record that does not decode: truncated, foreign or damaged bytes.

  Attributes:
    reason: what was wrong (with expected and actual values).
    path: the shard file, if known.
    index: the record index inside that file, if known.
  """

  def __init__(self, reason: str, *, path: str | None = None, index: int | None = None):
    self.reason = reason
    self.path = path
    self.index = index
    where = "corrupt record"
    if index is not None:
      where += f" {index}"
    if path is not None:
      where += f" in '{path}'"
    super().__init__(f"{where}: {reason}")

  def __reduce__(self):  # Survives the trip from a Grain worker process.
    return (_rebuild_error, (self.reason, self.path, self.index))


def _rebuild_error(reason, path, index):
  return CorruptRecordError(reason, path=path, index=index)


class UnreadableRecord(bytes):
  """Stands for a record the storage layer could not read (see data.source).

  Empty bytes carrying why (e.g. the ArrayRecord chunk holding it is
  damaged, or the shard is truncated), so decoding it raises a
  CorruptRecordError with that reason, or skip_corrupt skips and counts it,
  like any other corrupt record.
  """

  reason: str
  path: str | None
  index: int | None

  def __new__(cls, reason: str, path: str | None = None, index: int | None = None):
    record = super().__new__(cls, b"")
    record.reason, record.path, record.index = reason, path, index
    return record

  def __reduce__(self):
    return (UnreadableRecord, (self.reason, self.path, self.index))


class RecordColumns(NamedTuple):
  """Checked examples as a record stores them: little-endian, schema order.

  Attributes:
    labels: [B] float32.
    dense: [B, D] float32.
    lengths: per sparse feature, [B] int32 row lengths.
    ids: per sparse feature, its int32 ids.
    weights: per weighted feature (schema order), its float32 weights.
  """

  labels: np.ndarray
  dense: np.ndarray
  lengths: list[np.ndarray]
  ids: list[np.ndarray]
  weights: list[np.ndarray]


class RecordCodec:
  """Encoder/decoder for one schema (precomputes the schema's arrays)."""

  def __init__(self, schema: ExampleSchema):
    self.schema = schema
    self._names = schema.feature_names
    self._vocab = np.asarray([f.vocab_size for f in schema.sparse], np.int64)
    self._weighted = np.asarray([f.weighted for f in schema.sparse], bool)
    self._flags = self._weighted.astype(np.uint32) * _FLAG_WEIGHTED

  # -------------------------------------------------------------- encoding

  def columns(self, batch: ExampleBatch) -> RecordColumns:
    """Checks B >= 1 columnar examples against the schema; their columns as stored.

    The one place encoding validates (encode_batch, and bulk_encode for many
    records at once), so both refuse the same input with the same message.
    """
    schema = self.schema
    labels = np.asarray(batch.labels)
    b = labels.shape[0] if labels.ndim == 1 else -1
    if b < 1:
      raise ValueError(f"labels must have shape [B] with B >= 1, got {labels.shape}")
    dense = np.asarray(batch.dense)
    if dense.shape != (b, schema.num_dense):
      raise ValueError(f"dense has shape {dense.shape}, expected ({b}, {schema.num_dense})")
    if set(batch.sparse) != set(self._names):
      raise ValueError(
        f"sparse features {sorted(batch.sparse)} do not match the schema's {sorted(self._names)}"
      )
    lengths, ids, weights = [], [], []
    for f in schema.sparse:
      rl, vals, w = self._feature_columns(f, batch.sparse[f.name], b)
      lengths.append(rl)
      ids.append(vals)
      if w is not None:
        weights.append(w)
    return RecordColumns(labels.astype("<f4"), dense.astype("<f4"), lengths, ids, weights)

  @staticmethod
  def _feature_columns(f: SparseFeatureSchema, rb: RaggedBatch, b: int):
    """(row lengths, ids, weights or None) of one feature, checked and little-endian."""
    rl = np.asarray(rb.row_lengths)
    vals = np.asarray(rb.values).reshape(-1)
    if rl.shape != (b,):
      raise ValueError(f"feature '{f.name}': row_lengths has shape {rl.shape}, expected ({b},)")
    if vals.size and vals.dtype.kind not in "iu":
      raise ValueError(f"feature '{f.name}': ids have dtype {vals.dtype}, not integer")
    if b and rl.min() < 0:
      raise ValueError(f"feature '{f.name}': negative row length {int(rl.min())}")
    if int(rl.sum()) != vals.size:
      raise ValueError(
        f"feature '{f.name}': row lengths sum to {int(rl.sum())} but there are {vals.size} ids"
      )
    if vals.size:
      lo, hi = int(vals.min()), int(vals.max())
      if lo < 0 or hi >= f.vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(f"feature '{f.name}': id {bad} out of range [0, {f.vocab_size})")
    w = None
    if f.weighted:
      if rb.weights is None:
        raise ValueError(f"feature '{f.name}' is weighted in the schema but has no weights")
      w = np.asarray(rb.weights, np.float32).reshape(-1)
      if w.size != vals.size:
        raise ValueError(f"feature '{f.name}': {vals.size} ids but {w.size} weights")
      w = w.astype("<f4")
    elif rb.weights is not None:
      raise ValueError(f"feature '{f.name}' is unweighted in the schema but has weights")
    return rl.astype("<i4"), vals.astype("<i4"), w

  def encode_batch(self, batch: ExampleBatch) -> bytes:
    """Encodes B >= 1 columnar examples into one record."""
    cols = self.columns(batch)
    b = cols.labels.shape[0]
    head = _HEAD.pack(MAGIC, FORMAT_VERSION, b, self.schema.num_dense, len(self._names))
    parts = [
      head,
      np.asarray([x.size for x in cols.ids], "<u4").tobytes(),
      self._flags.astype("<u4").tobytes(),
      cols.labels.tobytes(),
      cols.dense.tobytes(),
    ]
    parts += [x.tobytes() for x in cols.lengths]
    parts += [x.tobytes() for x in cols.ids]
    parts += [x.tobytes() for x in cols.weights]
    return b"".join(parts)

  def encode_example(self, example: Example) -> bytes:
    """Encodes one example as a record with B = 1."""
    return self.encode_batch(batch_from_examples([example], self.schema))

  # -------------------------------------------------------------- decoding

  def _check_ids(self, lengths: np.ndarray, counts: np.ndarray, ids: np.ndarray, fail) -> None:
    """Row lengths add up to the header's counts; every id is inside its vocabulary."""
    if len(self._names):
      if lengths.min() < 0:
        i = int(np.argmax(lengths.min(axis=1) < 0))
        fail(f"feature '{self._names[i]}': negative row length {int(lengths[i].min())}")
      sums = lengths.sum(axis=1, dtype=np.int64)
      if (sums != counts).any():
        i = int(np.argmax(sums != counts))
        fail(
          f"feature '{self._names[i]}': row lengths sum to {int(sums[i])}, header"
          f" says {int(counts[i])} ids"
        )
    if len(ids):
      limit = np.repeat(self._vocab, counts)
      bad = (ids < 0) | (ids >= limit)
      if bad.any():
        j = int(np.argmax(bad))
        i = int(np.searchsorted(np.cumsum(counts), j, side="right"))
        fail(
          f"feature '{self._names[i]}': id {int(ids[j])} out of range [0, {int(self._vocab[i])})"
        )

  def decode_batch(
    self, data: bytes, *, path: str | None = None, index: int | None = None
  ) -> ExampleBatch:
    """Decodes a record into columnar examples (read-only views of `data`).

    Args:
      data: the record bytes.
      path: shard file, used in error messages.
      index: record index in that file, used in error messages.

    Raises:
      CorruptRecordError: the bytes do not form a valid record of this schema.
    """

    def fail(reason: str):
      raise CorruptRecordError(reason, path=path, index=index)

    if isinstance(data, UnreadableRecord):
      raise CorruptRecordError(
        data.reason, path=path or data.path, index=data.index if index is None else index
      )
    schema = self.schema
    size = len(data)
    if size < _HEAD.size:
      fail(f"record has {size} bytes, fewer than the {_HEAD.size}-byte header")
    magic, version, b, d, f = _HEAD.unpack_from(data, 0)
    if magic != MAGIC:
      fail(f"bad magic {magic!r} (expected {MAGIC!r})")
    if version != FORMAT_VERSION:
      fail(f"format version {version} is not supported (expected {FORMAT_VERSION})")
    if d != schema.num_dense:
      fail(f"record has {d} dense values per example, schema has {schema.num_dense}")
    if f != len(self._names):
      fail(f"record has {f} sparse features, schema has {len(self._names)}")
    if b == 0:
      fail("record holds 0 examples")
    header = _HEAD.size + 8 * f
    if size < header:
      fail(f"truncated header: expected at least {header} bytes, got {size}")
    meta = np.frombuffer(data, "<u4", count=2 * f, offset=_HEAD.size)
    counts = meta[:f].astype(np.int64)
    flags = meta[f:]
    if f and (flags != self._flags).any():
      i = int(np.argmax(flags != self._flags))
      fail(
        f"feature '{self._names[i]}' has flags {int(flags[i])}, schema says"
        f" weighted={bool(self._weighted[i])}"
      )
    n_total = int(counts.sum())
    n_weighted = int(counts[self._weighted].sum())
    expected = header + 4 * (b + b * d + f * b + n_total + n_weighted)
    if size != expected:
      what = "truncated" if size < expected else f"{size - expected} trailing bytes"
      fail(f"expected {expected} bytes, got {size} ({what})")
    words = np.frombuffer(data, "<i4", offset=header)
    labels = words[:b].view("<f4")
    pos = b
    dense = words[pos : pos + b * d].view("<f4").reshape(b, d)
    pos += b * d
    lengths = words[pos : pos + f * b].reshape(f, b)
    pos += f * b
    ids = words[pos : pos + n_total]
    pos += n_total
    weights = words[pos:].view("<f4")
    self._check_ids(lengths, counts, ids, fail)
    sparse = {}
    start = wstart = 0
    for i, name in enumerate(self._names):
      n = int(counts[i])
      w = None
      if self._weighted[i]:
        w = weights[wstart : wstart + n]
        wstart += n
      sparse[name] = RaggedBatch(ids[start : start + n], lengths[i], w)
      start += n
    return ExampleBatch(labels, dense, sparse)

  def decode_example(
    self, data: bytes, *, path: str | None = None, index: int | None = None
  ) -> Example:
    """Decodes a record that holds exactly one example."""
    batch = self.decode_batch(data, path=path, index=index)
    if batch.num_examples != 1:
      raise ValueError(f"record holds {batch.num_examples} examples, not 1: use decode_batch")
    return example_at(batch, 0)


@functools.lru_cache(maxsize=64)
def codec_for(schema: ExampleSchema) -> RecordCodec:
  """A cached codec per (hashable, frozen) schema."""
  return RecordCodec(schema)


def encode_batch(batch: ExampleBatch, schema: ExampleSchema) -> bytes:
  return codec_for(schema).encode_batch(batch)


def decode_batch(
  data: bytes, schema: ExampleSchema, *, path: str | None = None, index: int | None = None
) -> ExampleBatch:
  return codec_for(schema).decode_batch(data, path=path, index=index)


def encode_example(example: Example, schema: ExampleSchema) -> bytes:
  return codec_for(schema).encode_example(example)


def decode_example(
  data: bytes, schema: ExampleSchema, *, path: str | None = None, index: int | None = None
) -> Example:
  return codec_for(schema).decode_example(data, path=path, index=index)

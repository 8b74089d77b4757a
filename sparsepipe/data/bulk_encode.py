"""Encode many records at once: the same bytes as `RecordCodec.encode_batch` per record.

Encoding record by record costs Python work per record and per feature
(slicing, checks, a dozen small `tobytes`); for single-example records that
was almost all of a converter's time. Here the examples are checked once
(`RecordCodec.columns`), the word offset of every field of every record is
computed from the row lengths, and each column lands in one array of 32-bit
words for all the records with one scatter (per feature for the ragged
columns). The records are then cut out of its bytes. The layout is
codec.py's; tests check the bytes equal encode_batch's, and a written
dataset's bytes equal what the one-record-at-a-time writer wrote.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from sparsepipe.data.codec import FORMAT_VERSION, MAGIC, RecordCodec
from sparsepipe.data.example import ExampleBatch

_MAGIC_WORD = int.from_bytes(MAGIC + bytes([FORMAT_VERSION]), "little")


def _exclusive_cumsum(x: np.ndarray, axis: int = 0) -> np.ndarray:
  return np.cumsum(x, axis=axis) - x


def encode_records(
  codec: RecordCodec, batch: ExampleBatch, examples_per_record: int
) -> tuple[list[bytes], np.ndarray]:
  """Encodes `batch` as consecutive records of `examples_per_record` examples.

  Args:
    codec: the schema's codec.
    batch: B >= 1 columnar examples.
    examples_per_record: R >= 1; the last record holds the rest (B mod R) if
      R does not divide B.

  Returns:
    (records, examples in each record): record k is exactly
    `codec.encode_batch(slice_batch(batch, k * R, min((k + 1) * R, B)))`.

  Raises:
    ValueError: what encode_batch raises for `batch`.
  """
  if examples_per_record < 1:
    raise ValueError(f"examples_per_record={examples_per_record} must be >= 1")
  cols = codec.columns(batch)
  r = int(examples_per_record)
  n = cols.labels.shape[0]
  d = codec.schema.num_dense
  f = len(cols.ids)
  starts = np.arange(0, n, r)
  b = np.diff(np.append(starts, n))  # [K] examples per record
  # [K, F] ids of each feature in each record.
  counts = np.zeros((len(b), f), np.int64)
  for i, lengths in enumerate(cols.lengths):
    counts[:, i] = np.add.reduceat(lengths.astype(np.int64), starts)
  weighted = codec._weighted  # pylint: disable=protected-access
  wcounts = counts * weighted[None, :]
  header = 4 + 2 * f
  ids_at = header + b * (1 + d + f)  # word offset of the ids within a record
  sizes = ids_at + counts.sum(1) + wcounts.sum(1)
  rec_at = _exclusive_cumsum(sizes)
  words = np.empty(int(sizes.sum()), "<u4")

  head = np.empty((len(b), header), np.int64)
  head[:, :4] = np.array([_MAGIC_WORD, 0, d, f])
  head[:, 1] = b
  head[:, 4 : 4 + f] = counts
  head[:, 4 + f :] = codec._flags  # pylint: disable=protected-access
  words[(rec_at[:, None] + np.arange(header)).reshape(-1)] = head.reshape(-1)

  # Example e is example e - starts[k] of record k = e // r.
  rec = np.arange(n) // r
  pos = np.arange(n) - starts[rec]
  payload = rec_at[rec] + header
  words[payload + pos] = cols.labels.view("<u4")
  dense_at = payload + b[rec] + pos * d
  words[(dense_at[:, None] + np.arange(d)).reshape(-1)] = cols.dense.view("<u4").reshape(-1)
  lengths_at = payload + b[rec] * (1 + d) + pos
  for i, lengths in enumerate(cols.lengths):
    words[lengths_at + i * b[rec]] = lengths.view("<u4")

  # Feature i's ids of record k follow the ids of features < i in that record.
  _scatter_runs(words, rec_at + ids_at, counts, cols.ids, range(f))
  w_at = rec_at + ids_at + counts.sum(1)
  _scatter_runs(words, w_at, wcounts, cols.weights, np.flatnonzero(weighted))

  data = words.tobytes()
  bounds = (4 * np.append(rec_at, len(words))).tolist()
  return [data[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])], b


def _scatter_runs(
  words: np.ndarray,
  base: np.ndarray,
  counts: np.ndarray,
  columns: list[np.ndarray],
  features: Sequence[int],
) -> None:
  """Puts record k's run of columns[j] (feature features[j]) at base[k] + the
  values of the features before it in record k (counts[k, :features[j]])."""
  before = _exclusive_cumsum(counts, axis=1)
  for column, i in zip(columns, features):
    n = counts[:, i]
    # Record k's run starts at column offset `first[k]`, lands at base + before.
    first = _exclusive_cumsum(n)
    shift = np.repeat(base + before[:, i] - first, n)
    words[shift + np.arange(len(column))] = column.view("<u4")

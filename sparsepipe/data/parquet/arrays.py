"""One record batch's Arrow columns -> the numpy parts of an ExampleBatch, vectorised.

Nothing here loops over rows in Python: list columns are taken apart into
their flattened values and per-row lengths, categories are hashed once per
distinct value of the batch (Arrow's dictionary encoding) and only where
the previous batch did not have them (BatchHasher), and checks are array
comparisons. A bad value raises InputFormatError naming the file,
the row (counted from 0 in the file, as pyarrow and pandas index rows),
the column and the value; the first bad row is the one named.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparsepipe.data.convert.text_input import FLOAT32_OVERFLOW, InputFormatError
from sparsepipe.data.hashing import CategoryHasher
from sparsepipe.data.ragged import RaggedBatch


class Rows(NamedTuple):
  """Where a record batch lies: its file and the file row of its first row."""

  path: str
  start: int

  def error(self, i: int, reason: str) -> InputFormatError:
    return InputFormatError(self.path, self.start + int(i), reason, unit="row")


def is_list(t: pa.DataType) -> bool:
  """A list, large_list or fixed_size_list type: a multivalent feature's column."""
  return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _first(mask: np.ndarray) -> int:
  return int(np.argmax(mask))


def _floats(column: pa.Array) -> np.ndarray:
  """float64 values, nulls as 0.0 (large integers round to nearest, as float(text) does)."""
  values = pc.fill_null(column.cast(pa.float64(), safe=False), 0.0)
  return values.to_numpy(zero_copy_only=False)


def _check_finite(
  x: np.ndarray,
  name: str,
  rows: Rows,
  *,
  float32: bool,
  at: np.ndarray | None = None,
  mask: np.ndarray | None = None,
) -> None:
  """x must be finite (and as float32, if stored as it is); `at` maps positions to rows."""
  bad = ~np.isfinite(x)
  if float32:
    bad |= np.abs(np.where(bad, 0.0, x)) >= FLOAT32_OVERFLOW
  if mask is not None:
    bad &= mask
  if not bad.any():
    return
  j = _first(bad)
  row = j if at is None else at[j]
  value = float(x[j])
  if not np.isfinite(value):
    raise rows.error(row, f"column {name} value {value!r} is not finite")
  raise rows.error(
    row,
    f"column {name} value {value!r} is not finite as float32 (magnitude at most 3.4028235e+38)",
  )


def label_values(
  column: pa.Array, name: str, threshold: float | None, hint: str, rows: Rows
) -> np.ndarray:
  """[n] float32 labels: the numbers, or 1/0 by `threshold`; they must lie in [0, 1]."""
  if column.null_count:
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    raise rows.error(_first(~valid), f"the label column '{name}' is null")
  x = _floats(column)
  _check_finite(x, name, rows, float32=False)
  if threshold is not None:
    x = (x >= threshold).astype(np.float64)
  bad = (x < 0.0) | (x > 1.0)
  if bad.any():
    i = _first(bad)
    raise rows.error(i, f"label column {name} value {column[i].as_py()!r} is outside [0, 1]{hint}")
  return x.astype(np.float32)


def dense_values(column: pa.Array, name: str, log1p: bool, rows: Rows) -> np.ndarray:
  """[n] float32: the numbers (null -> 0.0), or log(1 + max(x, 0)) with `log1p`."""
  x = _floats(column)
  _check_finite(x, name, rows, float32=not log1p)
  if log1p:
    x = np.where(x > 0.0, np.log1p(np.maximum(x, 0.0)), 0.0)
  return x.astype(np.float32)


def _flatten(column: pa.Array) -> tuple[pa.Array, np.ndarray]:
  """(values, [n] values per row): a list column's flattened items (a null list has
  none, whatever Arrow keeps behind it), or a scalar column's values one per row."""
  if not is_list(column.type):
    return column, np.ones(len(column), np.int64)
  lengths = pc.fill_null(pc.list_value_length(column), 0)
  return column.flatten(), lengths.to_numpy(zero_copy_only=False).astype(np.int64)


def _present(values: pa.Array) -> np.ndarray:
  """[m] bool: the value gives an id (not null, not an empty string)."""
  if pa.types.is_dictionary(values.type):
    indices = values.indices
    inner = _present(values.dictionary)
    picked = inner[pc.fill_null(indices, 0).to_numpy(zero_copy_only=False)]
    return picked & indices.is_valid().to_numpy(zero_copy_only=False)
  present = values.is_valid()
  if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
    present = pc.and_(present, pc.fill_null(pc.greater(pc.binary_length(values), 0), False))
  return present.to_numpy(zero_copy_only=False)


class BatchHasher:
  """Ids of a column's distinct strings, batch by batch (CategoryHasher's ids).

  Consecutive record batches share most categories (the frequent ones), so
  the strings of the previous batch are looked up in Arrow (index_in) with
  their ids; only the others go through the CategoryHasher, one Python call
  each. Its cache holds at most `cache_size` strings (a few MiB per column),
  so memory stays bounded however many categories a column has.
  """

  def __init__(self, vocab_size: int, cache_size: int = 1 << 14):
    self._hasher = CategoryHasher(vocab_size, cache_size=cache_size)
    self._known = pa.array([], pa.string())
    self._known_ids = np.zeros(0, np.int64)

  def __call__(self, distinct: pa.Array) -> np.ndarray:
    """[len(distinct)] int64 ids of distinct non-null strings."""
    if self._known.type != distinct.type:
      self._known = pa.array([], distinct.type)
    where = pc.fill_null(pc.index_in(distinct, value_set=self._known), -1)
    where = where.to_numpy(zero_copy_only=False)
    ids = np.empty(len(distinct), np.int64)
    seen = where >= 0
    ids[seen] = self._known_ids[where[seen]]
    new = np.flatnonzero(~seen)
    if new.size:
      strings = distinct.take(pa.array(new)).to_pylist()
      ids[new] = np.fromiter(map(self._hasher, strings), np.int64, count=new.size)
    self._known, self._known_ids = distinct, ids
    return ids


def _hashed(values: pa.Array, hasher: BatchHasher) -> np.ndarray:
  """[m] int64 ids: the values hashed (integers as decimal text, the CSV converter's text of
  them); each distinct value once. Positions without a value hold an id that is dropped."""
  if pa.types.is_dictionary(values.type):
    distinct, indices = values.dictionary, values.indices
  else:
    encoded = pc.dictionary_encode(values)
    distinct, indices = encoded.dictionary, encoded.indices
  if not len(distinct):
    return np.zeros(len(values), np.int64)
  if pa.types.is_integer(distinct.type):
    distinct = distinct.cast(pa.string())
  table = hasher(pc.fill_null(distinct, ""))  # a null in a dictionary: no id, any will do
  return table[pc.fill_null(indices, 0).to_numpy(zero_copy_only=False)]


def _integer_ids(
  values: pa.Array, present: np.ndarray, name: str, vocab: int, rows: Rows, at: np.ndarray
) -> np.ndarray:
  """[m] int64: the values as ids; present ones must lie in [0, vocab)."""
  if pa.types.is_dictionary(values.type):
    values = values.dictionary_decode()
  v = pc.fill_null(values, 0).to_numpy(zero_copy_only=False)
  bad = present & ((v < 0) | (v >= vocab))
  if bad.any():
    j = _first(bad)
    raise rows.error(at[j], f"column {name} id {int(v[j])} out of range [0, {vocab})")
  return v.astype(np.int64)


def _weights(
  column: pa.Array, lengths: np.ndarray, present: np.ndarray, names: tuple[str, str], rows: Rows
) -> np.ndarray:
  """float32 weights of the present ids: `column` has one weight per value of the ids."""
  name, weight_name = names
  values, weight_lengths = _flatten(column)
  bad = weight_lengths != lengths
  if bad.any():
    i = _first(bad)
    raise rows.error(
      i,
      f"column {name} holds {lengths[i]} values but weight column {weight_name} holds"
      f" {weight_lengths[i]} weights",
    )
  at = np.repeat(np.arange(len(lengths)), lengths)
  missing = present & ~values.is_valid().to_numpy(zero_copy_only=False)
  if missing.any():
    raise rows.error(
      at[_first(missing)], f"weight column {weight_name} is null where column {name} has an id"
    )
  w = _floats(values)
  _check_finite(w, weight_name, rows, float32=True, at=at, mask=present)
  return w[present].astype(np.float32)


def _not_utf8(values: pa.Array, name: str, rows: Rows, at: np.ndarray) -> InputFormatError:
  """The error naming the first value of a string column that is not UTF-8 text
  (Arrow's string type promises UTF-8, but a writer may not keep the promise)."""
  if pa.types.is_dictionary(values.type):
    values = values.dictionary_decode()
  for i, value in enumerate(values.cast(pa.large_binary()).to_pylist()):
    try:
      (value or b"").decode("utf-8")
    except UnicodeDecodeError as e:
      byte = value[e.start : e.start + 1]
      return rows.error(
        at[i], f"column '{name}': byte {e.start + 1} ({byte!r}) of {value[:40]!r} is not UTF-8 text"
      )
  return rows.error(at[0] if len(at) else 0, f"column '{name}' holds text that is not UTF-8")


def sparse_ids(
  column: pa.Array,
  name: str,
  *,
  vocab: int,
  hasher: BatchHasher | None,
  rows: Rows,
  weights: tuple[pa.Array, str] | None = None,
) -> RaggedBatch:
  """The ids of a scalar or list column (int32, row lengths int32), weights if given.

  A null or empty-string value, a null list and a null item inside a list
  give no id. `hasher` None: integer values are the ids, in [0, vocab).
  `weights`: (the weight column, its name), one weight per value of `column`.
  """
  values, lengths = _flatten(column)
  at = np.repeat(np.arange(len(column)), lengths)
  present = _present(values)
  if hasher is None:
    ids = _integer_ids(values, present, name, vocab, rows, at)
  else:
    try:
      ids = _hashed(values, hasher)
    except UnicodeDecodeError:
      raise _not_utf8(values, name, rows, at) from None
  kept_weights = None
  if weights is not None:
    kept_weights = _weights(weights[0], lengths, present, (name, weights[1]), rows)
  row_lengths = np.bincount(at[present], minlength=len(column)).astype(np.int32)
  return RaggedBatch(ids[present].astype(np.int32), row_lengths, kept_weights)

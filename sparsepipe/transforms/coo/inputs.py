"""Input normalisation: every accepted feature form -> flat ids + row lengths.

Accepted per feature (docs/reference/coo_format.md "Inputs"):
  * a dense 2-D integer array [B, k] (k ids per sample),
  * a ragged batch: a 1-D object array (or list) of 1-D integer id arrays,
    empty rows allowed, int32 or int64 ids,
  * `sparsepipe.data.RaggedBatch(values, row_lengths, weights)` (columnar),
  * sparse-tensor form (indices [n, 2] row-major, values [n], dense_shape).
Weights have the same structure (float32 or float64, converted to float32);
None means all weights 1.0.

Ragged object arrays are read in compiled code (ragged_flatten.py); other row
containers take three C-level passes over the rows (bytes join, len, dtype)
or, for odd rows, a checked Python loop.
"""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

import numpy as np

from sparsepipe.data import ragged as ragged_lib
from sparsepipe.transforms.coo import ragged_flatten
from sparsepipe.transforms import errors

_GET_DTYPE = operator.attrgetter("dtype")


class FeatureInput(NamedTuple):
  """One feature's batch in columnar form.

  Attributes:
    values: flat ids in sample order, 1-D integer array (any int dtype).
    row_lengths: ids per sample, int64 [B].
    weights: float32 weights aligned with values, or None (all 1.0).
  """

  values: np.ndarray
  row_lengths: np.ndarray
  weights: np.ndarray | None

  @property
  def batch_size(self) -> int:
    return int(self.row_lengths.shape[0])


def _fail(name: str, message: str) -> errors.PreprocessingError:
  return errors.PreprocessingError(f"feature '{name}': {message}")


def _is_rows(x: Any) -> bool:
  """True for a ragged batch given as a 1-D object array or a list of rows."""
  if isinstance(x, (list, tuple)):
    return True
  return isinstance(x, np.ndarray) and x.dtype == object


def _check_kind(name: str, what: str, dtype: np.dtype, kinds: str) -> None:
  if dtype.kind not in kinds:
    wanted = "integer" if kinds == "iu" else "floating-point"
    raise _fail(name, f"{what} have dtype {dtype}, expected {wanted}")


def _concat_rows(arrays: list[np.ndarray], dtype) -> np.ndarray:
  """Concatenates non-empty rows; mixed integer dtypes widen to int64."""
  dtypes = {a.dtype for a in arrays}
  if dtype is None:
    if len(dtypes) == 1:
      return np.concatenate(arrays)
    too_big = [a for a in arrays if a.dtype == np.uint64 and int(a.max()) >> 63]
    if too_big:  # keep uint64 so the range check reports the real id
      return np.concatenate([a.astype(np.uint64) for a in arrays])
    dtype = np.int64
  return np.concatenate([a.astype(dtype, copy=False) for a in arrays])


def _rows_slow(name: str, what: str, rows: Any, kinds: str, dtype) -> tuple[np.ndarray, np.ndarray]:
  """Row by row conversion with full checks (odd dtypes, lists, views)."""
  arrays = []
  lengths = np.empty(len(rows), np.int64)
  for i, row in enumerate(rows):
    arr = np.asarray(row)
    if arr.dtype == object and arr.ndim == 1:  # a row of Python numbers
      arr = _object_row(arr)
    if arr.ndim != 1:
      raise _fail(name, f"{what} row {i} has shape {arr.shape}, expected 1-D")
    if arr.size and arr.dtype.kind not in kinds:
      wanted = "integer" if kinds == "iu" else "floating-point"
      raise _fail(name, f"{what} row {i} has dtype {arr.dtype}, expected {wanted}")
    lengths[i] = arr.shape[0]
    if arr.size:
      arrays.append(arr)
  if not arrays:
    return np.zeros(0, dtype or np.int64), lengths
  return _concat_rows(arrays, dtype), lengths


def _object_row(arr: np.ndarray) -> np.ndarray:
  """A 1-D object row of Python numbers as a numeric array (the reference
  misreads such rows); anything else is left to the row checks."""
  try:
    return np.array(arr.tolist())
  except (ValueError, TypeError, OverflowError):
    return arr


def _row_lengths(rows: list) -> np.ndarray:
  """len of every row, int64; bytearray packs lengths < 256 fastest."""
  try:
    small = bytearray(map(len, rows))
  except ValueError:  # a row of 256 or more ids
    return np.fromiter(map(len, rows), np.int64, len(rows))
  return np.frombuffer(small, np.uint8).astype(np.int64)


def _rows_fast(rows: Any, kinds: str, dtype) -> tuple[np.ndarray, np.ndarray] | None:
  """Rows that are contiguous arrays of one native dtype; else None.

  Three C-level passes over the rows: dtype (list.count compares by
  identity first), bytes join (one copy of all ids) and len. The byte count
  check proves every row holds exactly len(row) items, so a strided view,
  a row of another size or a 2-D row of more than one column cannot be
  misread (an [n, 1] row reads as its n ids).
  """
  if isinstance(rows, np.ndarray):
    rows = rows.tolist()  # the same row objects; lists iterate faster
  n = len(rows)
  first = rows[0]
  if not isinstance(first, np.ndarray) or first.ndim != 1:
    return None
  row_dtype = first.dtype
  if row_dtype.kind not in kinds or not row_dtype.isnative:
    return None
  try:
    if list(map(_GET_DTYPE, rows)).count(row_dtype) != n:
      return None
    joined = b"".join(rows)
    lengths = _row_lengths(rows)
  except (TypeError, BufferError, AttributeError, ValueError):
    return None
  if len(joined) != int(lengths.sum()) * row_dtype.itemsize:
    return None
  flat = np.frombuffer(joined, row_dtype)
  if dtype is not None and flat.dtype != dtype:
    flat = flat.astype(dtype)
  return flat, lengths


def _rows_to_flat(
  name: str, what: str, rows: Any, kinds: str, dtype=None
) -> tuple[np.ndarray, np.ndarray]:
  """Flattens ragged rows; returns (flat values, row lengths int64)."""
  if len(rows) == 0:
    return np.zeros(0, dtype or np.int64), np.zeros(0, np.int64)
  fast = _rows_compiled(rows, kinds, dtype) or _rows_fast(rows, kinds, dtype)
  if fast is not None:
    return fast
  return _rows_slow(name, what, rows, kinds, dtype)


def _rows_compiled(rows: Any, kinds: str, dtype) -> tuple[np.ndarray, np.ndarray] | None:
  """An object array of contiguous 1-D rows of one dtype, read in compiled
  code (ragged_flatten.py); else None."""
  flat = ragged_flatten.flatten(rows)
  if flat is None or flat[0].dtype.kind not in kinds:
    return None
  values, lengths = flat
  if dtype is not None and values.dtype != dtype:
    values = values.astype(dtype)
  return values, lengths


def _as_float32(name: str, what: str, w: Any) -> np.ndarray:
  w = np.asarray(w)
  _check_kind(name, what, w.dtype, "f")
  return w.astype(np.float32, copy=False)


def _object_matrix(name: str, what: str, x: Any) -> Any:
  """A 2-D object array of Python numbers as a numeric array; else `x`.

  `np.array(rows, dtype=object)` of equal-length rows gives one; the
  reference reads it as a dense [batch, k] feature, so do we.
  """
  if not (isinstance(x, np.ndarray) and x.dtype == object and x.ndim == 2):
    return x
  try:
    values = np.array(x.tolist())
  except (ValueError, TypeError, OverflowError) as e:
    raise _fail(name, f"{what} are a 2-D object array that is not numeric: {e}") from None
  if values.shape != x.shape:
    raise _fail(
      name,
      f"{what} are a 2-D object array of shape {x.shape} whose elements are not numbers",
    )
  return values


def normalize_feature(name: str, feature: Any, weights: Any = None) -> FeatureInput:
  """Converts one feature (and its weights) to a FeatureInput, checked."""
  if isinstance(feature, ragged_lib.RaggedBatch):
    return _from_ragged_batch(name, feature, weights)
  feature = _object_matrix(name, "ids", feature)
  weights = _object_matrix(name, "weights", weights)
  if _is_rows(feature):
    values, lengths = _rows_to_flat(name, "ids", feature, "iu")
    w = None
    if weights is not None:
      if not _is_rows(weights) or len(weights) != len(feature):
        raise _fail(
          name,
          f"weights must be ragged rows like the ids ({len(feature)} rows),"
          f" got {type(weights).__name__}"
          + (f" with {len(weights)} rows" if hasattr(weights, "__len__") else ""),
        )
      w, w_lengths = _rows_to_flat(name, "weights", weights, "f", np.float32)
      if not np.array_equal(w_lengths, lengths):
        row = int(np.flatnonzero(w_lengths != lengths)[0])
        raise _fail(
          name,
          f"weights row {row} has {w_lengths[row]} values but ids row {row} has {lengths[row]}",
        )
    return FeatureInput(values, lengths, w)
  ids = np.asarray(feature)
  if ids.ndim != 2:
    raise _fail(
      name,
      f"ids have shape {ids.shape}; expected a dense 2-D [batch, k] array,"
      " ragged rows (1-D object array) or a RaggedBatch",
    )
  _check_kind(name, "ids", ids.dtype, "iu")
  lengths = np.full(ids.shape[0], ids.shape[1], np.int64)
  w = None
  if weights is not None:
    w = _as_float32(name, "weights", weights)
    if w.shape != ids.shape:
      raise _fail(name, f"weights have shape {w.shape} but ids have shape {ids.shape}")
    w = w.reshape(-1)
  return FeatureInput(ids.reshape(-1), lengths, w)


def _from_ragged_batch(name: str, batch: ragged_lib.RaggedBatch, weights: Any) -> FeatureInput:
  values = np.asarray(batch.values)
  lengths = np.asarray(batch.row_lengths)
  if values.ndim != 1 or lengths.ndim != 1:
    raise _fail(
      name,
      f"RaggedBatch values {values.shape} and row_lengths {lengths.shape} must be 1-D",
    )
  _check_kind(name, "ids", values.dtype, "iu")
  _check_kind(name, "row_lengths", lengths.dtype, "iu")
  lengths = lengths.astype(np.int64, copy=False)
  if lengths.size and int(lengths.min()) < 0:
    row = int(np.argmin(lengths))
    raise _fail(name, f"row_lengths[{row}]={lengths[row]} is negative")
  total = int(lengths.sum())
  if total != values.shape[0]:
    raise _fail(name, f"row_lengths sum to {total} but there are {values.shape[0]} ids")
  w = batch.weights
  if weights is not None:
    if w is not None:
      raise _fail(name, "weights given both inside the RaggedBatch and separately")
    w = weights.weights if isinstance(weights, ragged_lib.RaggedBatch) else weights
  if w is not None:
    w = _as_float32(name, "weights", w)
    if w.shape != values.shape:
      raise _fail(name, f"weights have shape {w.shape} but ids have shape {values.shape}")
  return FeatureInput(values, lengths, w)


def from_sparse_tensor(name: str, indices: Any, values: Any, dense_shape: Any) -> FeatureInput:
  """Sparse-tensor form (indices [n, 2] row-major) -> FeatureInput."""
  indices = np.asarray(indices)
  values = np.asarray(values)
  shape = np.asarray(dense_shape).reshape(-1)
  if shape.shape != (2,):
    raise _fail(name, f"dense_shape {shape.tolist()} must have 2 entries")
  batch, width = int(shape[0]), int(shape[1])
  if batch < 0 or width < 0:
    raise _fail(name, f"dense_shape {shape.tolist()} must be non-negative")
  n = values.shape[0] if values.ndim == 1 else -1
  if values.ndim != 1 or indices.shape != (n, 2):
    raise _fail(
      name,
      f"indices {indices.shape} and values {values.shape} must be [n, 2] and [n]",
    )
  _check_kind(name, "ids", values.dtype, "iu")
  _check_kind(name, "indices", indices.dtype, "iu")
  if n == 0:
    return FeatureInput(values, np.zeros(batch, np.int64), None)
  rows = indices[:, 0].astype(np.int64)
  cols = indices[:, 1].astype(np.int64)
  bad = (rows < 0) | (rows >= batch) | (cols < 0) | (cols >= width)
  if bad.any():
    i = int(np.flatnonzero(bad)[0])
    raise _fail(
      name,
      f"index {i} [{rows[i]}, {cols[i]}] is outside dense_shape [{batch}, {width}]",
    )
  step = np.diff(rows)
  if (step < 0).any():
    i = int(np.flatnonzero(step < 0)[0]) + 1
    raise _fail(
      name,
      f"indices are not row-major: index {i} has row {rows[i]} after row {rows[i - 1]}",
    )
  lengths = np.bincount(rows, minlength=batch).astype(np.int64)
  return FeatureInput(values, lengths, None)

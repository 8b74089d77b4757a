"""Ragged rows (an object array of 1-D arrays) flattened in compiled code.

Reading 4096 row objects per feature through Python (dtype, buffer, len of
each) costs about 120 ns a row: a third of jax-tpu-embedding's whole
preprocessing time for a 26-feature batch. Its C++ reads the rows through
the array objects' C structs; so does this module, from numba: the object
array's element pointers, then per row its type, dtype, dimensions, flags
and data pointer, at the offsets of numpy's public C struct
(PyArrayObject_fields, part of numpy's ABI that every compiled extension
relies on). The offsets are checked against known arrays the first time;
if they do not match (another Python build), or a row is anything but a
contiguous 1-D ndarray of the first row's dtype, `flatten` returns None and
the caller takes the Python path. The GIL is held throughout (the rows
cannot change or go away), and nothing is read from an object before its
type has been checked.
"""

from __future__ import annotations

import ctypes
import functools

import numba
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
import numpy as np

from sparsepipe.core import compile_cache

_TYPE = 8  # PyObject_HEAD: ob_refcnt, ob_type
_HEAD = 16
# PyArrayObject_fields after the head: data, nd, dimensions, strides, base, descr, flags.
_DATA, _ND, _DIMS, _DESCR, _FLAGS = _HEAD + 0, _HEAD + 8, _HEAD + 16, _HEAD + 40, _HEAD + 48
_C_CONTIGUOUS = 0x1


@intrinsic
def _address(typingctx, address):
  """The integer `address` as a pointer (numba has no cast for it)."""
  del typingctx

  def codegen(context, builder, signature, args):
    del context, signature
    return builder.inttoptr(args[0], cgutils.voidptr_t)

  return types.voidptr(address), codegen


@compile_cache.njit()
def _u64(address):
  return numba.carray(_address(address), 1, np.uint64)[0]


@compile_cache.njit()
def _i32(address):
  return numba.carray(_address(address), 1, np.int32)[0]


@compile_cache.njit()
def _lengths(pointers, array_type, descr, lengths, data):
  """Row lengths and data addresses; the first row that is not a contiguous
  1-D array of `descr`, else -1."""
  for r in range(pointers.shape[0]):
    p = pointers[r]
    if p == 0 or _u64(p + _TYPE) != array_type or _u64(p + _DESCR) != descr:
      return r
    if _i32(p + _ND) != 1 or not _i32(p + _FLAGS) & _C_CONTIGUOUS:
      return r
    lengths[r] = _u64(_u64(p + _DIMS))
    data[r] = _u64(p + _DATA)
  return -1


@compile_cache.njit()
def _gather(data, lengths, out):
  """Copies every row's items into `out`, back to back."""
  start = 0
  for r in range(data.shape[0]):
    n = lengths[r]
    row = numba.carray(_address(data[r]), n, out.dtype)
    for i in range(n):
      out[start + i] = row[i]
    start += n


def _pointers(rows: np.ndarray) -> np.ndarray:
  """The object array's element pointers as uint64 (a view; rows must stay alive)."""
  buffer = (ctypes.c_uint64 * rows.shape[0]).from_address(rows.ctypes.data)
  return np.ctypeslib.as_array(buffer)


@functools.cache
def _layout_matches() -> bool:
  """Whether numpy arrays have the struct offsets used here, on this build."""
  rows = np.empty(3, object)
  rows[:] = [np.arange(5, dtype=np.int32), np.zeros(0, np.int32), np.arange(3, dtype=np.int32)]
  lengths, data = np.zeros(3, np.int64), np.zeros(3, np.uint64)
  descr = id(rows[0].dtype)
  if _lengths(_pointers(rows), id(np.ndarray), descr, lengths, data) != -1:
    return False
  if lengths.tolist() != [5, 0, 3]:
    return False
  out = np.zeros(8, np.int32)
  _gather(data, lengths, out)
  if out.tolist() != [0, 1, 2, 3, 4, 0, 1, 2]:
    return False
  odd = np.empty(4, object)
  odd[:] = [np.arange(6, dtype=np.int32)[::2], np.ones((2, 1), np.int32), [1], np.int64([1])]
  return all(
    _lengths(_pointers(odd[i : i + 1]), id(np.ndarray), descr, lengths, data) == 0 for i in range(4)
  )


def flatten(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
  """(flat values, int64 lengths) of a 1-D object array of contiguous 1-D
  arrays of one integer or float dtype; None for anything else (the
  caller's Python path)."""
  if not (isinstance(rows, np.ndarray) and rows.dtype == object and rows.ndim == 1):
    return None
  if not rows.flags.c_contiguous or not _layout_matches():
    return None
  first = rows[0]
  if type(first) is not np.ndarray or first.dtype.kind not in "iuf" or not first.dtype.isnative:
    return None  # rows of Python objects, strings, ...: the Python path converts or names them
  lengths = np.empty(rows.shape[0], np.int64)
  data = np.empty(rows.shape[0], np.uint64)
  if _lengths(_pointers(rows), id(np.ndarray), id(first.dtype), lengths, data) != -1:
    return None
  out = np.empty(int(lengths.sum()), first.dtype)
  _gather(data, lengths, out)
  return out, lengths

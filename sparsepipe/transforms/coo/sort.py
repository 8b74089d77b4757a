"""Sorting the ids of one stack into COO order: sort keys, then numpy's sort.

All ids of a stack are packed into one unsigned key each (coo_pass.key_pass,
compiled) and sorted with np.sort (much faster than argsort):

    unweighted:  key = [q] | p | e | sid   (q = d*S+s, p partition, e local
    weighted:    key =  q  | p | e | i      row, sid sample id on the SC, i
                                           position of the id in the stack)

The reference sorts by (p, e, sid, position) per SC. Unweighted, the
duplicates of one id in one sample have equal gains, so their order does
not matter and equal keys are exactly the entries to merge. Weighted, the
position i orders them as the reference does: inside one SC positions grow
with (sid, position in sample), because features are concatenated in
row_offset order. Keys are uint32 when the fields fit, else uint64.

A stack of one feature (the common case) has its ids in q order already:
its keys leave q out and are sorted SC by SC (small sorts in cache).
Merging, statistics and the layout are one compiled pass (coo_pass) over
the sorted keys, SC by SC.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import numpy as np

from sparsepipe.transforms.coo import gains as coo_gains
from sparsepipe.transforms.coo import inputs as coo_inputs
from sparsepipe.transforms.coo import layout as coo_layout
from sparsepipe.transforms.coo import passes as coo_pass
from sparsepipe.transforms import errors
from sparsepipe.core import specs as specs_lib


class StackFeature(NamedTuple):
  """One checked feature of a stack, with its place on the SparseCores."""

  spec: specs_lib.FeatureSpec
  x: coo_inputs.FeatureInput
  rows_per_sc: int  # n_f
  sid_base: int  # floor(row_offset / N)
  max_col: int  # upper bound of the feature's stacked columns (-1: no ids)


class SortedIds(NamedTuple):
  """A stack's raw keys in COO order, SC by SC, and how to read them."""

  key: np.ndarray  # unsigned keys p | e | low (q above them or not), sorted per SC
  q_starts: np.ndarray  # intp [L*S + 1]: the keys of SC q are key[q_starts[q]:q_starts[q+1]]
  low_bits: int
  e_bits: int
  p_shift: int
  per_sc: int  # samples per SC (unweighted: gains are indexed q * per_sc + sid)
  weighted: bool  # low is the position i, not the sample id
  sample_of: np.ndarray  # weighted: int32 sample id by position (else empty)
  gain_of: np.ndarray  # float32 gain by q * per_sc + sid, or (weighted) by position


def _bit_length(value: int) -> int:
  return max(int(value), 0).bit_length()


def _key_dtype(bits: int, who: str) -> type:
  if bits <= 32:
    return np.uint32
  if bits <= 64:
    return np.uint64
  raise errors.PreprocessingError(f"{who}: the sort key needs {bits} > 64 bits")


def _key_fields(
  f: StackFeature, log_n: int, low_bits: int, p_shift: int, q_shift: int, by_position: bool
) -> tuple[int, ...]:
  t = f.spec.id_transformation
  return (t.col_shift, t.col_offset, log_n, low_bits, p_shift, q_shift, int(by_position))


def _build_keys(
  feats: Sequence[StackFeature],
  dtype: type,
  layout: tuple[int, int, int, int],
  by_position: bool,
) -> np.ndarray:
  """The features' keys, concatenated (coo_pass.key_pass); layout is
  (log_n, low_bits, p_shift, q_shift), q_shift < 0 leaving q out."""
  key = np.empty(sum(f.x.values.shape[0] for f in feats), dtype)
  start = 0
  for f in feats:
    stop = start + f.x.values.shape[0]
    low_base = start if by_position else f.sid_base
    fields = _key_fields(f, *layout, by_position)
    coo_pass.key_pass(f.x.values, f.x.row_lengths, f.rows_per_sc, low_base, fields, key[start:stop])
    start = stop
  return key


def _sort_q_major(key: np.ndarray, q_ends: np.ndarray) -> None:
  """Sorts keys already ordered by SC q: each SC's slice alone, in place.

  Slices of ~1k keys sort in cache: ~20% faster than one large sort, even
  with the Python loop over the SCs.
  """
  start = 0
  for end in q_ends.tolist():
    key[start:end].sort()
    start = end


def _single_feature_keys(
  f: StackFeature, dtype: type, l_sc: int, layout: tuple[int, int, int, int]
) -> tuple[np.ndarray, np.ndarray]:
  """Keys p | e | sid of a stack of one feature, whose ids are q-major,
  sorted SC by SC, and the SCs' starts."""
  key = _build_keys([f], dtype, layout, False)
  q_starts = np.zeros(l_sc + 1, np.intp)
  q_starts[1:] = np.cumsum(f.x.row_lengths)[f.rows_per_sc - 1 :: f.rows_per_sc]
  _sort_q_major(key, q_starts[1:])
  return key, q_starts


@functools.lru_cache(maxsize=256)
def _q_firsts(dtype: type, l_sc: int, q_shift: int) -> np.ndarray:
  firsts = np.arange(l_sc, dtype=dtype) << dtype(q_shift)
  firsts.flags.writeable = False
  return firsts


def _q_starts(key: np.ndarray, l_sc: int, q_shift: int) -> np.ndarray:
  """q_starts[q]: first key of SC q (key >> q_shift == q); q_starts[-1] = n."""
  starts = np.empty(l_sc + 1, np.intp)
  starts[:-1] = key.searchsorted(_q_firsts(key.dtype.type, l_sc, q_shift))
  starts[-1] = key.shape[0]
  return starts


def _sample_gains(
  feats: Sequence[StackFeature], combiner: str, l_sc: int, per_sc: int
) -> np.ndarray:
  """Gain of every sample of the stack by q * per_sc + sid (unweighted)."""
  if len(feats) == 1 and feats[0].sid_base == 0:
    return coo_gains.id_gains(combiner, feats[0].x.row_lengths, None)[0]
  table = np.zeros(l_sc * per_sc, np.float32)
  for f in feats:
    row_gain, _ = coo_gains.id_gains(combiner, f.x.row_lengths, None)
    rows = np.arange(f.x.batch_size)
    q, j = np.divmod(rows, f.rows_per_sc)
    table[q * per_sc + f.sid_base + j] = row_gain
  return table


_NO_SAMPLES = np.zeros(0, np.int32)


def sort_by_sample(
  feats: Sequence[StackFeature], combiner: str, geo: coo_layout.Geometry, who: str
) -> SortedIds:
  """Unweighted: key = [q |] p | e | sid; gains looked up per (q, sid)."""
  n_sc, l_sc = geo.num_sc, geo.local_sc
  log_n = n_sc.bit_length() - 1
  per_sc = max(f.sid_base + f.rows_per_sc for f in feats)
  low_bits = _bit_length(per_sc - 1)
  e_bits = _bit_length(max(f.max_col for f in feats) >> log_n)
  p_shift = e_bits + low_bits
  q_shift = p_shift + log_n
  if len(feats) == 1:
    dtype = _key_dtype(q_shift, who)
    layout = (log_n, low_bits, p_shift, -1)
    key, q_starts = _single_feature_keys(feats[0], dtype, l_sc, layout)
  else:
    dtype = _key_dtype(q_shift + _bit_length(l_sc - 1), who)
    key = _build_keys(feats, dtype, (log_n, low_bits, p_shift, q_shift), False)
    key.sort()
    q_starts = _q_starts(key, l_sc, q_shift)
  gains = _sample_gains(feats, combiner, l_sc, per_sc)
  return SortedIds(key, q_starts, low_bits, e_bits, p_shift, per_sc, False, _NO_SAMPLES, gains)


def sort_by_position(
  feats: Sequence[StackFeature], combiner: str, geo: coo_layout.Geometry, who: str
) -> SortedIds:
  """Weighted: key = q | p | e | i; sample id and gain by position i."""
  n_sc, l_sc = geo.num_sc, geo.local_sc
  log_n = n_sc.bit_length() - 1
  total = sum(f.x.values.shape[0] for f in feats)
  low_bits = _bit_length(total - 1)
  e_bits = _bit_length(max(f.max_col for f in feats) >> log_n)
  p_shift = e_bits + low_bits
  q_shift = p_shift + log_n
  dtype = _key_dtype(q_shift + _bit_length(l_sc - 1), who)
  sid_parts, gain_parts = [], []
  for f in feats:
    lengths = f.x.row_lengths
    sid = f.sid_base + np.arange(f.x.batch_size, dtype=np.int32) % f.rows_per_sc
    sid_parts.append(np.repeat(sid, lengths))
    row_gain, id_gain = coo_gains.id_gains(combiner, lengths, f.x.weights)
    gain_parts.append(np.repeat(row_gain, lengths) if id_gain is None else id_gain)
  key = _build_keys(feats, dtype, (log_n, low_bits, p_shift, q_shift), True)
  key.sort()
  per_sc = max(f.sid_base + f.rows_per_sc for f in feats)
  sample_of = np.concatenate(sid_parts)
  gain_of = np.concatenate(gain_parts).astype(np.float32, copy=False)
  q_starts = _q_starts(key, l_sc, q_shift)
  return SortedIds(key, q_starts, low_bits, e_bits, p_shift, per_sc, True, sample_of, gain_of)

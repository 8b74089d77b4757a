"""Sorting the ids of one stack into COO order: sort keys, then numpy's sort.

All ids of a stack are packed into one unsigned key each (coo_pass.key_pass,
compiled), in a region per SparseCore q, and each region is sorted by
numpy's sort (x86-simd-sort; ~1k keys sort in cache, faster than one
large sort). Regions are one row per SC of a [L*S, width] array, sorted by
one `np.sort(axis=1)`, unless SCs are so uneven that the padding would
cost more than a Python loop over the SCs (_PAD_LIMIT):

    unweighted:  key = p | e | sid   (p partition, e local row, sid sample
    weighted:    key = p | e | i      id on the SC, i position of the id in
                                      the stack)

The reference sorts by (p, e, sid, position) per SC. Unweighted, the
duplicates of one id in one sample have equal gains, so their order does
not matter and equal keys are exactly the entries to merge. Weighted, the
position i orders them as the reference does: inside one SC positions grow
with (sid, position in sample), because features are concatenated in
row_offset order. Keys are uint32 when the fields fit, else uint64. Rows
shorter than the longest are padded with all-ones keys, which sort last
and are never read. Merging, statistics and the layout are one compiled
pass (coo_pass) over the sorted regions.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from sparsepipe.transforms.coo import gains as coo_gains
from sparsepipe.transforms.coo import inputs as coo_inputs
from sparsepipe.transforms.coo import buffer_sizes
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

  key: np.ndarray  # unsigned keys p | e | low; SC q's are key[sc_starts[q]:][:sc_counts[q]]
  sc_starts: np.ndarray  # int64 [L*S]
  sc_counts: np.ndarray  # int64 [L*S]
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


# Regions of one row per SC, padded to the longest, are sorted by one
# np.sort(axis=1) when that sorts at most this many keys per real key (10%
# faster than sorting SC by SC from Python); skewed batches sort exact
# regions SC by SC instead.
_PAD_LIMIT = 1.25


def _sort_rows(rows: np.ndarray) -> None:
  rows.sort(axis=1)


def _sort_regions(key: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
  for start, end in zip(starts.tolist(), ends.tolist()):
    key[start:end].sort()


def _sorted_keys(
  feats: Sequence[StackFeature],
  dtype: type,
  layout: tuple[int, int, int],
  by_position: bool,
  l_sc: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(keys, sc_starts, sc_counts): the stack's keys, SC q's sorted in
  key[sc_starts[q]:][:sc_counts[q]] (coo_pass.key_pass, then np.sort);
  layout is (log_n, low_bits, p_shift)."""
  sc_counts = feats[0].x.row_lengths.reshape(l_sc, -1).sum(axis=1)
  for f in feats[1:]:
    sc_counts += f.x.row_lengths.reshape(l_sc, -1).sum(axis=1)
  total, width = int(sc_counts.sum()), int(sc_counts.max())
  padded = l_sc * width <= _PAD_LIMIT * total
  if padded:
    starts = np.arange(0, l_sc * width, width, dtype=np.int64)
    ends = starts + width
  else:
    ends = np.cumsum(sc_counts)
    starts = ends - sc_counts
  key = np.empty(l_sc * width if padded else total, dtype)
  cursors = starts.copy()
  mark = np.zeros(width + 1, np.int32)
  start = 0
  for f in feats:
    t, x = f.spec.id_transformation, f.x
    fields = (t.col_shift, t.col_offset, *layout, int(by_position))
    low_base = start if by_position else f.sid_base
    coo_pass.key_pass(
      x.values, x.row_lengths, f.rows_per_sc, low_base, fields, key, cursors, ends, mark
    )
    start += x.values.shape[0]
  if padded:
    _sort_rows(key.reshape(l_sc, width))
  else:
    _sort_regions(key, starts, ends)
  return key, starts, sc_counts


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
  feats: Sequence[StackFeature], combiner: str, geo: buffer_sizes.Geometry, who: str
) -> SortedIds:
  """Unweighted: key = p | e | sid; gains looked up per (q, sid)."""
  log_n = geo.num_sc.bit_length() - 1
  per_sc = max(f.sid_base + f.rows_per_sc for f in feats)
  low_bits = _bit_length(per_sc - 1)
  e_bits = _bit_length(max(f.max_col for f in feats) >> log_n)
  p_shift = e_bits + low_bits
  dtype = _key_dtype(p_shift + log_n, who)
  key, sc_starts, sc_counts = _sorted_keys(
    feats, dtype, (log_n, low_bits, p_shift), False, geo.local_sc
  )
  gains = _sample_gains(feats, combiner, geo.local_sc, per_sc)
  return SortedIds(
    key, sc_starts, sc_counts, low_bits, e_bits, p_shift, per_sc, False, _NO_SAMPLES, gains
  )


def sort_by_position(
  feats: Sequence[StackFeature], combiner: str, geo: buffer_sizes.Geometry, who: str
) -> SortedIds:
  """Weighted: key = p | e | i; sample id and gain by position i."""
  log_n = geo.num_sc.bit_length() - 1
  total = sum(f.x.values.shape[0] for f in feats)
  low_bits = _bit_length(total - 1)
  e_bits = _bit_length(max(f.max_col for f in feats) >> log_n)
  p_shift = e_bits + low_bits
  dtype = _key_dtype(p_shift + log_n, who)
  sid_parts, gain_parts = [], []
  for f in feats:
    lengths = f.x.row_lengths
    sid = f.sid_base + np.arange(f.x.batch_size, dtype=np.int32) % f.rows_per_sc
    sid_parts.append(np.repeat(sid, lengths))
    row_gain, id_gain = coo_gains.id_gains(combiner, lengths, f.x.weights)
    gain_parts.append(np.repeat(row_gain, lengths) if id_gain is None else id_gain)
  key, sc_starts, sc_counts = _sorted_keys(
    feats, dtype, (log_n, low_bits, p_shift), True, geo.local_sc
  )
  per_sc = max(f.sid_base + f.rows_per_sc for f in feats)
  sample_of = np.concatenate(sid_parts)
  gain_of = np.concatenate(gain_parts).astype(np.float32, copy=False)
  return SortedIds(
    key, sc_starts, sc_counts, low_bits, e_bits, p_shift, per_sc, True, sample_of, gain_of
  )

"""Sorting the ids of one stack into merged COO entries (vectorised numpy).

All ids of a stack (every local device and SparseCore) are packed into one
unsigned key each and sorted with np.sort (much faster than argsort):

    unweighted:  key = q | p | e | sid    (q = d*S+s, p partition, e local
    weighted:    key = q | p | e | i       row, sid sample id on the SC, i
                                          position of the id in the stack)

The reference sorts by (p, e, sid, position) per SC. Unweighted, the
duplicates of one id in one sample have equal gains, so their order does
not matter and equal keys are exactly the entries to merge. Weighted, the
position i orders them as the reference does: inside one SC positions grow
with (sid, position in sample), because features are concatenated in
row_offset order. Keys are uint32 when the fields fit, else uint64.

A stack of one feature (the common case) has its ids in q order already:
its keys are sorted SC by SC (small sorts in cache), and when only q needs
the 64-bit keys they are sorted as uint32 without q, which is added after.

After the sort, duplicates (the same id in the same sample) are merged:
runs of equal keys (unweighted) or of equal (q, p, e) and sample
(weighted), their gains summed in input order. coo_buffers decodes the rest
from the merged keys.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import numpy as np

from sparsepipe.transforms import coo_gains
from sparsepipe.transforms import coo_inputs
from sparsepipe.transforms import coo_layout
from sparsepipe.transforms import errors
from sparsepipe.core import specs as specs_lib


class StackFeature(NamedTuple):
  """One checked feature of a stack, with its place on the SparseCores."""

  spec: specs_lib.FeatureSpec
  x: coo_inputs.FeatureInput
  rows_per_sc: int  # n_f
  sid_base: int  # floor(row_offset / N)
  max_col: int  # upper bound of the feature's stacked columns (-1: no ids)


class Entries(NamedTuple):
  """Sorted, merged entries: key = q | p | e | low (low_bits wide)."""

  key: np.ndarray  # sorted unsigned keys, one per merged entry
  low_bits: int
  e_bits: int
  bounds: np.ndarray  # entries of group g = q*N + p: [bounds[g], bounds[g+1])
  sample_ids: np.ndarray  # int32 per entry
  gains: np.ndarray  # float32 per entry
  dups: "Dups | None"  # entries merged from several raw ids (None: none)


class Dups(NamedTuple):
  """Merged entries that stand for more than one raw id."""

  entries: np.ndarray  # entry indices, increasing
  counts: np.ndarray  # raw ids of each (>= 2)


def _bit_length(value: int) -> int:
  return max(int(value), 0).bit_length()


def _key_dtype(bits: int, who: str) -> type:
  if bits <= 32:
    return np.uint32
  if bits <= 64:
    return np.uint64
  raise errors.PreprocessingError(f"{who}: the sort key needs {bits} > 64 bits")


def _columns(f: StackFeature, num_sc: int) -> np.ndarray:
  """Stacked-table column of every id (MOD id transformation), int64."""
  ids = f.x.values
  t = f.spec.id_transformation
  if not (t.col_shift or t.col_offset):
    return ids
  ids = ids.astype(np.int64)
  mask = num_sc - 1
  return ((ids + t.col_shift) & mask) + (ids & ~mask) + t.col_offset


def _as_key(cols: np.ndarray, dtype) -> np.ndarray:
  """cols (range-checked, so non-negative) as `dtype`: a view when widths match."""
  c = cols.dtype
  if c.kind in "iu" and c.isnative and c.itemsize == np.dtype(dtype).itemsize:
    return cols.view(dtype)
  return cols.astype(dtype)


def _pack_partition_row(
  cols: np.ndarray,
  key: np.ndarray,
  dtype,
  log_n: int,
  p_shift: int,
  low_bits: int,
) -> None:
  """key += (col mod N) << p_shift | (col div N) << low_bits, in place.

  With col = e*N + p: col << (low_bits - log_n) is e << low_bits plus
  p << (low_bits - log_n), so adding p * (2**p_shift - 2**(low_bits -
  log_n)) moves p to its field: 5 passes, one temporary, cols untouched.
  """
  c = _as_key(cols, dtype)
  part = c & dtype(2**log_n - 1)
  if low_bits >= log_n:
    part *= dtype(2**p_shift - 2 ** (low_bits - log_n))
    key += part
    np.left_shift(c, dtype(low_bits - log_n), out=part)
  else:
    part <<= dtype(p_shift)
    key += part
    np.right_shift(c, dtype(log_n), out=part)
    part <<= dtype(low_bits)
  key += part


@functools.lru_cache(maxsize=1024)
def _row_keys(
  l_sc: int, rows_per_sc: int, sid_base: int, q_shift: int | None, dtype: type
) -> np.ndarray:
  """(q << q_shift) | sid of every row of a feature (rows are q-major).

  q_shift None leaves q out (keys sorted per SC, q added afterwards).
  """
  sid = sid_base + np.tile(np.arange(rows_per_sc, dtype=np.uint64), l_sc)
  if q_shift is not None:
    q = np.repeat(np.arange(l_sc, dtype=np.uint64), rows_per_sc)
    sid |= q << np.uint64(q_shift)
  keys = sid.astype(dtype)
  keys.flags.writeable = False
  return keys


@functools.lru_cache(maxsize=256)
def _q_keys(l_sc: int, q_shift: int) -> np.ndarray:
  keys = np.arange(l_sc, dtype=np.uint64) << np.uint64(q_shift)
  keys.flags.writeable = False
  return keys


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
  f: StackFeature,
  dtype: type,
  l_sc: int,
  n_sc: int,
  low_bits: int,
  p_shift: int,
  q_shift: int,
) -> np.ndarray:
  """Sorted raw keys of a stack of one feature, whose ids are q-major.

  Sorted per SC; when only q needs 64 bits, the keys are built and sorted
  as uint32 without q (half the memory, about twice as fast) and q is
  or-ed in after.
  """
  lengths = f.x.row_lengths
  log_n = n_sc.bit_length() - 1
  narrow = dtype == np.uint64 and q_shift <= 32
  build = np.uint32 if narrow else dtype
  key = _row_keys(l_sc, f.rows_per_sc, f.sid_base, None if narrow else q_shift, build).repeat(
    lengths
  )
  _pack_partition_row(_columns(f, n_sc), key, build, log_n, p_shift, low_bits)
  q_ends = np.cumsum(lengths)[f.rows_per_sc - 1 :: f.rows_per_sc]
  _sort_q_major(key, q_ends)
  if narrow:
    per_q = np.empty(l_sc, np.intp)
    per_q[0] = q_ends[0]
    np.subtract(q_ends[1:], q_ends[:-1], out=per_q[1:])
    key = np.bitwise_or(key, _q_keys(l_sc, q_shift).repeat(per_q))
  return key


def new_flags(key: np.ndarray) -> np.ndarray:
  """True where a sorted key differs from its predecessor (and at 0)."""
  flags = np.empty(key.shape[0], bool)
  flags[:1] = True
  np.not_equal(key[1:], key[:-1], out=flags[1:])
  return flags


def _find_dups(new: np.ndarray) -> Dups | None:
  """Merged entries of runs (`new` marks run starts); cost ~ #duplicates.

  The k-th raw id that is not a run start (position d) belongs to entry
  d - k - 1, so the entries with duplicates come from the duplicate
  positions alone.
  """
  owner = np.logical_not(new).nonzero()[0]
  if not owner.size:
    return None
  owner -= np.arange(1, owner.shape[0] + 1)
  firsts = new_flags(owner).nonzero()[0]
  counts = np.empty(firsts.shape[0], np.intp)
  np.subtract(firsts[1:], firsts[:-1], out=counts[:-1])
  counts[-1] = owner.shape[0] - firsts[-1]
  counts += 1
  return Dups(owner[firsts], counts)


def _merge_equal(key: np.ndarray) -> tuple[np.ndarray, Dups | None]:
  """Sorted keys without repeats, and which entries stood for several."""
  new = new_flags(key)
  dups = _find_dups(new)
  return (key, None) if dups is None else (key[new], dups)


@functools.lru_cache(maxsize=256)
def _group_firsts(dtype: type, num_groups: int, shift: int) -> np.ndarray:
  firsts = np.arange(num_groups, dtype=dtype) << dtype(shift)
  firsts.flags.writeable = False
  return firsts


def _group_bounds(key: np.ndarray, num_groups: int, shift: int) -> np.ndarray:
  """bounds[g]: first entry of group g (key >> shift == g); bounds[-1] = n."""
  bounds = np.empty(num_groups + 1, np.intp)
  bounds[:-1] = key.searchsorted(_group_firsts(key.dtype.type, num_groups, shift))
  bounds[-1] = key.shape[0]
  return bounds


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


@functools.lru_cache(maxsize=256)
def _q_bases(l_sc: int, per_sc: int) -> np.ndarray:
  bases = np.arange(0, l_sc * per_sc, per_sc, dtype=np.intp)
  bases.flags.writeable = False
  return bases


def sort_by_sample(
  feats: Sequence[StackFeature], combiner: str, geo: coo_layout.Geometry, who: str
) -> Entries:
  """Unweighted: key = q | p | e | sid; gains looked up per (q, sid)."""
  n_sc, l_sc = geo.num_sc, geo.local_sc
  log_n = n_sc.bit_length() - 1
  per_sc = max(f.sid_base + f.rows_per_sc for f in feats)
  low_bits = _bit_length(per_sc - 1)
  e_bits = _bit_length(max(f.max_col for f in feats) >> log_n)
  p_shift = e_bits + low_bits
  q_shift = p_shift + log_n
  dtype = _key_dtype(q_shift + _bit_length(l_sc - 1), who)
  if len(feats) == 1:
    key = _single_feature_keys(feats[0], dtype, l_sc, n_sc, low_bits, p_shift, q_shift)
  else:
    row_keys = [_row_keys(l_sc, f.rows_per_sc, f.sid_base, q_shift, dtype) for f in feats]
    key = np.concatenate(row_keys).repeat(np.concatenate([f.x.row_lengths for f in feats]))
    col = np.concatenate([_columns(f, n_sc) for f in feats])
    _pack_partition_row(col, key, dtype, log_n, p_shift, low_bits)
    key.sort()
  key, dups = _merge_equal(key)
  bounds = _group_bounds(key, l_sc * n_sc, p_shift)
  sample_ids = key & dtype(2**low_bits - 1)
  sample_ids = sample_ids.view(np.int32) if dtype == np.uint32 else sample_ids.astype(np.int32)
  if combiner == "sum":  # unweighted: sequential sums of ones are exact
    gains = np.ones(key.shape[0], np.float32)
    if dups is not None:
      gains[dups.entries] = dups.counts
    return Entries(key, low_bits, e_bits, bounds, sample_ids, gains, dups)
  # Entries are sorted by q first: q of every entry from the boundaries.
  q_bounds = bounds[::n_sc]
  gain_index = _q_bases(l_sc, per_sc).repeat(q_bounds[1:] - q_bounds[:-1])
  gain_index += sample_ids
  gains = _sample_gains(feats, combiner, l_sc, per_sc).take(gain_index)
  if dups is not None:
    gains = coo_gains.repeated_sums(gains, dups.entries, dups.counts)
  return Entries(key, low_bits, e_bits, bounds, sample_ids, gains, dups)


def sort_by_position(
  feats: Sequence[StackFeature], combiner: str, geo: coo_layout.Geometry, who: str
) -> Entries:
  """Weighted: key = q | p | e | i; sample id and gain gathered by i."""
  n_sc, l_sc = geo.num_sc, geo.local_sc
  log_n = n_sc.bit_length() - 1
  cols = [_columns(f, n_sc) for f in feats]
  total = sum(c.shape[0] for c in cols)
  low_bits = _bit_length(total - 1)
  e_bits = _bit_length(max(f.max_col for f in feats) >> log_n)
  p_shift = e_bits + low_bits
  q_shift = p_shift + log_n
  dtype = _key_dtype(q_shift + _bit_length(l_sc - 1), who)
  q_parts, sid_parts, gain_parts = [], [], []
  for f in feats:
    n = f.rows_per_sc
    lengths = f.x.row_lengths
    ends = np.cumsum(lengths)
    per_q = np.diff(ends[n - 1 :: n], prepend=0)
    q_parts.append(np.repeat(np.arange(l_sc, dtype=dtype) << dtype(q_shift), per_q))
    sid = f.sid_base + np.arange(f.x.batch_size, dtype=np.int32) % n
    sid_parts.append(np.repeat(sid.astype(np.int32), lengths))
    row_gain, id_gain = coo_gains.id_gains(combiner, lengths, f.x.weights)
    gain_parts.append(np.repeat(row_gain, lengths) if id_gain is None else id_gain)
  key = np.concatenate(q_parts)
  key |= np.arange(total, dtype=dtype)
  col = np.concatenate(cols) if len(cols) > 1 else cols[0]
  _pack_partition_row(col, key, dtype, log_n, p_shift, low_bits)
  key.sort()

  position = (key & dtype(2**low_bits - 1)).astype(np.intp)
  sample_ids = np.take(np.concatenate(sid_parts), position)
  gains = np.take(np.concatenate(gain_parts), position)
  # Duplicates: same (q, p, e) and same sample (adjacent, positions grow).
  new = new_flags(key >> dtype(low_bits))
  new[1:] |= sample_ids[1:] != sample_ids[:-1]
  dups = None
  if np.count_nonzero(new) < key.shape[0]:
    first = np.flatnonzero(new)
    gains = coo_gains.run_sums(gains, first, np.diff(first, append=key.shape[0]))
    dups = _find_dups(new)
    key, sample_ids = key[first], sample_ids[first]
  bounds = _group_bounds(key, l_sc * n_sc, p_shift)
  return Entries(key, low_bits, e_bits, bounds, sample_ids, gains, dups)

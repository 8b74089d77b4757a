"""COO buffers and statistics of one stack (coo_format.md), vectorised numpy.

All ids of a stack (every local device and SparseCore) are packed into one
unsigned key each and sorted once with np.sort (much faster than argsort):

    unweighted:  key = q | p | e | sid    (q = d*S+s, p partition, e local
    weighted:    key = q | p | e | i       row, sid sample id on the SC, i
                                          position of the id in the stack)

The reference sorts by (p, e, sid, position) per SC. Unweighted, the
duplicates of one id in one sample have equal gains, so their order does
not matter and equal keys are exactly the entries to merge. Weighted, the
position i orders them as the reference does: inside one SC positions grow
with (sid, position in sample), because features are concatenated in
row_offset order. Keys are uint32 when the fields fit, else uint64.

Everything else is decoded from the sorted keys: runs of equal (q, p, e)
are the unique ids, the (q, p) prefix gives the partition boundaries by a
binary search, and partition offsets place every entry in the buffer.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Sequence

import numpy as np

from sparsepipe.transforms import coo_gains
from sparsepipe.transforms import coo_inputs
from sparsepipe.transforms import coo_layout
from sparsepipe.transforms import errors
from sparsepipe.transforms import specs as specs_lib

_INT_MAX = coo_layout.INT_MAX


@dataclasses.dataclass(frozen=True)
class Geometry:
  """Device geometry of one preprocessing call."""

  local_devices: int  # L
  global_devices: int  # G
  sc_per_device: int  # S

  @property
  def num_sc(self) -> int:  # N
    return self.global_devices * self.sc_per_device

  @property
  def local_sc(self) -> int:  # L*S
    return self.local_devices * self.sc_per_device

  @property
  def row_pointer_stride(self) -> int:  # R
    return max(self.num_sc, coo_layout.ALIGNMENT)


@dataclasses.dataclass
class StackResult:
  """Buffers (flat, local devices concatenated) and statistics of one stack."""

  row_pointers: np.ndarray  # int32 [L*R*S]
  embedding_ids: np.ndarray  # int32 [L*C]
  sample_ids: np.ndarray  # int32 [L*C]
  gains: np.ndarray  # float32 [L*C]
  max_ids_per_partition: np.ndarray  # int32 [L*N]
  max_unique_ids_per_partition: np.ndarray  # int32 [L*N]
  required_buffer_size_per_sc: np.ndarray  # int32 [L*S]
  id_drop_counter: int


class _Feature(NamedTuple):
  """One checked feature of the stack."""

  spec: specs_lib.FeatureSpec
  x: coo_inputs.FeatureInput
  rows_per_sc: int  # n_f
  sid_base: int  # floor(row_offset / N)
  max_col: int  # upper bound of the feature's stacked columns (-1: no ids)


class _Entries(NamedTuple):
  """Sorted, merged entries: key = q | p | e | low (low_bits wide)."""

  key: np.ndarray  # sorted unsigned keys, one per merged entry
  low_bits: int
  e_bits: int
  starts: np.ndarray  # first entry of every (q, p) group, int64 [L*S*N]
  sample_ids: np.ndarray  # int32 per entry
  gains: np.ndarray  # float32 per entry
  dups: "_Dups | None"  # entries merged from several raw ids (None: none)


class _Dups(NamedTuple):
  """Merged entries that stand for more than one raw id."""

  entries: np.ndarray  # entry indices, increasing
  counts: np.ndarray  # raw ids of each (>= 2)


def _find_dups(new: np.ndarray) -> _Dups | None:
  """Merged entries of runs (`new` marks run starts); cost ~ #duplicates.

  The k-th raw id that is not a run start (position d) belongs to entry
  d - k - 1, so the entries with duplicates come from the duplicate
  positions alone.
  """
  dup_positions = np.flatnonzero(~new)
  if not dup_positions.size:
    return None
  owner = dup_positions - np.arange(1, dup_positions.size + 1)
  starts = np.flatnonzero(_new_flags(owner))
  counts = np.diff(starts, append=owner.size) + 1
  return _Dups(owner[starts], counts)


def _who(stack: str, features: Sequence[_Feature]) -> str:
  if len(features) == 1:
    return f"feature '{features[0].spec.name}' (stack '{stack}')"
  names = ", ".join(f"'{f.spec.name}'" for f in features)
  return f"features {names} (stack '{stack}')"


def _bit_length(value: int) -> int:
  return max(int(value), 0).bit_length()


def _key_dtype(bits: int, who: str) -> type:
  if bits <= 32:
    return np.uint32
  if bits <= 64:
    return np.uint64
  raise errors.PreprocessingError(f"{who}: the sort key needs {bits} > 64 bits")


def _check_feature(
    stack: str, spec: specs_lib.FeatureSpec, x: coo_inputs.FeatureInput,
    geo: Geometry,
) -> int:
  """Batch splits evenly over local SCs, matches the spec; ids in range.

  Returns the largest id (-1 without ids).
  """
  batch = x.batch_size
  who = f"feature '{spec.name}' (stack '{stack}')"
  if batch % geo.local_sc:
    raise errors.PreprocessingError(
        f"{who}: batch of {batch} rows is not divisible by"
        f" local_device_count*num_sc_per_device="
        f"{geo.local_devices}*{geo.sc_per_device}={geo.local_sc}"
    )
  if batch * geo.global_devices != spec.global_batch_size * geo.local_devices:
    raise errors.PreprocessingError(
        f"{who}: batch of {batch} rows on this host does not match the global"
        f" batch {spec.global_batch_size} of its spec for {geo.local_devices}"
        f" local of {geo.global_devices} global devices (expected"
        f" {spec.global_batch_size * geo.local_devices // geo.global_devices})"
    )
  values = x.values
  if values.size == 0:
    return -1
  vocab = spec.table_spec.vocabulary_size
  lo, hi = int(values.min()), int(values.max())
  if lo >= 0 and hi < vocab:
    return hi
  bad = lo if lo < 0 else hi
  position = int(np.flatnonzero(values == bad)[0])
  sample = int(np.searchsorted(np.cumsum(x.row_lengths), position, "right"))
  raise errors.PreprocessingError(
      f"{who}: id {bad} in sample {sample} is outside the vocabulary"
      f" [0, {vocab}) of table '{spec.table_spec.name}'"
  )


def _columns(f: _Feature, num_sc: int) -> np.ndarray:
  """Stacked-table column of every id (MOD id transformation), int64."""
  ids = f.x.values
  t = f.spec.id_transformation
  if not (t.col_shift or t.col_offset):
    return ids
  ids = ids.astype(np.int64)
  mask = num_sc - 1
  return ((ids + t.col_shift) & mask) + (ids & ~mask) + t.col_offset


def _pack_partition_row(
    cols: np.ndarray, key: np.ndarray, dtype, log_n: int, p_shift: int,
    low_bits: int,
) -> None:
  """key |= (col mod N) << p_shift | (col div N) << low_bits, in place.

  With col = e*N + p: col << (low_bits - log_n) is e << low_bits plus
  p << (low_bits - log_n), so adding p * (2**p_shift - 2**(low_bits -
  log_n)) moves p to its field: 6 passes instead of 7.
  """
  c = cols.astype(dtype)
  part = c & dtype(2**log_n - 1)
  if low_bits >= log_n:
    part *= dtype(2**p_shift - 2**(low_bits - log_n))
    c <<= dtype(low_bits - log_n)
    key += c
  else:
    part <<= dtype(p_shift)
    c >>= dtype(log_n)
    c <<= dtype(low_bits)
    key |= c
  key += part


def _arange(n: int) -> np.ndarray:
  """Read-only view of 0..n-1 (intp) from a cache that grows as needed."""
  global _ARANGE
  if _ARANGE.shape[0] < n:
    _ARANGE = np.arange(max(n, 2 * _ARANGE.shape[0]), dtype=np.intp)
    _ARANGE.flags.writeable = False
  return _ARANGE[:n]


_ARANGE = np.zeros(0, np.intp)


def _group_starts(key: np.ndarray, dtype, num_groups: int, shift: int) -> np.ndarray:
  """Index of the first key of every group (key >> shift == group)."""
  return np.searchsorted(
      key, np.arange(num_groups, dtype=dtype) << dtype(shift), "left")


def _repeated_sums(gains: np.ndarray, dups: _Dups) -> np.ndarray:
  """gains with g + g + ... (count times, left to right) at the dups."""
  v = gains[dups.entries]
  part = v.copy()
  for j in range(1, int(dups.counts.max())):
    np.add(part, v, out=part, where=dups.counts > j)
  gains[dups.entries] = part
  return gains


def _sums_in_order(
    values: np.ndarray, starts: np.ndarray, run_lengths: np.ndarray
) -> np.ndarray:
  """float32 sums of values[s : s+len] per run, added left to right."""
  acc = values[starts]
  multi = np.flatnonzero(run_lengths > 1)
  if multi.size:
    order = np.argsort(-run_lengths[multi], kind="stable")
    multi = multi[order]
    lengths = run_lengths[multi]
    multi_starts = starts[multi]
    part = acc[multi]
    active = np.searchsorted(-lengths, -np.arange(1, int(lengths[0])), "left")
    for j, count in enumerate(active.tolist(), start=1):
      part[:count] += values[multi_starts[:count] + j]
    acc[multi] = part
  return acc


@functools.lru_cache(maxsize=1024)
def _row_keys(l_sc: int, rows_per_sc: int, sid_base: int, q_shift: int,
              dtype: type) -> np.ndarray:
  """(q << q_shift) | sid of every row of a feature (rows are q-major)."""
  q = np.repeat(np.arange(l_sc, dtype=np.uint64), rows_per_sc)
  sid = sid_base + np.tile(np.arange(rows_per_sc, dtype=np.uint64), l_sc)
  keys = ((q << np.uint64(q_shift)) | sid).astype(dtype)
  keys.flags.writeable = False
  return keys


def _new_flags(key: np.ndarray) -> np.ndarray:
  """True where a sorted key differs from its predecessor (and at 0)."""
  flags = np.empty(key.shape[0], bool)
  flags[:1] = True
  np.not_equal(key[1:], key[:-1], out=flags[1:])
  return flags


def _sort_by_sample(
    feats: Sequence[_Feature], combiner: str, geo: Geometry, who: str
) -> _Entries:
  """Unweighted: key = q | p | e | sid; gains looked up per (q, sid)."""
  n_sc, l_sc = geo.num_sc, geo.local_sc
  log_n = n_sc.bit_length() - 1
  per_sc = max(f.sid_base + f.rows_per_sc for f in feats)
  low_bits = _bit_length(per_sc - 1)
  cols = [_columns(f, n_sc) for f in feats]
  e_bits = _bit_length(max(f.max_col for f in feats) >> log_n)
  p_shift = e_bits + low_bits
  q_shift = p_shift + log_n
  dtype = _key_dtype(q_shift + _bit_length(l_sc - 1), who)
  row_keys = [
      _row_keys(l_sc, f.rows_per_sc, f.sid_base, q_shift, dtype) for f in feats]
  lengths = [f.x.row_lengths for f in feats]
  if len(feats) == 1:
    key = np.repeat(row_keys[0], lengths[0])
    col = cols[0]
  else:
    key = np.repeat(np.concatenate(row_keys), np.concatenate(lengths))
    col = np.concatenate(cols)
  _pack_partition_row(col, key, dtype, log_n, p_shift, low_bits)
  key.sort()

  new = _new_flags(key)
  dups = None
  if np.count_nonzero(new) < key.shape[0]:
    dups = _find_dups(new)
    key = key[new]
  starts = _group_starts(key, dtype, l_sc * n_sc, e_bits + low_bits)
  sample_ids = key & dtype(2**low_bits - 1)
  sample_ids = (sample_ids.view(np.int32) if dtype == np.uint32
                else sample_ids.astype(np.int32))
  if combiner == "sum":  # unweighted: sequential sums of ones are exact
    gains = np.ones(key.shape[0], np.float32)
    if dups is not None:
      gains[dups.entries] = dups.counts
    return _Entries(key, low_bits, e_bits, starts, sample_ids, gains, dups)
  # Gain of (q, sid): rows are q-major with per_sc samples per SC.
  if len(feats) == 1 and feats[0].sid_base == 0:
    gain_table, _ = coo_gains.id_gains(combiner, lengths[0], None)
  else:
    gain_table = np.zeros(l_sc * per_sc, np.float32)
    for f in feats:
      row_gain, _ = coo_gains.id_gains(combiner, f.x.row_lengths, None)
      rows = np.arange(f.x.batch_size)
      q, j = np.divmod(rows, f.rows_per_sc)
      gain_table[q * per_sc + f.sid_base + j] = row_gain
  # Entries are sorted by q first: q of every entry from the boundaries.
  per_q = np.diff(np.append(starts[::n_sc], key.shape[0]))
  gain_index = np.repeat(np.arange(0, l_sc * per_sc, per_sc, dtype=np.intp), per_q)
  gain_index += sample_ids
  gains = np.take(gain_table, gain_index)
  if dups is not None:
    gains = _repeated_sums(gains, dups)
  return _Entries(key, low_bits, e_bits, starts, sample_ids, gains, dups)


def _sort_by_position(
    feats: Sequence[_Feature], combiner: str, geo: Geometry, who: str
) -> _Entries:
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
  new = _new_flags(key >> dtype(low_bits))
  new[1:] |= sample_ids[1:] != sample_ids[:-1]
  dups = None
  if np.count_nonzero(new) < key.shape[0]:
    first = np.flatnonzero(new)
    gains = _sums_in_order(gains, first, np.diff(first, append=key.shape[0]))
    dups = _find_dups(new)
    key, sample_ids = key[first], sample_ids[first]
  starts = _group_starts(key, dtype, l_sc * n_sc, e_bits + low_bits)
  return _Entries(key, low_bits, e_bits, starts, sample_ids, gains, dups)


def preprocess_stack(
    stack_name: str,
    stacked_spec: specs_lib.StackedTableSpec,
    features: Sequence[tuple[specs_lib.FeatureSpec, coo_inputs.FeatureInput]],
    geo: Geometry,
    allow_id_dropping: bool,
) -> StackResult:
  """Builds the COO buffers and statistics of one stack.

  Args:
    stack_name: name keying the outputs.
    stacked_spec: limits and combiner of the stack.
    features: (spec, input) of every feature of the stack, any order.
    geo: device geometry.
    allow_id_dropping: drop ids over the limits (counted) instead of raising.

  Returns:
    The stack's buffers and statistics.
  """
  feats = []
  for spec, x in sorted(features, key=lambda fx: fx[0].id_transformation.row_offset):
    max_id = _check_feature(stack_name, spec, x, geo)
    t = spec.id_transformation
    # Largest stacked column: col_offset + the id's row rounded up to N.
    max_col = (max_id if not (t.col_shift or t.col_offset)
               else t.col_offset + (max_id | (geo.num_sc - 1)))
    feats.append(_Feature(
        spec, x, x.batch_size // geo.local_sc,
        t.row_offset // geo.num_sc, max_col))
  who = _who(stack_name, feats)
  for before, after in zip(feats, feats[1:]):
    if after.sid_base < before.sid_base + before.rows_per_sc:
      raise errors.PreprocessingError(
          f"{who}: feature '{after.spec.name}' (row_offset"
          f" {after.spec.id_transformation.row_offset}) overlaps the samples"
          f" of feature '{before.spec.name}'")
  limits = (int(stacked_spec.max_ids_per_partition),
            int(stacked_spec.max_unique_ids_per_partition))
  if min(limits) < 1:
    raise errors.PreprocessingError(
        f"{who}: max_ids_per_partition={limits[0]} and"
        f" max_unique_ids_per_partition={limits[1]} must be positive")
  coo_size = coo_layout.compute_coo_buffer_size_per_device(
      stacked_spec, geo.sc_per_device, geo.global_devices)
  nonempty = [f for f in feats if f.x.values.size]
  if not nonempty:
    return _empty_result(geo, coo_size)
  if any(f.x.weights is not None for f in nonempty):
    entries = _sort_by_position(nonempty, stacked_spec.combiner, geo, who)
  else:
    entries = _sort_by_sample(nonempty, stacked_spec.combiner, geo, who)
  return _layout(entries, who, stacked_spec, limits, coo_size, geo,
                 allow_id_dropping)


def _layout(
    ent: _Entries,
    who: str,
    stacked_spec: specs_lib.StackedTableSpec,
    limits: tuple[int, int],
    coo_size: int,
    geo: Geometry,
    allow_id_dropping: bool,
) -> StackResult:
  """Statistics, limits and the buffer layout of sorted, merged entries."""
  l_sc, n_sc = geo.local_sc, geo.num_sc
  num_groups = l_sc * n_sc
  seg = coo_size // geo.sc_per_device
  key = ent.key
  dtype = key.dtype.type
  n = key.shape[0]
  starts = ent.starts
  bounds = np.empty(num_groups + 1, np.intp)
  bounds[:-1] = starts
  bounds[-1] = n
  counts = np.diff(bounds)
  row_key = key >> dtype(ent.low_bits)
  new_row = np.empty(n + 1, bool)  # + a False sentinel: starts may be n
  new_row[0] = True
  np.not_equal(row_key[1:], row_key[:-1], out=new_row[1:n])
  new_row[n] = False
  uniques = np.add.reduceat(new_row, starts, dtype=np.intp)
  uniques[counts == 0] = 0
  new_row = new_row[:n]

  shape3 = (geo.local_devices, geo.sc_per_device, n_sc)
  stat_ids = counts.reshape(shape3).max(axis=1).reshape(-1).astype(np.int32)
  stat_unique = uniques.reshape(shape3).max(axis=1).reshape(-1).astype(np.int32)
  padded = ((counts + 7) & ~7).reshape(l_sc, n_sc)
  required = padded.sum(axis=1).astype(np.int32)

  max_ids, max_unique = limits
  kept = None
  if int(counts.max()) > max_ids or int(uniques.max()) > max_unique:
    if not allow_id_dropping:
      _raise_partition_limit(who, counts, uniques, max_ids, max_unique, geo)
    group = np.repeat(np.arange(num_groups), counts)
    rank = np.arange(n) - starts[group]
    rows_upto = np.cumsum(new_row, dtype=np.intp)  # rows in [0, i]
    rows_before_group = (rows_upto - new_row)[np.minimum(starts, n - 1)]
    unique_rank = rows_upto - 1 - rows_before_group[group]
    kept = (rank < max_ids) & (unique_rank < max_unique)
    kept_counts = np.bincount(group[kept], minlength=num_groups)
    padded = ((kept_counts + 7) & ~7).reshape(l_sc, n_sc)
  else:
    kept_counts = counts
  aligned_end = np.cumsum(padded, axis=1)
  aligned_start = aligned_end - padded
  sc_base = (np.arange(l_sc) * seg)[:, None]
  if kept is None:
    offset = (aligned_start + sc_base).reshape(-1) - starts
    out = np.repeat(offset, counts)
    out += _arange(n)
  else:
    out = (aligned_start + sc_base).reshape(-1)[group] + rank
  if int(aligned_end[:, -1].max()) > seg:  # only when Q is too small
    if kept is None:
      group = np.repeat(np.arange(num_groups), counts)
      rank = np.arange(n) - starts[group]
    overflow = aligned_start.reshape(-1)[group] + rank >= seg
    if kept is not None:
      overflow &= kept
    if overflow.any():
      if not allow_id_dropping:
        _raise_overflow(who, aligned_end[:, -1], seg, coo_size, stacked_spec, geo)
      kept = ~overflow if kept is None else kept & ~overflow

  e = row_key
  e &= dtype(2**ent.e_bits - 1)
  e = e.view(np.int32) if dtype == np.uint32 else e.astype(np.int32)
  sample_ids, gains = ent.sample_ids, ent.gains
  drops = 0
  if kept is not None:
    dropped = ~kept
    drops = int(np.count_nonzero(dropped))
    if ent.dups is not None:  # a merged entry drops all its raw ids
      drops += int((ent.dups.counts - 1)[dropped[ent.dups.entries]].sum())
    out, e, sample_ids, gains = out[kept], e[kept], sample_ids[kept], gains[kept]

  total = geo.local_devices * coo_size
  embedding_ids = np.full(total, _INT_MAX, np.int32)
  out_sample_ids = np.full(total, _INT_MAX, np.int32)
  out_gains = np.full(total, np.nan, np.float32)
  embedding_ids[out] = e
  out_sample_ids[out] = sample_ids
  out_gains[out] = gains

  stride = geo.row_pointer_stride
  row_pointers = np.empty((l_sc, stride), np.int32)
  np.minimum(aligned_start + kept_counts.reshape(l_sc, n_sc), seg,
             out=row_pointers[:, :n_sc])
  if stride > n_sc:
    row_pointers[:, n_sc:] = np.minimum(aligned_end[:, -1:], seg)
  return StackResult(
      row_pointers=row_pointers.reshape(-1),
      embedding_ids=embedding_ids,
      sample_ids=out_sample_ids,
      gains=out_gains,
      max_ids_per_partition=stat_ids,
      max_unique_ids_per_partition=stat_unique,
      required_buffer_size_per_sc=required,
      id_drop_counter=drops,
  )


def _empty_result(geo: Geometry, coo_size: int) -> StackResult:
  total = geo.local_devices * coo_size
  return StackResult(
      row_pointers=np.zeros(geo.local_sc * geo.row_pointer_stride, np.int32),
      embedding_ids=np.full(total, _INT_MAX, np.int32),
      sample_ids=np.full(total, _INT_MAX, np.int32),
      gains=np.full(total, np.nan, np.float32),
      max_ids_per_partition=np.zeros(geo.local_devices * geo.num_sc, np.int32),
      max_unique_ids_per_partition=np.zeros(
          geo.local_devices * geo.num_sc, np.int32),
      required_buffer_size_per_sc=np.zeros(geo.local_sc, np.int32),
      id_drop_counter=0,
  )


def _where(group: int, geo: Geometry) -> str:
  q, p = divmod(group, geo.num_sc)
  d, s = divmod(q, geo.sc_per_device)
  return f"partition {p} of device {d} SC {s}"


def _raise_partition_limit(
    who: str, counts: np.ndarray, uniques: np.ndarray, max_ids: int,
    max_unique: int, geo: Geometry,
) -> None:
  if int(counts.max()) > max_ids:
    group = int(np.argmax(counts))
    raise errors.LimitExceededError(
        f"{who}: {counts[group]} ids in {_where(group, geo)} exceed"
        f" max_ids_per_partition={max_ids}")
  group = int(np.argmax(uniques))
  raise errors.LimitExceededError(
      f"{who}: {uniques[group]} unique ids in {_where(group, geo)} exceed"
      f" max_unique_ids_per_partition={max_unique}")


def _raise_overflow(
    who: str, needed: np.ndarray, seg: int, coo_size: int,
    stacked_spec: specs_lib.StackedTableSpec, geo: Geometry,
) -> None:
  q = int(np.argmax(needed))
  d, s = divmod(q, geo.sc_per_device)
  raise errors.LimitExceededError(
      f"{who}: device {d} SC {s} needs {needed[q]} COO entries but"
      f" suggested_coo_buffer_size_per_device="
      f"{stacked_spec.suggested_coo_buffer_size_per_device} gives {coo_size}"
      f" per device, {seg} per SC")

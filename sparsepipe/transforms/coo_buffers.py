"""Statistics, limits and the buffer layout of one stack's sorted entries.

Entries arrive sorted by (q, p, e, sample) and merged, with the bounds of
every partition (q, p). Statistics are taken before any dropping. Then
partition (q, p) of SC q starts at q*seg + the aligned (multiple of 8) end
of the partitions before it, its entries follow in order, and the rest of
the buffers holds (INT_MAX, INT_MAX, NaN) (docs/coo_format.md).

When nothing is dropped the entries fill the buffers in order, so one
boolean mask of the written slots (built by np.repeat from the partition
sizes) places all of them; dropping needs every entry's target slot.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from sparsepipe.transforms import coo_layout
from sparsepipe.transforms import coo_sort
from sparsepipe.transforms import errors
from sparsepipe.core import specs as specs_lib

_INT_MAX = coo_layout.INT_MAX


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


def _filled(size: int, value, dtype) -> np.ndarray:
  out = np.empty(size, dtype)
  out.fill(value)
  return out


@functools.lru_cache(maxsize=64)
def _written_pattern(l_sc: int, n_sc: int) -> np.ndarray:
  """Per SC [True, False] * n_sc + [False], read-only."""
  pattern = np.zeros((l_sc, 2 * n_sc + 1), bool)
  pattern[:, 0:-1:2] = True
  pattern = pattern.reshape(-1)
  pattern.flags.writeable = False
  return pattern


def _unique_counts(row_key: np.ndarray, bounds: np.ndarray) -> np.ndarray:
  """Distinct (q, p, e) per partition: entries whose row_key is new."""
  n = row_key.shape[0]
  new = np.empty(n + 1, bool)  # + a False sentinel: a start may be n
  new[0] = True
  np.not_equal(row_key[1:], row_key[:-1], out=new[1:n])
  new[n] = False
  uniques = np.add.reduceat(new, bounds[:-1], dtype=np.int32)
  uniques[bounds[1:] == bounds[:-1]] = 0
  return uniques


def layout(
    ent: coo_sort.Entries,
    who: str,
    stacked_spec: specs_lib.StackedTableSpec,
    limits: tuple[int, int],
    coo_size: int,
    geo: coo_layout.Geometry,
    allow_id_dropping: bool,
) -> StackResult:
  """Statistics, limits and the buffer layout of sorted, merged entries."""
  l_sc, n_sc = geo.local_sc, geo.num_sc
  seg = coo_size // geo.sc_per_device
  key, bounds = ent.key, ent.bounds
  dtype = key.dtype.type
  counts = bounds[1:] - bounds[:-1]
  row_key = key >> dtype(ent.low_bits)
  uniques = _unique_counts(row_key, bounds)
  shape3 = (geo.local_devices, geo.sc_per_device, n_sc)
  stat_ids = counts.reshape(shape3).max(axis=1)
  stat_unique = uniques.reshape(shape3).max(axis=1)
  counts = counts.reshape(l_sc, n_sc)
  pad = -counts & 7
  padded = counts + pad
  aligned_end = padded.cumsum(axis=1)
  e = row_key
  e &= dtype(2**ent.e_bits - 1)
  e = e.view(np.int32) if dtype == np.uint32 else e.astype(np.int32)
  result = StackResult(
      row_pointers=np.empty((l_sc, geo.row_pointer_stride), np.int32),
      embedding_ids=_filled(l_sc * seg, _INT_MAX, np.int32),
      sample_ids=_filled(l_sc * seg, _INT_MAX, np.int32),
      gains=_filled(l_sc * seg, np.nan, np.float32),
      max_ids_per_partition=stat_ids.astype(np.int32).reshape(-1),
      max_unique_ids_per_partition=stat_unique.astype(np.int32).reshape(-1),
      required_buffer_size_per_sc=aligned_end[:, -1].astype(np.int32),
      id_drop_counter=0,
  )
  max_ids, max_unique = limits
  if (int(stat_ids.max()) <= max_ids and int(stat_unique.max()) <= max_unique
      and int(aligned_end[:, -1].max()) <= seg):
    _place_all(result, ent, e, counts, pad, aligned_end, seg)
  else:
    _place_dropping(result, ent, e, counts, uniques, who, stacked_spec,
                    limits, seg, geo, allow_id_dropping)
  result.row_pointers = result.row_pointers.reshape(-1)
  return result


def _place_all(
    result: StackResult, ent: coo_sort.Entries, e: np.ndarray,
    counts: np.ndarray, pad: np.ndarray, aligned_end: np.ndarray, seg: int,
) -> None:
  """Writes every entry: in order, into the slots of one boolean mask."""
  l_sc, n_sc = counts.shape
  # Per SC: count_0 slots written, pad_0 not, ..., count_N-1, pad_N-1, tail.
  sizes = np.empty((l_sc, 2 * n_sc + 1), np.intp)
  sizes[:, 0:-1:2] = counts
  sizes[:, 1:-1:2] = pad
  np.subtract(seg, aligned_end[:, -1], out=sizes[:, -1])
  written = _written_pattern(l_sc, n_sc).repeat(sizes.reshape(-1))
  result.embedding_ids[written] = e
  result.sample_ids[written] = ent.sample_ids
  result.gains[written] = ent.gains
  rows = result.row_pointers
  np.subtract(aligned_end, pad, out=rows[:, :n_sc])
  rows[:, n_sc:] = aligned_end[:, -1:]


def _place_dropping(
    result: StackResult, ent: coo_sort.Entries, e: np.ndarray,
    counts: np.ndarray, uniques: np.ndarray, who: str,
    stacked_spec: specs_lib.StackedTableSpec, limits: tuple[int, int],
    seg: int, geo: coo_layout.Geometry, allow_id_dropping: bool,
) -> None:
  """Writes the entries when a partition limit or the buffer size is exceeded.

  Entries over max_ids/max_unique in their partition, then those past the
  end of their SC's segment, are dropped (raising instead unless
  allow_id_dropping); the row pointers stop at the segment end.
  """
  l_sc, n_sc = geo.local_sc, geo.num_sc
  num_groups = l_sc * n_sc
  n = e.shape[0]
  counts = counts.reshape(-1)
  starts = ent.bounds[:-1]
  group = np.repeat(np.arange(num_groups), counts)
  rank = np.arange(n) - starts[group]
  max_ids, max_unique = limits
  kept = None
  kept_counts = counts
  if int(counts.max()) > max_ids or int(uniques.max()) > max_unique:
    if not allow_id_dropping:
      _raise_partition_limit(who, counts, uniques, max_ids, max_unique, geo)
    row_key = ent.key >> ent.key.dtype.type(ent.low_bits)
    new_row = coo_sort.new_flags(row_key)
    rows_upto = np.cumsum(new_row, dtype=np.intp)  # rows in [0, i]
    rows_before_group = (rows_upto - new_row)[np.minimum(starts, n - 1)]
    unique_rank = rows_upto - 1 - rows_before_group[group]
    kept = (rank < max_ids) & (unique_rank < max_unique)
    kept_counts = np.bincount(group[kept], minlength=num_groups)
  padded = ((kept_counts + 7) & ~7).reshape(l_sc, n_sc)
  aligned_end = np.cumsum(padded, axis=1)
  aligned_start = (aligned_end - padded).reshape(-1)
  slot = aligned_start[group] + rank
  overflow = slot >= seg
  if kept is not None:
    overflow &= kept
  if overflow.any():
    if not allow_id_dropping:
      _raise_overflow(who, aligned_end[:, -1], seg, stacked_spec, geo)
    kept = ~overflow if kept is None else kept & ~overflow
  sample_ids, gains = ent.sample_ids, ent.gains
  if kept is not None:
    dropped = ~kept
    drops = int(np.count_nonzero(dropped))
    if ent.dups is not None:  # a merged entry drops all its raw ids
      drops += int((ent.dups.counts - 1)[dropped[ent.dups.entries]].sum())
    result.id_drop_counter = drops
    group, slot = group[kept], slot[kept]
    e, sample_ids, gains = e[kept], sample_ids[kept], gains[kept]
  out = slot + (np.arange(l_sc) * seg).repeat(n_sc)[group]  # + SC's segment
  result.embedding_ids[out] = e
  result.sample_ids[out] = sample_ids
  result.gains[out] = gains
  np.minimum(aligned_start.reshape(l_sc, n_sc) + kept_counts.reshape(l_sc, n_sc),
             seg, out=result.row_pointers[:, :n_sc])
  result.row_pointers[:, n_sc:] = np.minimum(aligned_end[:, -1:], seg)


def empty_result(geo: coo_layout.Geometry, coo_size: int) -> StackResult:
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


def _where(group: int, geo: coo_layout.Geometry) -> str:
  q, p = divmod(group, geo.num_sc)
  d, s = divmod(q, geo.sc_per_device)
  return f"partition {p} of device {d} SC {s}"


def _raise_partition_limit(
    who: str, counts: np.ndarray, uniques: np.ndarray, max_ids: int,
    max_unique: int, geo: coo_layout.Geometry,
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
    who: str, needed: np.ndarray, seg: int,
    stacked_spec: specs_lib.StackedTableSpec, geo: coo_layout.Geometry,
) -> None:
  q = int(np.argmax(needed))
  d, s = divmod(q, geo.sc_per_device)
  coo_size = seg * geo.sc_per_device
  raise errors.LimitExceededError(
      f"{who}: device {d} SC {s} needs {needed[q]} COO entries but"
      f" suggested_coo_buffer_size_per_device="
      f"{stacked_spec.suggested_coo_buffer_size_per_device} gives {coo_size}"
      f" per device, {seg} per SC")

"""Statistics, limits and the buffer layout of one stack's sorted entries.

Entries arrive sorted by (q, p, e, sample) and merged, with the bounds of
every partition (q, p). Statistics are taken before any dropping. Then
partition (q, p) of SC q starts at q*seg + the aligned (multiple of 8) end
of the partitions before it, its entries follow in order, and the rest of
the buffers holds (INT_MAX, INT_MAX, NaN) (docs/coo_format.md).

Every partition keeps a prefix of its entries (all of them unless a limit
or the segment end cuts it), so the kept entries fill the buffers in order:
one boolean mask of the written slots (np.repeat of the per-partition run
lengths) places all of them, with or without dropping. Only the partitions
over a limit are looked at entry by entry.
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
  padded = ((counts + 7) & ~7).reshape(l_sc, n_sc)
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
  counts = counts.reshape(-1)
  kept_counts = _limit_counts(ent, counts, uniques, limits, who, geo, allow_id_dropping)
  unlimited = kept_counts is counts
  if not unlimited:
    padded = ((kept_counts + 7) & ~7).reshape(l_sc, n_sc)
    aligned_end = padded.cumsum(axis=1)
  aligned_start = aligned_end - padded
  kept_counts = kept_counts.reshape(l_sc, n_sc)
  sample_ids, gains = ent.sample_ids, ent.gains
  if unlimited and int(aligned_end[:, -1].max()) <= seg:
    written = kept_counts  # the common case: every entry fits, nothing to cut
  else:
    # Entries past the end of their SC's segment are dropped too (all of a
    # partition that starts past it, the tail of the one that straddles it).
    written = np.clip(seg - aligned_start, 0, kept_counts)
    if not allow_id_dropping and not np.array_equal(written, kept_counts):
      _raise_overflow(who, aligned_end[:, -1], seg, stacked_spec, geo)
  if written is not kept_counts and not np.array_equal(written.reshape(-1), counts):
    kept = _prefix_mask(written.reshape(-1), counts)
    result.id_drop_counter = _drops(kept, ent.dups)
    e, sample_ids, gains = e[kept], sample_ids[kept], gains[kept]
  _place(result, (e, sample_ids, gains), written, padded, aligned_end, seg)
  rows = result.row_pointers
  np.minimum(aligned_start + kept_counts, seg, out=rows[:, :n_sc])
  rows[:, n_sc:] = np.minimum(aligned_end[:, -1:], seg)
  result.row_pointers = rows.reshape(-1)
  return result


def _limit_counts(
  ent: coo_sort.Entries,
  counts: np.ndarray,
  uniques: np.ndarray,
  limits: tuple[int, int],
  who: str,
  geo: coo_layout.Geometry,
  allow_id_dropping: bool,
) -> np.ndarray:
  """Entries kept per partition under max_ids/max_unique (`counts` itself if all).

  A partition keeps a prefix of its sorted entries: the k-th entry stays iff
  k <= max_ids and its row's distinct rank <= max_unique (both grow with k),
  so only the few partitions over a limit are looked at, one slice each.
  """
  max_ids, max_unique = limits
  over = np.flatnonzero((counts > max_ids) | (uniques > max_unique))
  if not over.size:
    return counts
  if not allow_id_dropping:
    _raise_partition_limit(who, counts, uniques, max_ids, max_unique, geo)
  kept = counts.copy()
  shift = ent.key.dtype.type(ent.low_bits)
  for g in over.tolist():
    start, end = int(ent.bounds[g]), int(ent.bounds[g + 1])
    keep = min(max_ids, end - start)
    if uniques[g] > max_unique:
      row_starts = coo_sort.new_flags(ent.key[start:end] >> shift).nonzero()[0]
      keep = min(keep, int(row_starts[max_unique]))
    kept[g] = keep
  return kept


@functools.lru_cache(maxsize=64)
def _alternating(num_groups: int) -> np.ndarray:
  """[True, False] * num_groups, read-only."""
  pattern = np.zeros(2 * num_groups, bool)
  pattern[0::2] = True
  pattern.flags.writeable = False
  return pattern


def _prefix_mask(kept: np.ndarray, counts: np.ndarray) -> np.ndarray:
  """Per-entry mask keeping the first kept[g] of the counts[g] entries of every group."""
  sizes = np.empty(2 * counts.shape[0], np.intp)
  sizes[0::2] = kept
  np.subtract(counts, kept, out=sizes[1::2])
  return _alternating(counts.shape[0]).repeat(sizes)


def _drops(kept: np.ndarray, dups: coo_sort.Dups | None) -> int:
  """Raw ids dropped: every dropped entry, plus the extra raw ids merged into it."""
  dropped = ~kept
  drops = int(np.count_nonzero(dropped))
  if dups is not None:
    drops += int((dups.counts - 1)[dropped[dups.entries]].sum())
  return drops


def _place(
  result: StackResult,
  columns: tuple[np.ndarray, np.ndarray, np.ndarray],
  written: np.ndarray,
  padded: np.ndarray,
  aligned_end: np.ndarray,
  seg: int,
) -> None:
  """Writes the kept entries in order into the slots of one boolean mask.

  Per SC: written_0 slots used, padded_0 - written_0 not, ..., then the tail
  up to seg; the runs are cut at seg when the partitions overflow it.
  """
  l_sc, n_sc = written.shape
  sizes = np.empty((l_sc, 2 * n_sc + 1), np.intp)
  sizes[:, 0:-1:2] = written
  np.subtract(padded, written, out=sizes[:, 1:-1:2])
  np.subtract(seg, aligned_end[:, -1], out=sizes[:, -1])
  if int(aligned_end[:, -1].max()) > seg:
    ends = np.minimum(sizes.cumsum(axis=1), seg)
    sizes[:, 1:] = np.diff(ends, axis=1)
  mask = _written_pattern(l_sc, n_sc).repeat(sizes.reshape(-1))
  e, sample_ids, gains = columns
  result.embedding_ids[mask] = e
  result.sample_ids[mask] = sample_ids
  result.gains[mask] = gains


def empty_result(geo: coo_layout.Geometry, coo_size: int) -> StackResult:
  total = geo.local_devices * coo_size
  return StackResult(
    row_pointers=np.zeros(geo.local_sc * geo.row_pointer_stride, np.int32),
    embedding_ids=np.full(total, _INT_MAX, np.int32),
    sample_ids=np.full(total, _INT_MAX, np.int32),
    gains=np.full(total, np.nan, np.float32),
    max_ids_per_partition=np.zeros(geo.local_devices * geo.num_sc, np.int32),
    max_unique_ids_per_partition=np.zeros(geo.local_devices * geo.num_sc, np.int32),
    required_buffer_size_per_sc=np.zeros(geo.local_sc, np.int32),
    id_drop_counter=0,
  )


def _where(group: int, geo: coo_layout.Geometry) -> str:
  q, p = divmod(group, geo.num_sc)
  d, s = divmod(q, geo.sc_per_device)
  return f"partition {p} of device {d} SC {s}"


def _raise_partition_limit(
  who: str,
  counts: np.ndarray,
  uniques: np.ndarray,
  max_ids: int,
  max_unique: int,
  geo: coo_layout.Geometry,
) -> None:
  if int(counts.max()) > max_ids:
    group = int(np.argmax(counts))
    raise errors.LimitExceededError(
      f"{who}: {counts[group]} ids in {_where(group, geo)} exceed max_ids_per_partition={max_ids}"
    )
  group = int(np.argmax(uniques))
  raise errors.LimitExceededError(
    f"{who}: {uniques[group]} unique ids in {_where(group, geo)} exceed"
    f" max_unique_ids_per_partition={max_unique}"
  )


def _raise_overflow(
  who: str,
  needed: np.ndarray,
  seg: int,
  stacked_spec: specs_lib.StackedTableSpec,
  geo: coo_layout.Geometry,
) -> None:
  q = int(np.argmax(needed))
  d, s = divmod(q, geo.sc_per_device)
  coo_size = seg * geo.sc_per_device
  raise errors.LimitExceededError(
    f"{who}: device {d} SC {s} needs {needed[q]} COO entries but"
    f" suggested_coo_buffer_size_per_device="
    f"{stacked_spec.suggested_coo_buffer_size_per_device} gives {coo_size}"
    f" per device, {seg} per SC"
  )

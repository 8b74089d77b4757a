"""Statistics, limits and the buffer layout of one stack's sorted ids.

The compiled pass (coo_pass) merges the repeats of an id in a sample,
counts the entries and distinct rows of every partition (the statistics,
taken before any dropping), keeps the prefix of every partition that the
limits and the segment allow, and writes partition (q, p) of SC q at
q*seg + the aligned (multiple of 8) end of the partitions before it, with
(INT_MAX, INT_MAX, NaN) in the padding and the rest of the segment
(docs/reference/coo_format.md). Here: the buffers, the statistics and the errors.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sparsepipe.transforms.coo import buffer_sizes
from sparsepipe.transforms.coo import passes as coo_pass
from sparsepipe.transforms.coo import sort as coo_sort
from sparsepipe.transforms import errors
from sparsepipe.core import specs as specs_lib

_INT_MAX = buffer_sizes.INT_MAX


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


def layout(
  ids: coo_sort.SortedIds,
  who: str,
  stacked_spec: specs_lib.StackedTableSpec,
  limits: tuple[int, int],
  coo_size: int,
  geo: buffer_sizes.Geometry,
  allow_id_dropping: bool,
) -> StackResult:
  """Statistics, limits and the buffer layout of a stack's sorted ids."""
  l_sc, n_sc = geo.local_sc, geo.num_sc
  seg = coo_size // geo.sc_per_device
  result = StackResult(
    row_pointers=np.empty(l_sc * geo.row_pointer_stride, np.int32),
    embedding_ids=np.empty(l_sc * seg, np.int32),
    sample_ids=np.empty(l_sc * seg, np.int32),
    gains=np.empty(l_sc * seg, np.float32),
    max_ids_per_partition=np.empty(geo.local_devices * n_sc, np.int32),
    max_unique_ids_per_partition=np.empty(geo.local_devices * n_sc, np.int32),
    required_buffer_size_per_sc=np.empty(l_sc, np.int32),
    id_drop_counter=0,
  )
  counts = np.empty(l_sc * n_sc, np.int32)
  uniques = np.empty(l_sc * n_sc, np.int32)
  needed = np.empty(l_sc, np.int64)
  fields = (
    ids.low_bits,
    ids.e_bits,
    ids.p_shift,
    n_sc,
    geo.sc_per_device,
    ids.per_sc,
    int(ids.weighted),
  )
  drops, lost, top_count, top_unique = coo_pass.layout_pass(
    ids.key,
    ids.sc_starts,
    ids.sc_counts,
    fields,
    ids.sample_of,
    ids.gain_of,
    (seg, *limits),
    (result.embedding_ids, result.sample_ids, result.gains),
    result.row_pointers.reshape(l_sc, geo.row_pointer_stride),
    (
      counts,
      uniques,
      needed,
      result.max_ids_per_partition,
      result.max_unique_ids_per_partition,
      result.required_buffer_size_per_sc,
    ),
  )
  if not allow_id_dropping:
    max_ids, max_unique = limits
    if top_count > max_ids or top_unique > max_unique:
      _raise_partition_limit(who, counts, uniques, max_ids, max_unique, geo)
    if lost:
      _raise_overflow(who, needed, seg, stacked_spec, geo)
  result.id_drop_counter = int(drops)
  return result


def empty_result(geo: buffer_sizes.Geometry, coo_size: int) -> StackResult:
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


def _where(group: int, geo: buffer_sizes.Geometry) -> str:
  q, p = divmod(group, geo.num_sc)
  d, s = divmod(q, geo.sc_per_device)
  return f"partition {p} of device {d} SC {s}"


def _raise_partition_limit(
  who: str,
  counts: np.ndarray,
  uniques: np.ndarray,
  max_ids: int,
  max_unique: int,
  geo: buffer_sizes.Geometry,
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
  geo: buffer_sizes.Geometry,
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

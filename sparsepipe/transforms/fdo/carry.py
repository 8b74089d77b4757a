"""Carrying saved COO limits to another global device count.

Limits tuned by FDO on G devices are not valid on G' devices: the N = G*S
SparseCores each take a contiguous 1/N of the global batch, and ids are
MOD-sharded over N partitions. N and N' are powers of two, so one divides
the other and the layouts nest:

* fewer SCs (N = r*N'): a new SC's samples are those of r old SCs, and a
  new partition is the union of r old ones (p' = p mod N'). Every count of
  one (SC, partition) is a sum of at most r*r old counts, so M and U grow
  by at most r*r, and a SC's required buffer, a sum over partitions of
  round8(count), by at most r (round8 of a sum <= the sum of round8s).
* more SCs (N' = k*N): a new SC's samples and a new partition are subsets
  of old ones, so M and U do not grow; a SC's required buffer can grow by
  the padding of the split partitions, at most 8 per extra partition.

Both need the same stacking (tables in the same order in each stack, as
build_feature_specs makes them for any device count): a table's shard
rotation then maps old partitions to new ones the same way for all tables.
These bounds hold for every batch the saved limits were tuned on (with the
same headroom), and are clamped by what one batch can produce: every id of
a SC's samples in one partition. The result is a valid start; FDO retunes
it at the next segment boundary. The statistics FDO keeps (the running
maxima of every batch so far) are carried the same way
(`carry_stats_maximum`), so the first retune after a resize still rests on
every batch seen, not only on the few since the resize.
"""

from __future__ import annotations

from typing import Any

import jax

from sparsepipe.core.rounding import round_up
from sparsepipe.transforms.coo import buffer_sizes
from sparsepipe.transforms.fdo import limits as limits_lib


def most_ids_per_sparsecore(feature_specs: Any, num_global_sc: int) -> dict[str, int]:
  """{stack: the most ids one SparseCore's samples can hold}.

  A feature contributes ceil(global batch / N) samples of at most
  input_shape[1] ids each (1 for a 1-D input); no partition of a SC can
  hold more than the sum over the stack's features.
  """
  most: dict[str, int] = {}
  for feature in jax.tree_util.tree_leaves(feature_specs):
    ids = int(feature.input_shape[1]) if len(feature.input_shape) > 1 else 1
    samples = -(-feature.global_batch_size // num_global_sc)
    most[feature.stack_name] = most.get(feature.stack_name, 0) + samples * ids
  return most


def _partition_count(value: int, n_old: int, n_new: int, bound: int) -> int:
  """A count of one (SC, partition) (M or U) carried from N=n_old to n_new SCs."""
  if n_new <= n_old:
    value *= (n_old // n_new) ** 2
  return max(1, min(value, bound))


def _sc_buffer(per_sc: int, n_old: int, n_new: int) -> int:
  """One SC's required buffer carried from N=n_old to n_new SCs (not aligned)."""
  if n_new <= n_old:
    return per_sc * (n_old // n_new)
  return per_sc + buffer_sizes.ALIGNMENT * (n_new - n_old)


def _carry_one(
  saved: limits_lib.StackLimits, bound: int, n_old: int, n_new: int, s_per: int
) -> dict[str, int | None]:
  """One stack's limits carried from N=n_old to N=n_new SparseCores."""
  new_m = _partition_count(int(saved["max_ids_per_partition"]), n_old, n_new, bound)
  new_u = min(
    _partition_count(int(saved["max_unique_ids_per_partition"]), n_old, n_new, bound), new_m
  )
  q = saved["suggested_coo_buffer_size_per_device"]
  new_q = None
  if q is not None:
    per_sc = _sc_buffer(-(-int(q) // s_per), n_old, n_new)
    theoretical = buffer_sizes.compute_theoretical_max_coo_buffer_size(new_m, n_new // s_per, s_per)
    new_q = min(round_up(per_sc, buffer_sizes.ALIGNMENT) * s_per, theoretical)
  return {
    "max_ids_per_partition": new_m,
    "max_unique_ids_per_partition": new_u,
    "suggested_coo_buffer_size_per_device": new_q,
  }


def carry_stats_maximum(
  field: str,
  value: int,
  *,
  bound: int,
  saved_global_device_count: int,
  global_device_count: int,
  num_sc_per_device: int,
) -> int:
  """A running statistics maximum (as FDO keeps them) carried to another device count.

  Args:
    field: "max_ids_per_partition", "max_unique_ids_per_partition" or
      "required_buffer_size_per_sc".
    value: the stack's maximum of that field on the saved layout.
    bound: the most ids one SparseCore's samples can hold on the new layout
      (most_ids_per_sparsecore), which no partition count can exceed.
    saved_global_device_count, global_device_count, num_sc_per_device: the
      layouts, as for carry_stack_limits.
  """
  s_per = int(num_sc_per_device)
  n_old = buffer_sizes.num_global_sparsecores(saved_global_device_count, s_per)
  n_new = buffer_sizes.num_global_sparsecores(global_device_count, s_per)
  if n_old == n_new or value <= 0:
    return int(value)
  if field == "required_buffer_size_per_sc":
    return _sc_buffer(int(value), n_old, n_new)
  return _partition_count(int(value), n_old, n_new, bound)


def carry_stack_limits(
  saved_limits: limits_lib.StackLimits,
  feature_specs: Any,
  *,
  saved_global_device_count: int,
  global_device_count: int,
  num_sc_per_device: int,
) -> dict[str, dict[str, int | None]]:
  """Saved per-stack limits made valid for `global_device_count` devices.

  Args:
    saved_limits: {stack: limits} as get_stack_limits returned them on the
      saved run's specs.
    feature_specs: the prepared specs for the new device count (same
      features and stacking; their own limits are ignored).
    saved_global_device_count: G of the saved run.
    global_device_count: G of this run.
    num_sc_per_device: S, the same in both runs.

  Returns:
    {stack: limits} for apply_stack_limits(feature_specs, ...). With the same
    device count, the saved limits unchanged.

  Raises:
    ValueError: the stacks differ, or a device count is not positive.
  """
  s_per = int(num_sc_per_device)
  n_old = buffer_sizes.num_global_sparsecores(saved_global_device_count, s_per)
  n_new = buffer_sizes.num_global_sparsecores(global_device_count, s_per)
  bounds = most_ids_per_sparsecore(feature_specs, n_new)
  if set(bounds) != set(saved_limits):
    raise ValueError(
      f"saved limits are for stacks {sorted(saved_limits)} but the feature specs for"
      f" {global_device_count} devices have stacks {sorted(bounds)}: the stacking"
      " changed, so the limits cannot be carried over"
    )
  if n_old == n_new:
    return {name: dict(values) for name, values in sorted(saved_limits.items())}
  return {
    name: _carry_one(saved_limits[name], bounds[name], n_old, n_new, s_per)
    for name in sorted(bounds)
  }

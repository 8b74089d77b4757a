"""Reading, setting and FDO-updating the COO limits of every stack.

The limits that decide buffer shapes are, per stack: max_ids_per_partition,
max_unique_ids_per_partition and suggested_coo_buffer_size_per_device. They
are static (shapes), so setting them returns new feature specs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import numpy as np

from sparsepipe.transforms.coo import buffer_sizes
from sparsepipe.core import coo_types
from sparsepipe.core import specs as specs_lib
from sparsepipe.transforms import stacking

# A pytree of FeatureSpecs (dict, list, ...), as the reference accepts.
Nested = Any

LIMIT_NAMES = (
  "max_ids_per_partition",
  "max_unique_ids_per_partition",
  "suggested_coo_buffer_size_per_device",
)

StackLimits = Mapping[str, Mapping[str, Any]]

# Floors for stacks that saw no ids (the reference would derive 0).
MIN_MAX_IDS_PER_PARTITION = 8
MIN_MAX_UNIQUE_IDS_PER_PARTITION = 8


def get_stack_limits(feature_specs: Any) -> dict[str, dict[str, Any]]:
  """{stack name: {limit name: value}} of prepared feature specs."""
  stacks = stacking.get_stacked_table_specs(feature_specs)
  return {
    name: {k: getattr(stacked, k) for k in LIMIT_NAMES} for name, stacked in sorted(stacks.items())
  }


def apply_stack_limits(feature_specs: Any, limits: StackLimits) -> Any:
  """New feature specs whose stacks carry `limits` (same pytree structure).

  Every stack of the specs must appear in `limits` and vice versa: a
  mismatch means the limits were made for other specs (e.g. other
  stacking), and is an error naming the stacks.
  """
  current = get_stack_limits(feature_specs)
  if set(current) != set(limits):
    raise ValueError(
      f"limits are for stacks {sorted(limits)} but the feature specs have stacks {sorted(current)}"
    )
  for stack, values in limits.items():
    missing = [k for k in LIMIT_NAMES if k not in values]
    if missing:
      raise ValueError(f"stack '{stack}': limits lack {missing}")
    for k in LIMIT_NAMES[:2]:
      if int(values[k]) < 1:
        raise ValueError(f"stack '{stack}': {k}={values[k]} must be >= 1")

  def update(feature: specs_lib.FeatureSpec) -> specs_lib.FeatureSpec:
    stacked = feature.table_spec.stacked_table_spec
    values = limits[stacked.stack_name]
    suggested = values["suggested_coo_buffer_size_per_device"]
    new = dict(
      max_ids_per_partition=int(values["max_ids_per_partition"]),
      max_unique_ids_per_partition=int(values["max_unique_ids_per_partition"]),
      suggested_coo_buffer_size_per_device=None if suggested is None else int(suggested),
    )
    table = dataclasses.replace(
      feature.table_spec,
      stacked_table_spec=dataclasses.replace(stacked, **new),
      **new,
    )
    return dataclasses.replace(feature, table_spec=table)

  return jax.tree.map(update, feature_specs)


def _max_or_none(stats: Mapping[str, Any], stack: str) -> int | None:
  if stack not in stats:
    return None
  values = np.asarray(stats[stack])
  return int(values.max()) if values.size else 0


def update_preprocessing_parameters(
  feature_specs: Nested,
  stats: coo_types.SparseDenseMatmulInputStats,
  num_sc_per_device: int,
  global_device_count: int | None = None,
) -> Nested:
  """New specs with limits derived from (merged) statistics.

  Per stack present in `stats`: M = max(max_ids_per_partition),
  U = max(max_unique_ids_per_partition), Q = max(required_buffer_size_per_sc)
  * S. The numbers land on the StackedTableSpec and on every TableSpec of
  the stack; stacks absent from `stats` keep their limits.

  Differences from the reference, so the result is always usable:
  * a stack that saw no ids would get M = U = Q = 0; instead M and U get the
    floors MIN_MAX_IDS_PER_PARTITION / MIN_MAX_UNIQUE_IDS_PER_PARTITION and
    Q = 8*S (one aligned group per SparseCore);
  * Q is only derived together with M (same statistics), which guarantees
    Q <= T = round8(M)*S*N, because every SC needs at most N partitions of
    round8(M) entries. If `global_device_count` is given, Q is also clamped
    to T explicitly (useful for hand-made statistics).

  Args:
    feature_specs: prepared feature specs.
    stats: statistics of one batch or merged by an FDO client.
    num_sc_per_device: S.
    global_device_count: G, only needed for the explicit clamp.

  Returns:
    New feature specs with the same pytree structure.
  """
  s_per = int(num_sc_per_device)
  updated: dict[str, dict[str, int | None]] = {}
  for name, stacked in stacking.get_stacked_table_specs(feature_specs).items():
    m = _max_or_none(stats.max_ids_per_partition, name)
    u = _max_or_none(stats.max_unique_ids_per_partition, name)
    r = _max_or_none(stats.required_buffer_size_per_sc, name)
    new_m = stacked.max_ids_per_partition
    new_q = stacked.suggested_coo_buffer_size_per_device
    if m is not None:
      new_m = m or MIN_MAX_IDS_PER_PARTITION
      if r is not None:
        new_q = max(r, buffer_sizes.ALIGNMENT) * s_per
    new_u = stacked.max_unique_ids_per_partition
    if u is not None:
      new_u = u or MIN_MAX_UNIQUE_IDS_PER_PARTITION
    if new_q is not None and global_device_count is not None:
      new_q = min(
        new_q,
        buffer_sizes.compute_theoretical_max_coo_buffer_size(new_m, global_device_count, s_per),
      )
    updated[name] = {
      "max_ids_per_partition": int(new_m),
      "max_unique_ids_per_partition": int(new_u),
      "suggested_coo_buffer_size_per_device": None if new_q is None else int(new_q),
    }
  return apply_stack_limits(feature_specs, updated)

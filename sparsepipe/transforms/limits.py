"""Reading and setting the COO limits of every stack (FDO, checkpoints).

The limits that decide buffer shapes are, per stack: max_ids_per_partition,
max_unique_ids_per_partition and suggested_coo_buffer_size_per_device. They
are static (shapes), so setting them returns new feature specs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax

from sparsepipe.transforms import specs as specs_lib

LIMIT_NAMES = (
    "max_ids_per_partition",
    "max_unique_ids_per_partition",
    "suggested_coo_buffer_size_per_device",
)

StackLimits = Mapping[str, Mapping[str, Any]]


def get_stack_limits(feature_specs: Any) -> dict[str, dict[str, Any]]:
  """{stack name: {limit name: value}} of prepared feature specs."""
  out: dict[str, dict[str, Any]] = {}
  for feature in jax.tree.leaves(feature_specs):
    stacked = feature.table_spec.stacked_table_spec
    if stacked is None:
      raise ValueError(
          f"feature '{feature.name}': specs are not prepared for training"
          " (no stacked table spec); call prepare_feature_specs_for_training"
      )
    out[stacked.stack_name] = {k: getattr(stacked, k) for k in LIMIT_NAMES}
  return dict(sorted(out.items()))


def apply_stack_limits(feature_specs: Any, limits: StackLimits) -> Any:
  """New feature specs whose stacks carry `limits` (same pytree structure).

  Every stack of the specs must appear in `limits` and vice versa: a
  mismatch means the limits were made for other specs (e.g. other
  stacking), and is an error naming the stacks.
  """
  current = get_stack_limits(feature_specs)
  if set(current) != set(limits):
    raise ValueError(
        f"limits are for stacks {sorted(limits)} but the feature specs have"
        f" stacks {sorted(current)}"
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

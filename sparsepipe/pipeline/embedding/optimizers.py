"""Row-wise embedding optimizer updates, dispatched to the optimizer spec.

Each update takes the touched rows of a table, their slots and their
combined gradient, and returns the new rows and slots. Rows that no sample
touched are never read nor written, so Adam is "lazy": its moments decay
only on the steps a row is used. The rules themselves live with the specs
(sparsepipe.core.optimizers); the scalars that depend on the step
(learning-rate schedules, bias corrections) are computed once per step by
`step_hyperparameters`, outside shard_map.
"""

from __future__ import annotations

from typing import Any

import jax

from sparsepipe.core.optimizers import OptimizerSpec


class UnsupportedOptimizerError(ValueError):
  """An optimizer spec the embedding update does not implement."""


def _checked(optimizer: Any) -> OptimizerSpec:
  if not isinstance(optimizer, OptimizerSpec):
    raise UnsupportedOptimizerError(
      f"embedding optimizer {type(optimizer).__name__} is not supported:"
      " embedding optimizers derive from sparsepipe.core.OptimizerSpec"
    )
  return optimizer


def step_hyperparameters(optimizer: Any, step: jax.Array) -> tuple[jax.Array, ...]:
  """The optimizer's per-step scalars at `step` (updates applied before)."""
  return tuple(_checked(optimizer).update_hyperparameters(step))


def apply_rows(
  optimizer: Any,
  hyper: tuple[jax.Array, ...],
  rows: jax.Array,
  slots: tuple[jax.Array, ...],
  grads: jax.Array,
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
  """New (rows, slots) for touched rows [n, D] given their gradients [n, D]."""
  rows, slots = _checked(optimizer).update_rows(hyper, rows, slots, grads)
  return rows, tuple(slots)

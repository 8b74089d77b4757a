"""Row-wise embedding optimizer updates (SGD, Adagrad, lazy Adam).

Each update takes the touched rows of a table, their slots and their
combined gradient, and returns the new rows and slots. Rows that no sample
touched are never read nor written, so Adam is "lazy": its moments decay
only on the steps a row is used. Hyperparameters that depend on the step
(learning-rate schedules, Adam's bias correction) are computed once per step
by `step_hyperparameters`, outside shard_map.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from sparsepipe.core.specs import AdagradOptimizerSpec
from sparsepipe.core.specs import AdamOptimizerSpec
from sparsepipe.core.specs import SGDOptimizerSpec


class UnsupportedOptimizerError(ValueError):
  """An optimizer spec the embedding update does not implement."""


def learning_rate(optimizer: Any, step: jax.Array) -> jax.Array:
  """The optimizer's learning rate at `step` (a float or a schedule)."""
  rate = optimizer.learning_rate
  return jnp.asarray(rate(step) if callable(rate) else rate, jnp.float32)


def step_hyperparameters(optimizer: Any, step: jax.Array) -> jax.Array:
  """A float32 vector of the scalars the row update needs at `step`.

  SGD and Adagrad: [lr]. Adam: [lr, 1 - beta_1^t, 1 - beta_2^t] with
  t = step + 1 (step counts the updates applied before this one).
  """
  lr = learning_rate(optimizer, step)
  if isinstance(optimizer, (SGDOptimizerSpec, AdagradOptimizerSpec)):
    return lr[None]
  if isinstance(optimizer, AdamOptimizerSpec):
    # 1 - beta^t as -expm1(t log beta): no cancellation when beta^t ~ 1.
    t = jnp.asarray(step, jnp.float32) + 1.0
    c1 = -jnp.expm1(t * math.log(optimizer.beta_1))
    c2 = -jnp.expm1(t * math.log(optimizer.beta_2))
    return jnp.stack([lr, c1, c2])
  raise UnsupportedOptimizerError(
      f"embedding optimizer {type(optimizer).__name__} is not supported"
      " (SGDOptimizerSpec, AdagradOptimizerSpec, AdamOptimizerSpec)"
  )


def apply_rows(
    optimizer: Any,
    hyper: jax.Array,
    rows: jax.Array,
    slots: tuple[jax.Array, ...],
    grads: jax.Array,
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
  """New (rows, slots) for touched rows [n, D] given their gradients [n, D].

  SGD: w -= lr * g.
  Adagrad: a += g^2; w -= lr * g / sqrt(a).
  Adam: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    w -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps).
  """
  lr = hyper[0]
  if isinstance(optimizer, SGDOptimizerSpec):
    return rows - lr * grads, ()
  if isinstance(optimizer, AdagradOptimizerSpec):
    (accumulator,) = slots
    accumulator = accumulator + grads * grads
    return rows - lr * grads / jnp.sqrt(accumulator), (accumulator,)
  if isinstance(optimizer, AdamOptimizerSpec):
    c1, c2 = hyper[1], hyper[2]
    b1, b2 = optimizer.beta_1, optimizer.beta_2
    momentum, velocity = slots
    momentum = b1 * momentum + (1.0 - b1) * grads
    velocity = b2 * velocity + (1.0 - b2) * grads * grads
    step = (momentum / c1) / (jnp.sqrt(velocity / c2) + optimizer.epsilon)
    return rows - lr * step, (momentum, velocity)
  raise UnsupportedOptimizerError(
      f"embedding optimizer {type(optimizer).__name__} is not supported"
      " (SGDOptimizerSpec, AdagradOptimizerSpec, AdamOptimizerSpec)"
  )

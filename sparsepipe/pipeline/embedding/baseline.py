"""A dense gather/scatter embedding baseline, for benchmarks to compare with.

The naive way to run an embedding without COO buffers: ids padded to a
dense [batch, k] array (-1 marks no id), one logical table, `jnp.take` for
the lookup and a scatter-add of the gradient for an SGD update. Under jit
with a row-sharded table, GSPMD decides the communication itself.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sparsepipe.core.specs import check_combiner


def dense_gains(ids: jax.Array, weights: jax.Array, combiner: str) -> jax.Array:
  """Per-id gains [B, k] of the combiner; 0 where ids < 0."""
  check_combiner(combiner, "dense_gains")
  weights = jnp.where(ids >= 0, weights.astype(jnp.float32), 0.0)
  if combiner == "sum":
    return weights
  if combiner == "mean":
    norm = jnp.sum(weights, axis=1, keepdims=True)
  else:
    norm = jnp.sqrt(jnp.sum(weights * weights, axis=1, keepdims=True))
  return jnp.where(norm > 0, weights / jnp.where(norm > 0, norm, 1.0), 0.0)


def dense_lookup_baseline(
  table: jax.Array, ids: jax.Array, weights: jax.Array, combiner: str
) -> jax.Array:
  """Activations [B, D] = sum_k gain[b, k] * table[ids[b, k]]."""
  gains = dense_gains(ids, weights, combiner)
  rows = jnp.take(table, jnp.maximum(ids, 0), axis=0)
  return jnp.einsum("bk,bkd->bd", gains, rows)


def dense_sgd_update_baseline(
  table: jax.Array,
  ids: jax.Array,
  weights: jax.Array,
  combiner: str,
  activation_gradients: jax.Array,
  learning_rate: float,
) -> jax.Array:
  """table - lr * d(activations . gradients)/d(table), by scatter-add."""
  gains = dense_gains(ids, weights, combiner)
  row_grads = gains[:, :, None] * activation_gradients[:, None, :]
  rows = jnp.where(ids >= 0, ids, table.shape[0])
  table = jnp.asarray(table)
  return table.at[rows].add(-learning_rate * row_grads, mode="drop")

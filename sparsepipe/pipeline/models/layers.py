"""Dense layers shared by the built-in models (plain dicts of arrays)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def _scaled_normal(key: jax.Array, shape: tuple[int, ...], scale: float) -> jax.Array:
  """N(0, 1) draws times `scale`, the same bits eagerly and under jit.

  The barrier keeps XLA from folding `scale` into normal()'s own constant
  factor (sqrt(2)), which changes the last bit of some values: the job
  makes its params in one jitted program (launch/job/model.py).
  """
  return jax.lax.optimization_barrier(jax.random.normal(key, shape, jnp.float32)) * scale


def dense_layer(key: jax.Array, fan_in: int, fan_out: int) -> dict[str, jax.Array]:
  """DLRM's init: N(0, sqrt(2/(in+out))) kernel, N(0, sqrt(1/out)) bias."""
  k_w, k_b = jax.random.split(key)
  return {
    "kernel": _scaled_normal(k_w, (fan_in, fan_out), np.sqrt(2.0 / (fan_in + fan_out))),
    "bias": _scaled_normal(k_b, (fan_out,), np.sqrt(1.0 / fan_out)),
  }


def mlp(key: jax.Array, dims: tuple[int, ...]) -> dict[str, Any]:
  """Layers dims[0] -> dims[1] -> ... as {"layer_i": {"kernel", "bias"}}."""
  keys = jax.random.split(key, len(dims) - 1)
  return {f"layer_{i}": dense_layer(keys[i], dims[i], dims[i + 1]) for i in range(len(dims) - 1)}


def apply_mlp(layers: dict[str, Any], x: jax.Array, relu_last: bool) -> jax.Array:
  """ReLU between layers (and after the last with `relu_last`)."""
  n = len(layers)
  for i in range(n):
    layer = layers[f"layer_{i}"]
    x = x @ layer["kernel"] + layer["bias"]
    if relu_last or i < n - 1:
      x = jax.nn.relu(x)
  return x


def positive_dims(name: str, dims: Any, *, allow_empty: bool) -> tuple[int, ...]:
  """`dims` as a tuple of ints, checked positive (and non-empty unless allowed)."""
  dims = tuple(int(d) for d in dims)
  if (not dims and not allow_empty) or (dims and min(dims) <= 0):
    need = "positive" if allow_empty else "non-empty and positive"
    raise ValueError(f"{name}={dims} must be {need}")
  return dims

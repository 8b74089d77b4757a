"""DCN-v2 (Wang et al. 2021), stacked: cross layers, then an MLP.

    x0 = [dense, e_1, .., e_F]           [B, D]  (features in name order)
    x_{l+1} = x0 * (W_l x_l + b_l) + x_l  for l = 0 .. L-1  (cross layers)
    logit = MLP(x_L)                     (ReLU between layers, 1 output)

W_l is [D, D], or with `cross_rank` r > 0 the low-rank U_l V_l^T ([D, r]
each), the paper's cost-saving variant. Kernels start like DLRM's
(N(0, sqrt(2/(in+out)))); cross biases start at zero, so a fresh cross
layer is x0 * W x + x. Parameters are a plain dict pytree.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from sparsepipe.pipeline.models.layers import apply_mlp
from sparsepipe.pipeline.models.layers import dense_layer
from sparsepipe.pipeline.models.layers import mlp
from sparsepipe.pipeline.models.layers import positive_dims


@dataclasses.dataclass(frozen=True)
class DCNv2:
  """The stacked DCN-v2 model (see the module docstring); hashable.

  Attributes:
    cross_layers: L, the number of cross layers (>= 1).
    cross_rank: 0 for full-rank cross kernels, else their rank r.
    mlp_dims: hidden widths of the MLP after the cross layers (a final
      1-unit layer is added).
  """

  cross_layers: int = 3
  cross_rank: int = 0
  mlp_dims: tuple[int, ...] = (64, 32)

  def __post_init__(self):
    if int(self.cross_layers) < 1:
      raise ValueError(f"DCN-v2: cross_layers={self.cross_layers} must be >= 1")
    if int(self.cross_rank) < 0:
      raise ValueError(f"DCN-v2: cross_rank={self.cross_rank} must be >= 0 (0: full rank)")
    object.__setattr__(self, "cross_layers", int(self.cross_layers))
    object.__setattr__(self, "cross_rank", int(self.cross_rank))
    dims = positive_dims("DCN-v2: mlp_dims", self.mlp_dims, allow_empty=True)
    object.__setattr__(self, "mlp_dims", dims)

  def _cross_layer(self, key: jax.Array, width: int) -> dict[str, jax.Array]:
    if self.cross_rank:
      k_u, k_v = jax.random.split(key)
      return {
        "u": dense_layer(k_u, width, self.cross_rank)["kernel"],
        "v": dense_layer(k_v, self.cross_rank, width)["kernel"],
        "bias": jnp.zeros((width,), jnp.float32),
      }
    return {"kernel": dense_layer(key, width, width)["kernel"], "bias": jnp.zeros(width)}

  def init(self, rng: jax.Array, dense_dim: int, feature_dims: Mapping[str, int]) -> dict:
    """Fresh parameters (deterministic in `rng`)."""
    if dense_dim < 0:
      raise ValueError(f"DCN-v2: dense_dim={dense_dim} must be >= 0")
    if not feature_dims:
      raise ValueError("DCN-v2: no features")
    width = int(dense_dim) + sum(int(d) for d in feature_dims.values())
    k_cross, k_mlp = jax.random.split(rng)
    keys = jax.random.split(k_cross, self.cross_layers)
    return {
      "cross": {f"layer_{i}": self._cross_layer(k, width) for i, k in enumerate(keys)},
      "mlp": mlp(k_mlp, (width,) + self.mlp_dims + (1,)),
    }

  def apply(self, params: Any, dense: jax.Array, embeddings: Mapping[str, jax.Array]) -> jax.Array:
    """[B] logits."""
    x0 = jnp.concatenate([dense] + [embeddings[name] for name in sorted(embeddings)], axis=1)
    width = params["mlp"]["layer_0"]["kernel"].shape[0]
    if x0.shape[-1] != width:
      raise ValueError(
        f"DCN-v2: dense and embeddings concatenate to width {x0.shape[-1]}; the params were"
        f" made for {width}"
      )
    x = x0
    for i in range(len(params["cross"])):
      layer = params["cross"][f"layer_{i}"]
      if "kernel" in layer:
        mixed = x @ layer["kernel"]
      else:
        mixed = (x @ layer["u"]) @ layer["v"]
      x = x0 * (mixed + layer["bias"]) + x
    return apply_mlp(params["mlp"], x, relu_last=False)[:, 0]

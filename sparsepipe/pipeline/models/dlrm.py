"""DLRM (Naumov et al. 2019): bottom MLP, pairwise dot interaction, top MLP.

    dense [B, dense_dim] -> bottom MLP (ReLU) -> x [B, d]
      (no dense features: x = the sum of the features' vectors, and T below
      holds the feature vectors only)
    embeddings {feature: [B, dim_f]} -> (projection to d if dim_f != d)
    T = [x, e_1, .., e_F] [B, F+1, d];  Z = T T^T;  z = strictly lower
    triangle of Z [B, (F+1)F/2]
    [x, z] -> top MLP (ReLU between layers) -> 1 logit

d is the bottom MLP's last width; features are taken in name order. A
feature whose dim differs from d is mapped to d by a learned [dim_f, d]
matrix (`params["projection"][name]`). Parameters are a plain dict pytree.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from sparsepipe.pipeline.models.layers import apply_mlp
from sparsepipe.pipeline.models.layers import dense_layer
from sparsepipe.pipeline.models.layers import mlp
from sparsepipe.pipeline.models.layers import positive_dims


@dataclasses.dataclass(frozen=True)
class DLRM:
  """The DLRM model (see the module docstring); hashable, so usable as a static.

  Attributes:
    bottom_mlp_dims: widths of the bottom MLP; the last is the interaction dim d.
    top_mlp_dims: hidden widths of the top MLP (a final 1-unit layer is added).
  """

  bottom_mlp_dims: tuple[int, ...] = (64, 16)
  top_mlp_dims: tuple[int, ...] = (64, 32)

  def __post_init__(self):
    dims = positive_dims("DLRM: bottom_mlp_dims", self.bottom_mlp_dims, allow_empty=False)
    object.__setattr__(self, "bottom_mlp_dims", dims)
    top = positive_dims("DLRM: top_mlp_dims", self.top_mlp_dims, allow_empty=True)
    object.__setattr__(self, "top_mlp_dims", top)

  @property
  def interaction_dim(self) -> int:
    return self.bottom_mlp_dims[-1]

  @staticmethod
  def num_interactions(num_features: int, dense_dim: int) -> int:
    n = num_features + (1 if dense_dim else 0)
    return n * (n - 1) // 2

  def init(self, rng: jax.Array, dense_dim: int, feature_dims: Mapping[str, int]) -> dict:
    """Fresh parameters (deterministic in `rng`)."""
    if dense_dim < 0:
      raise ValueError(f"DLRM: dense_dim={dense_dim} must be >= 0")
    if not feature_dims:
      raise ValueError("DLRM: no features")
    k_bottom, k_top, k_proj = jax.random.split(rng, 3)
    d = self.interaction_dim
    top_in = d + self.num_interactions(len(feature_dims), dense_dim)
    params = {"top_mlp": mlp(k_top, (top_in,) + self.top_mlp_dims + (1,))}
    if dense_dim:
      params["bottom_mlp"] = mlp(k_bottom, (dense_dim,) + self.bottom_mlp_dims)
    projected = [(n, int(feature_dims[n])) for n in sorted(feature_dims)]
    projected = [(n, dim) for n, dim in projected if dim != d]
    if projected:
      keys = jax.random.split(k_proj, len(projected))
      params["projection"] = {
        name: dense_layer(k, dim, d)["kernel"] for k, (name, dim) in zip(keys, projected)
      }
    return params

  def apply(self, params: Any, dense: jax.Array, embeddings: Mapping[str, jax.Array]) -> jax.Array:
    """[B] logits."""
    d = self.interaction_dim
    projections = params.get("projection", {})
    vectors = []
    for name in sorted(embeddings):
      e = embeddings[name]
      if name in projections:
        vectors.append(e @ projections[name])
      elif e.shape[-1] != d:
        raise ValueError(
          f"DLRM: feature '{name}' has dim {e.shape[-1]}, neither the interaction dim {d}"
          " nor a projected feature of these params"
        )
      else:
        vectors.append(e)
    if "bottom_mlp" in params:
      x = apply_mlp(params["bottom_mlp"], dense, relu_last=True)
      vectors.insert(0, x)
    else:  # no dense input: the first-order term is the sum of the embeddings
      x = sum(vectors)
    expected = params["top_mlp"]["layer_0"]["kernel"].shape[0] - d
    if self.num_interactions(len(embeddings), dense.shape[-1]) != expected:
      raise ValueError(
        f"DLRM: {len(embeddings)} features (and {dense.shape[-1]} dense) give"
        f" {self.num_interactions(len(embeddings), dense.shape[-1])} interactions;"
        f" the params were made for {expected}"
      )
    t = jnp.stack(vectors, axis=1)  # [B, F+1, d] (F without dense features)
    z = jnp.einsum("bid,bjd->bij", t, t)
    rows, cols = np.tril_indices(len(vectors), k=-1)
    top_in = jnp.concatenate([x, z[:, rows, cols]], axis=1)
    return apply_mlp(params["top_mlp"], top_in, relu_last=False)[:, 0]

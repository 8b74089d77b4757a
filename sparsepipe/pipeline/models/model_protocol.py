"""What a model is: its math only, `init` and `apply` (plain JAX, no framework).

The pipeline owns everything else (embedding lookup and update, COO
buffers, pipelining, the loss, ZeRO, finiteness checks): a model is an
object with

    init(rng, dense_dim, feature_dims) -> params
    apply(params, dense [B, dense_dim], embeddings {feature: [B, dim]}) -> logits [B]

`feature_dims` is {feature name: embedding dim}; `embeddings` has the same
keys, each the feature's combined embedding vector per example. Params are
any pytree of arrays (the dense optimizer and checkpoints take it as is).
The same object serves training (`pipeline.make_tc_stage`), evaluation
(`pipeline.make_predict_fn`) and export.

A Flax module fits with two lines (flax is not a dependency of sparsepipe):

    class FlaxModel:
      def __init__(self, module): self.module = module
      def init(self, rng, dense_dim, feature_dims):
        return self.module.init(rng, jnp.zeros((1, dense_dim)),
                                {f: jnp.zeros((1, d)) for f, d in feature_dims.items()})
      def apply(self, params, dense, embeddings):
        return self.module.apply(params, dense, embeddings)
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, runtime_checkable

import jax

Params = Any


@runtime_checkable
class Model(Protocol):
  """A dense model over dense features and per-feature embedding vectors."""

  def init(self, rng: jax.Array, dense_dim: int, feature_dims: Mapping[str, int]) -> Params:
    """Fresh parameters (deterministic in `rng`)."""
    ...

  def apply(self, params: Params, dense: jax.Array, embeddings: Mapping[str, jax.Array]) -> Any:
    """[B] logits of the click probability."""
    ...


def feature_dims_of(feature_specs: Any) -> dict[str, int]:
  """{feature name: embedding dim} of (prepared) feature specs."""
  return {f.name: int(f.output_shape[-1]) for f in jax.tree.leaves(feature_specs)}


def embeddings_by_name(feature_specs: Any, activations: Any) -> dict[str, jax.Array]:
  """The SC stage's activations (a pytree shaped like the specs) keyed by feature name."""
  specs = jax.tree.leaves(feature_specs)
  leaves = jax.tree.leaves(activations)
  if len(leaves) != len(specs):
    raise ValueError(f"{len(leaves)} activation arrays for {len(specs)} feature specs")
  return {spec.name: leaf for spec, leaf in zip(specs, leaves)}

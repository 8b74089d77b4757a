"""A DLRM-style reference model in plain JAX, and its TC stage.

    dense [B, num_dense] -> bottom MLP (ReLU) -> x [B, d]
      (no dense features: x = the sum of the features' vectors, and T below
      holds the feature vectors only)
    activations of F features [B, dim_f] -> (projection to d if dim_f != d)
    T = [x, e_1, .., e_F] [B, F+1, d];  Z = T T^T;  z = strictly lower
    triangle of Z [B, (F+1)F/2]
    [x, z] -> top MLP (ReLU between layers) -> 1 logit -> sigmoid CE

d is the bottom MLP's last width. A feature whose dim differs from d is
mapped to d by a learned [dim_f, d] matrix (`params["projection"][name]`);
features of dim d are used as they are. Parameters are a plain dict pytree.

`make_dlrm_tc_stage` is the default TC stage of the pipeline: the loss and
gradients are computed per device inside shard_map (the local batch), the
activation gradients stay local, and the parameter gradients are
reduce-scattered into a `zero_sharded` optimizer (or all-reduced for any
other optax optimizer).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, PartitionSpec

from sparsepipe.core.mesh import DATA_AXIS
from sparsepipe.pipeline.pipelining.state import TcStageFun
from sparsepipe.pipeline.training.train_state import TrainState
from sparsepipe.pipeline.zero.optimizer import ScatteredGradients
from sparsepipe.pipeline.zero.optimizer import ZeroTransformation
from sparsepipe.pipeline.zero.optimizer import scatter_gradients


class DenseInputs(NamedTuple):
  """The TC stage's dense inputs: [B] float32 labels, [B, num_dense] floats."""

  labels: Any
  dense: Any


@dataclasses.dataclass(frozen=True)
class DLRMConfig:
  """Model shape (hashable: it is static in the jitted step).

  Attributes:
    num_dense_features: width of the dense input.
    feature_dims: ((feature name, embedding dim), ...) in the order of
      `jax.tree.leaves(feature_specs)`, which is the activations' order.
    bottom_mlp_dims: widths of the bottom MLP; the last is the interaction
      dim d.
    top_mlp_dims: hidden widths of the top MLP (a final 1-unit layer is added).
  """

  num_dense_features: int
  feature_dims: tuple[tuple[str, int], ...]
  bottom_mlp_dims: tuple[int, ...] = (64, 16)
  top_mlp_dims: tuple[int, ...] = (64, 32)

  def __post_init__(self):
    object.__setattr__(self, "feature_dims", tuple((str(n), int(d)) for n, d in self.feature_dims))
    object.__setattr__(self, "bottom_mlp_dims", tuple(self.bottom_mlp_dims))
    object.__setattr__(self, "top_mlp_dims", tuple(self.top_mlp_dims))
    if self.num_dense_features < 0:
      raise ValueError(f"DLRM: num_dense_features={self.num_dense_features} must be >= 0")
    if not self.bottom_mlp_dims or min(self.bottom_mlp_dims) <= 0:
      raise ValueError(
        f"DLRM: bottom_mlp_dims={self.bottom_mlp_dims} must be non-empty and positive"
      )
    if self.top_mlp_dims and min(self.top_mlp_dims) <= 0:
      raise ValueError(f"DLRM: top_mlp_dims={self.top_mlp_dims} must be positive")
    if not self.feature_dims:
      raise ValueError("DLRM: feature_dims is empty")
    names = [n for n, _ in self.feature_dims]
    if len(set(names)) != len(names):
      raise ValueError(f"DLRM: duplicate feature names in {names}")

  @classmethod
  def from_feature_specs(
    cls, feature_specs: Any, num_dense_features: int, **kwargs: Any
  ) -> "DLRMConfig":
    """Takes names and output dims from the (prepared) feature specs."""
    dims = tuple((f.name, int(f.output_shape[-1])) for f in jax.tree.leaves(feature_specs))
    return cls(num_dense_features=num_dense_features, feature_dims=dims, **kwargs)

  @property
  def interaction_dim(self) -> int:
    return self.bottom_mlp_dims[-1]

  @property
  def num_interactions(self) -> int:
    n = len(self.feature_dims) + (1 if self.num_dense_features else 0)
    return n * (n - 1) // 2


def _dense_layer(key: jax.Array, fan_in: int, fan_out: int) -> dict[str, jax.Array]:
  """DLRM's init: N(0, sqrt(2/(in+out))) kernel, N(0, sqrt(1/out)) bias."""
  k_w, k_b = jax.random.split(key)
  return {
    "kernel": jax.random.normal(k_w, (fan_in, fan_out), jnp.float32)
    * np.sqrt(2.0 / (fan_in + fan_out)),
    "bias": jax.random.normal(k_b, (fan_out,), jnp.float32) * np.sqrt(1.0 / fan_out),
  }


def _mlp(key: jax.Array, dims: tuple[int, ...]) -> dict[str, Any]:
  keys = jax.random.split(key, len(dims) - 1)
  return {f"layer_{i}": _dense_layer(keys[i], dims[i], dims[i + 1]) for i in range(len(dims) - 1)}


def init_dlrm_params(key: jax.Array, config: DLRMConfig) -> dict[str, Any]:
  """Fresh parameters (deterministic in `key`)."""
  k_bottom, k_top, k_proj = jax.random.split(key, 3)
  d = config.interaction_dim
  top_in = d + config.num_interactions
  params = {"top_mlp": _mlp(k_top, (top_in,) + config.top_mlp_dims + (1,))}
  if config.num_dense_features:
    params["bottom_mlp"] = _mlp(k_bottom, (config.num_dense_features,) + config.bottom_mlp_dims)
  projected = [(n, dim) for n, dim in config.feature_dims if dim != d]
  if projected:
    keys = jax.random.split(k_proj, len(projected))
    params["projection"] = {
      name: _dense_layer(k, dim, d)["kernel"] for k, (name, dim) in zip(keys, projected)
    }
  return params


def _apply_mlp(layers: dict[str, Any], x: jax.Array, relu_last: bool) -> jax.Array:
  n = len(layers)
  for i in range(n):
    layer = layers[f"layer_{i}"]
    x = x @ layer["kernel"] + layer["bias"]
    if relu_last or i < n - 1:
      x = jax.nn.relu(x)
  return x


def dlrm_logits(
  params: dict[str, Any], config: DLRMConfig, dense: jax.Array, activations: Any
) -> jax.Array:
  """[B] logits from dense features and the embedding activations pytree."""
  leaves = jax.tree.leaves(activations)
  if len(leaves) != len(config.feature_dims):
    raise ValueError(
      f"DLRM: {len(leaves)} activation arrays for"
      f" {len(config.feature_dims)} features {config.feature_dims}"
    )
  d = config.interaction_dim
  vectors = []
  for (name, dim), act in zip(config.feature_dims, leaves):
    if act.shape[-1] != dim:
      raise ValueError(
        f"DLRM: feature '{name}' activations have dim {act.shape[-1]}, config says {dim}"
      )
    vectors.append(act if dim == d else act @ params["projection"][name])
  if config.num_dense_features:
    x = _apply_mlp(params["bottom_mlp"], dense, relu_last=True)
    vectors.insert(0, x)
  else:  # no dense input: the first-order term is the sum of the embeddings
    x = sum(vectors)
  t = jnp.stack(vectors, axis=1)  # [B, F+1, d] (F without dense features)
  z = jnp.einsum("bid,bjd->bij", t, t)
  rows, cols = np.tril_indices(len(vectors), k=-1)
  top_in = jnp.concatenate([x, z[:, rows, cols]], axis=1)
  return _apply_mlp(params["top_mlp"], top_in, relu_last=False)[:, 0]


def dlrm_loss(
  params: dict[str, Any],
  config: DLRMConfig,
  dense: jax.Array,
  activations: Any,
  labels: jax.Array,
) -> jax.Array:
  """Mean sigmoid cross-entropy over the batch."""
  logits = dlrm_logits(params, config, dense, activations)
  return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, labels))


def make_dlrm_predict_fn(config: DLRMConfig):
  """The DLRM forward for evaluation: `(params, dense, activations) -> [B] probabilities`.

  sigmoid(dlrm_logits); no loss, no gradients (see pipeline.make_eval_step).
  """

  def predict(params, dense, activations):
    return jax.nn.sigmoid(dlrm_logits(params, config, dense, activations))

  return predict


def make_dlrm_tc_stage(
  config: DLRMConfig, optimizer: optax.GradientTransformation, mesh: Mesh
) -> TcStageFun:
  """The DLRM TC stage: per-device loss and grads, dense update.

  Args:
    config: the model shape.
    optimizer: the dense optax optimizer; a `zero_sharded` one gets its
      gradients reduce-scattered onto its shards, any other all-reduced.
    mesh: the device mesh (data axis).

  Returns:
    `(activations, DenseInputs, TrainState, sc_fwd_aux) -> (activation
    gradients, {"loss": scalar, "finite": bool scalar: loss, dense update and
    activation gradients all finite}, TrainState with step + 1, tc_aux)` where
    tc_aux is the step before the update (int32 scalar, for the default SC
    bwd stage).
  """
  zero = isinstance(optimizer, ZeroTransformation)
  data, replicated = PartitionSpec(DATA_AXIS), PartitionSpec()

  def tc(activations, dense_inputs, train_state: TrainState, sc_fwd_aux=None):
    del sc_fwd_aux
    global_batch = dense_inputs.labels.shape[0]

    def local(params, activations, dense, labels):
      if zero:
        # Per-device partial gradients (no implicit all-reduce).
        params = jax.tree.map(lambda p: jax.lax.pcast(p, DATA_AXIS, to="varying"), params)

      def loss_fn(params, activations):
        logits = dlrm_logits(params, config, dense, activations)
        losses = optax.sigmoid_binary_cross_entropy(logits, labels)
        return jnp.sum(losses) / global_batch

      loss, (param_grads, act_grads) = jax.value_and_grad(loss_fn, argnums=(0, 1))(
        params, activations
      )
      loss = jax.lax.psum(loss, DATA_AXIS)
      if zero:
        param_grads = scatter_gradients(param_grads)
      return loss, param_grads, act_grads

    loss, param_grads, act_grads = jax.shard_map(
      local,
      mesh=mesh,
      in_specs=(replicated, data, data, data),
      out_specs=(replicated, data if zero else replicated, data),
    )(train_state.params, activations, dense_inputs.dense, dense_inputs.labels)

    if zero:
      param_grads = ScatteredGradients(param_grads)
    updates, opt_state = optimizer.update(param_grads, train_state.opt_state, train_state.params)
    params = optax.apply_updates(train_state.params, updates)
    new_state = train_state.replace(step=train_state.step + 1, params=params, opt_state=opt_state)
    # One flag for the loss, the dense update and the embedding gradients,
    # so a job can stop before it saves a non-finite model.
    finite = jnp.isfinite(loss) & jnp.isfinite(optax.tree.norm((updates, act_grads)))
    return act_grads, {"loss": loss, "finite": finite}, new_state, train_state.step

  return tc

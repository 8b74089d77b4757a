"""The TC stage of any model: loss, gradients, ZeRO scatter, finiteness.

    activations {feature: [B, dim]}, DenseInputs(labels [B], dense [B, d])
      -> per device (shard_map over the data axis, the local batch):
         logits = model.apply(params, dense, embeddings)
         loss   = sum of sigmoid cross-entropy / global batch
         param and activation gradients
      -> dense optimizer update (replicated params), step + 1

A model contributes its math only (models/model_protocol.py); this stage is the same
for every model. Parameter gradients are computed per device and reduced
twice in the program: summed (all-reduce, what a plain optax optimizer
takes) and reduce-scattered onto the ZeRO shards, offered to a
`zero_sharded` optimizer through `zero.offer_scattered_gradients`. XLA
keeps whichever the optimizer uses and drops the other, so ZeRO gets a
reduce-scatter and no all-reduce, wherever it sits (alone, first in an
optax.chain, or around one), without this stage knowing the optimizer.

The output is {"loss": scalar, "finite": bool scalar}: "finite" covers
the loss, the dense update and the activation gradients, so a job can stop
before it saves a non-finite model.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, PartitionSpec

from sparsepipe.core.mesh import DATA_AXIS
from sparsepipe.pipeline.models.model_protocol import Model
from sparsepipe.pipeline.models.model_protocol import embeddings_by_name
from sparsepipe.pipeline.pipelining.pipeline_state import TcStageFun
from sparsepipe.pipeline.training.train_state import TrainState
from sparsepipe.pipeline.zero.optimizer import offer_scattered_gradients
from sparsepipe.pipeline.zero.optimizer import scatter_gradients


class DenseInputs(NamedTuple):
  """The TC stage's dense inputs: [B] float32 labels, [B, num_dense] floats."""

  labels: Any
  dense: Any


def model_logits(model: Model, feature_specs: Any, params: Any, dense: Any, activations: Any):
  """model.apply on the SC stage's activations, checked to be [B] logits."""
  logits = model.apply(params, dense, embeddings_by_name(feature_specs, activations))
  batch = dense.shape[0]
  if getattr(logits, "shape", None) != (batch,):
    raise ValueError(
      f"{type(model).__name__}.apply returned logits of shape"
      f" {getattr(logits, 'shape', type(logits).__name__)} for a batch of {batch} examples;"
      f" it must return [B] = ({batch},)"
    )
  return logits


def make_predict_fn(model: Model, feature_specs: Any):
  """`(params, dense, activations) -> [B] probabilities`: sigmoid of the model's logits."""

  def predict(params, dense, activations):
    return jax.nn.sigmoid(model_logits(model, feature_specs, params, dense, activations))

  return predict


def make_tc_stage(
  model: Model,
  optimizer: optax.GradientTransformation,
  mesh: Mesh,
  feature_specs: Any,
) -> TcStageFun:
  """The TC stage of `model` trained with the dense `optimizer`.

  Args:
    model: an object with init/apply (models/model_protocol.py).
    optimizer: any optax optimizer; `zero_sharded(...)` (alone, first in a
      chain, or around one) gets reduce-scattered gradients.
    mesh: the device mesh (data axis).
    feature_specs: the prepared feature specs (names and the activations' order).

  Returns:
    `(activations, DenseInputs, TrainState, sc_fwd_aux) -> (activation
    gradients, {"loss", "finite"}, TrainState with step + 1, tc_aux)` where
    tc_aux is the step before the update (int32 scalar, for the default SC
    bwd stage).
  """
  data, replicated = PartitionSpec(DATA_AXIS), PartitionSpec()

  def tc(activations, dense_inputs, train_state: TrainState, sc_fwd_aux=None):
    del sc_fwd_aux
    global_batch = dense_inputs.labels.shape[0]

    def local(params, activations, dense, labels):
      # Per-device partial gradients (no implicit all-reduce): reduced below.
      params = jax.tree.map(lambda p: jax.lax.pcast(p, DATA_AXIS, to="varying"), params)

      def loss_fn(params, activations):
        logits = model_logits(model, feature_specs, params, dense, activations)
        losses = optax.sigmoid_binary_cross_entropy(logits, labels)
        return jnp.sum(losses) / global_batch

      loss, (grads, act_grads) = jax.value_and_grad(loss_fn, argnums=(0, 1))(params, activations)
      summed = jax.tree.map(lambda g: jax.lax.psum(g, DATA_AXIS), grads)
      return jax.lax.psum(loss, DATA_AXIS), summed, scatter_gradients(grads), act_grads

    loss, grads, scattered, act_grads = jax.shard_map(
      local,
      mesh=mesh,
      in_specs=(replicated, data, data, data),
      out_specs=(replicated, replicated, data, data),
    )(train_state.params, activations, dense_inputs.dense, dense_inputs.labels)

    with offer_scattered_gradients(grads, scattered):
      updates, opt_state = optimizer.update(grads, train_state.opt_state, train_state.params)
    params = optax.apply_updates(train_state.params, updates)
    new_state = train_state.replace(step=train_state.step + 1, params=params, opt_state=opt_state)
    finite = jnp.isfinite(loss) & jnp.isfinite(optax.tree.norm((updates, act_grads)))
    return act_grads, {"loss": loss, "finite": finite}, new_state, train_state.step

  return tc

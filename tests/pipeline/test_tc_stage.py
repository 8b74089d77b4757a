"""The TC stage of any model: loss and gradients, and ZeRO composed with optax."""

from __future__ import annotations

import re

import jax
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from sparsepipe import core
from sparsepipe import pipeline
from sparsepipe.core.mesh import DATA_AXIS
from sparsepipe.pipeline.training import train_state as train_state_lib

B, ND = 16, 5
FEATURE_DIMS = {"a": 8, "b": 4, "c": 8}
MODELS = {
  "dlrm": pipeline.DLRM(bottom_mlp_dims=(12, 8), top_mlp_dims=(10,)),
  "dcn_v2": pipeline.DCNv2(cross_layers=2, cross_rank=3, mlp_dims=(6,)),
}


class _Spec:
  """The part of a FeatureSpec the stage reads: the name and the output dim."""

  def __init__(self, name, dim):
    self.name, self.output_shape = name, (B, dim)


SPECS = {n: _Spec(n, d) for n, d in FEATURE_DIMS.items()}


@pytest.fixture(scope="module")
def mesh():
  return core.make_mesh()


def inputs(seed):
  r = np.random.default_rng(seed)
  dense = r.normal(size=(B, ND)).astype(np.float32)
  acts = {n: r.normal(size=(B, d)).astype(np.float32) for n, d in FEATURE_DIMS.items()}
  labels = r.integers(0, 2, B).astype(np.float32)
  return dense, acts, labels


def stage_and_state(mesh, model, optimizer):
  params = model.init(jax.random.key(0), ND, FEATURE_DIMS)
  state = train_state_lib.create_train_state(optimizer, params, mesh, None)
  return jax.jit(pipeline.make_tc_stage(model, optimizer, mesh, SPECS)), state


def stage_args(mesh, seed):
  dense, acts, labels = inputs(seed)
  data = NamedSharding(mesh, PartitionSpec(DATA_AXIS))
  return jax.device_put(acts, data), jax.device_put(pipeline.DenseInputs(labels, dense), data)


def run_stage(mesh, model, optimizer, steps=3):
  stage, state = stage_and_state(mesh, model, optimizer)
  results = []
  for i in range(steps):
    grads, out, state, aux = stage(*stage_args(mesh, i), state, None)
    results.append((grads, out, aux))
  return state, results


@pytest.mark.parametrize("name", sorted(MODELS))
def test_zero_equals_replicated_and_gives_the_global_gradients(mesh, name):
  model, opt = MODELS[name], optax.adam(0.01)
  z_state, z_results = run_stage(mesh, model, pipeline.zero_sharded(opt, mesh))
  r_state, _ = run_stage(mesh, model, opt)
  for a, b in zip(jax.tree.leaves(z_state.params), jax.tree.leaves(r_state.params)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  assert int(z_state.step) == int(r_state.step) == 3
  assert [int(aux) for _, _, aux in z_results] == [0, 1, 2]
  # First step: loss and activation gradients of the global mean loss.
  params = model.init(jax.random.key(0), ND, FEATURE_DIMS)
  dense, acts, labels = inputs(0)

  def loss(a):
    return optax.sigmoid_binary_cross_entropy(model.apply(params, dense, a), labels).mean()

  value, act_grads = jax.value_and_grad(loss)(acts)
  grads, out, _ = z_results[0]
  np.testing.assert_allclose(out["loss"], value, rtol=1e-6)
  assert bool(out["finite"])
  for feature in act_grads:
    np.testing.assert_allclose(grads[feature], act_grads[feature], rtol=1e-5, atol=1e-8)
    assert grads[feature].sharding.spec == PartitionSpec(DATA_AXIS)
  for leaf in jax.tree.leaves(z_state.opt_state[0].mu):
    assert leaf.sharding.spec == PartitionSpec(DATA_AXIS)
  for leaf in jax.tree.leaves(z_state.params):
    assert leaf.sharding.is_fully_replicated


def gradient_collectives(mesh, optimizer):
  """(reduce-scatters, all-reduces of non-scalars) in the compiled stage."""
  stage, state = stage_and_state(mesh, MODELS["dlrm"], optimizer)
  hlo = stage.lower(*stage_args(mesh, 0), state, None).compile().as_text()
  scatters = len(re.findall(r" reduce-scatter\(", hlo))
  # All-reduces of scalars only (the loss, norms) are not gradient reductions.
  results = re.findall(r"= (.*?) all-reduce\(", hlo)
  vector_reduces = sum(1 for result in results if re.search(r"\[\d", result))
  return scatters, vector_reduces


def test_zero_alone_first_in_a_chain_or_around_one_reduce_scatters(mesh):
  adam = optax.adam(0.01)
  for optimizer in (
    pipeline.zero_sharded(adam, mesh),
    optax.chain(pipeline.zero_sharded(adam, mesh), optax.scale(0.5)),
    pipeline.zero_sharded(optax.chain(optax.clip_by_global_norm(1.0), adam), mesh),
  ):
    scatters, vector_reduces = gradient_collectives(mesh, optimizer)
    assert scatters >= 1 and vector_reduces == 0, (scatters, vector_reduces)
  # A plain optimizer gets all-reduced gradients and no reduce-scatter.
  scatters, vector_reduces = gradient_collectives(mesh, adam)
  assert scatters == 0 and vector_reduces >= 1, (scatters, vector_reduces)


def test_zero_after_a_gradient_change_is_refused_with_one_line(mesh):
  message = (
    r"^zero_sharded: the updates it received were changed after the gradients were computed"
    r" \(a transformation before it in optax.chain, or a wrapper such as MultiSteps\), so it"
    r" cannot use the reduce-scattered gradients: make zero_sharded the outermost"
    r" transformation, e.g. zero_sharded\(optax.chain\(clip, adam\), mesh\)(\n|$)"
  )
  zero = pipeline.zero_sharded(optax.adam(0.01), mesh)
  for optimizer in (
    optax.chain(optax.clip_by_global_norm(1.0), zero),
    optax.MultiSteps(zero, every_k_schedule=2),
  ):
    with pytest.raises(ValueError, match=message):
      run_stage(mesh, MODELS["dlrm"], optimizer, steps=1)


class _ColumnLogits:
  """Returns [B, 1]: a common slip the stage must catch (it would broadcast)."""

  def init(self, rng, dense_dim, feature_dims):
    return {"w": jax.numpy.zeros((dense_dim, 1))}

  def apply(self, params, dense, embeddings):
    return dense @ params["w"]


def test_logits_of_another_shape_are_an_error_naming_the_model(mesh):
  with pytest.raises(
    ValueError,
    match=r"^_ColumnLogits.apply returned logits of shape \(2, 1\) for a batch of 2 examples;"
    r" it must return \[B\] = \(2,\)(\n|$)",
  ):
    run_stage(mesh, _ColumnLogits(), optax.sgd(0.1), steps=1)

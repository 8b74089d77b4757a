"""The DLRM reference model and its TC stage (ZeRO and replicated optimizer)."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from sparsepipe.pipeline.models import dlrm
from sparsepipe.pipeline.training import train_state as train_state_lib
from sparsepipe import pipeline
from sparsepipe.core.mesh import DATA_AXIS, make_mesh

B, ND = 16, 5
CONFIG = dlrm.DLRMConfig(
  num_dense_features=ND,
  feature_dims=(("a", 8), ("b", 4), ("c", 8)),
  bottom_mlp_dims=(12, 8),
  top_mlp_dims=(10,),
)


def inputs(seed=0):
  r = np.random.default_rng(seed)
  dense = r.normal(size=(B, ND)).astype(np.float32)
  acts = {n: r.normal(size=(B, d)).astype(np.float32) for n, d in CONFIG.feature_dims}
  labels = r.integers(0, 2, B).astype(np.float32)
  return dense, acts, labels


def numpy_logits(params, dense, acts):
  p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
  x = dense.astype(np.float64)
  for i in range(2):
    layer = p["bottom_mlp"][f"layer_{i}"]
    x = np.maximum(x @ layer["kernel"] + layer["bias"], 0)
  vectors = [x]
  for name, dim in CONFIG.feature_dims:
    a = acts[name].astype(np.float64)
    vectors.append(a @ p["projection"][name] if dim != 8 else a)
  feats = [x]
  for i in range(len(vectors)):
    for j in range(i):
      feats.append(np.sum(vectors[i] * vectors[j], axis=1, keepdims=True))
  h = np.concatenate(feats, axis=1)
  layer = p["top_mlp"]["layer_0"]
  h = np.maximum(h @ layer["kernel"] + layer["bias"], 0)
  layer = p["top_mlp"]["layer_1"]
  return (h @ layer["kernel"] + layer["bias"])[:, 0]


def test_init_shapes_and_determinism():
  params = dlrm.init_dlrm_params(jax.random.key(3), CONFIG)
  shapes = jax.tree.map(lambda x: x.shape, params)
  assert shapes == {
    "bottom_mlp": {
      "layer_0": {"kernel": (5, 12), "bias": (12,)},
      "layer_1": {"kernel": (12, 8), "bias": (8,)},
    },
    # 8 bottom outputs + 4*3/2 = 6 interactions.
    "top_mlp": {
      "layer_0": {"kernel": (14, 10), "bias": (10,)},
      "layer_1": {"kernel": (10, 1), "bias": (1,)},
    },
    "projection": {"b": (4, 8)},
  }
  again = dlrm.init_dlrm_params(jax.random.key(3), CONFIG)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(again)):
    np.testing.assert_array_equal(a, b)
  assert CONFIG.num_interactions == 6


def test_logits_match_numpy():
  params = dlrm.init_dlrm_params(jax.random.key(0), CONFIG)
  dense, acts, labels = inputs()
  logits = dlrm.dlrm_logits(params, CONFIG, dense, acts)
  np.testing.assert_allclose(logits, numpy_logits(params, dense, acts), rtol=1e-5, atol=1e-5)
  z = numpy_logits(params, dense, acts)
  expected = np.mean(np.maximum(z, 0) - z * labels + np.log1p(np.exp(-np.abs(z))))
  np.testing.assert_allclose(
    dlrm.dlrm_loss(params, CONFIG, dense, acts, labels), expected, rtol=1e-5
  )


def test_without_dense_features_the_embeddings_sum_is_the_first_order_term():
  """Ratings data has no dense features: x is the sum of the feature vectors."""
  config = dlrm.DLRMConfig(0, CONFIG.feature_dims, bottom_mlp_dims=(8,), top_mlp_dims=(10,))
  params = dlrm.init_dlrm_params(jax.random.key(1), config)
  assert "bottom_mlp" not in params and config.num_interactions == 3
  assert params["top_mlp"]["layer_0"]["kernel"].shape == (8 + 3, 10)
  _, acts, _ = inputs()
  p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
  vectors = [
    acts[n].astype(np.float64) @ p["projection"][n] if d != 8 else acts[n]
    for n, d in config.feature_dims
  ]
  feats = [sum(vectors)] + [
    np.sum(vectors[i] * vectors[j], axis=1, keepdims=True) for i in range(3) for j in range(i)
  ]
  h = np.maximum(
    np.concatenate(feats, axis=1) @ p["top_mlp"]["layer_0"]["kernel"]
    + p["top_mlp"]["layer_0"]["bias"],
    0,
  )
  expected = (h @ p["top_mlp"]["layer_1"]["kernel"] + p["top_mlp"]["layer_1"]["bias"])[:, 0]
  logits = dlrm.dlrm_logits(params, config, np.zeros((B, 0), np.float32), acts)
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def test_config_from_feature_specs_and_errors():
  class Spec:
    def __init__(self, name, dim):
      self.name, self.output_shape = name, (B, dim)

  config = dlrm.DLRMConfig.from_feature_specs(
    {"x": Spec("x", 4), "y": Spec("y", 16)}, 3, bottom_mlp_dims=(16,)
  )
  assert config.feature_dims == (("x", 4), ("y", 16))
  with pytest.raises(ValueError, match=r"DLRM: duplicate feature names in \['a', 'a'\]"):
    dlrm.DLRMConfig(2, (("a", 4), ("a", 4)))
  with pytest.raises(ValueError, match="DLRM: num_dense_features=-1 must be >= 0"):
    dlrm.DLRMConfig(-1, (("a", 4),))
  params = dlrm.init_dlrm_params(jax.random.key(0), CONFIG)
  dense, acts, _ = inputs()
  with pytest.raises(ValueError, match=r"DLRM: 2 activation arrays for 3 features"):
    dlrm.dlrm_logits(params, CONFIG, dense, {"a": acts["a"], "b": acts["b"]})
  acts["c"] = acts["c"][:, :4]
  with pytest.raises(ValueError, match="DLRM: feature 'c' activations have dim 4, config says 8"):
    dlrm.dlrm_logits(params, CONFIG, dense, acts)


@pytest.fixture(scope="module")
def mesh():
  return make_mesh()


def run_stage(mesh, optimizer, steps=3):
  params = dlrm.init_dlrm_params(jax.random.key(0), CONFIG)
  state = train_state_lib.create_train_state(optimizer, params, mesh, None)
  stage = jax.jit(dlrm.make_dlrm_tc_stage(CONFIG, optimizer, mesh))
  data = NamedSharding(mesh, PartitionSpec(DATA_AXIS))
  results = []
  for i in range(steps):
    dense, acts, labels = inputs(i)
    dense_inputs = jax.device_put(dlrm.DenseInputs(labels, dense), data)
    grads, out, state, aux = stage(jax.device_put(acts, data), dense_inputs, state, None)
    results.append((grads, out, aux))
  return state, results


def test_tc_stage_zero_equals_replicated_and_global_gradients(mesh):
  opt = optax.adam(0.01)
  z_state, z_results = run_stage(mesh, pipeline.zero_sharded(opt, mesh))
  r_state, r_results = run_stage(mesh, opt)
  for a, b in zip(jax.tree.leaves(z_state.params), jax.tree.leaves(r_state.params)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  assert int(z_state.step) == int(r_state.step) == 3
  assert [int(aux) for _, _, aux in z_results] == [0, 1, 2]
  # First step: loss and activation gradients of the global mean loss.
  params = dlrm.init_dlrm_params(jax.random.key(0), CONFIG)
  dense, acts, labels = inputs(0)
  loss, act_grads = jax.value_and_grad(lambda a: dlrm.dlrm_loss(params, CONFIG, dense, a, labels))(
    acts
  )
  grads, out, _ = z_results[0]
  np.testing.assert_allclose(out["loss"], loss, rtol=1e-6)
  for name in act_grads:
    np.testing.assert_allclose(grads[name], act_grads[name], rtol=1e-5, atol=1e-8)
    assert grads[name].sharding.spec == PartitionSpec(DATA_AXIS)
  for leaf in jax.tree.leaves(z_state.opt_state[0].mu):
    assert leaf.sharding.spec == PartitionSpec(DATA_AXIS)
  for leaf in jax.tree.leaves(z_state.params):
    assert leaf.sharding.is_fully_replicated

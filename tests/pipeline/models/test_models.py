"""The built-in models (DLRM, DCN-v2) against numpy, and the model registry."""

from __future__ import annotations

import jax
import ml_collections
import numpy as np
import pytest

from sparsepipe import pipeline
from sparsepipe.pipeline.models import registry

B, ND = 16, 5
FEATURE_DIMS = {"a": 8, "b": 4, "c": 8}
DLRM = pipeline.DLRM(bottom_mlp_dims=(12, 8), top_mlp_dims=(10,))


def inputs(seed=0, feature_dims=FEATURE_DIMS):
  r = np.random.default_rng(seed)
  dense = r.normal(size=(B, ND)).astype(np.float32)
  acts = {n: r.normal(size=(B, d)).astype(np.float32) for n, d in feature_dims.items()}
  return dense, acts


def f64(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def numpy_mlp(layers, x, relu_last):
  for i in range(len(layers)):
    x = x @ layers[f"layer_{i}"]["kernel"] + layers[f"layer_{i}"]["bias"]
    if relu_last or i < len(layers) - 1:
      x = np.maximum(x, 0)
  return x


def numpy_dlrm(params, dense, acts):
  p = f64(params)
  vectors = []
  if "bottom_mlp" in p:
    vectors.append(numpy_mlp(p["bottom_mlp"], dense.astype(np.float64), relu_last=True))
  for name in sorted(acts):
    a = acts[name].astype(np.float64)
    vectors.append(a @ p["projection"][name] if name in p.get("projection", {}) else a)
  x = vectors[0] if "bottom_mlp" in p else sum(vectors)
  feats = [x] + [
    np.sum(vectors[i] * vectors[j], axis=1, keepdims=True)
    for i in range(len(vectors))
    for j in range(i)
  ]
  return numpy_mlp(p["top_mlp"], np.concatenate(feats, axis=1), relu_last=False)[:, 0]


def test_dlrm_init_shapes_and_determinism():
  params = DLRM.init(jax.random.key(3), ND, FEATURE_DIMS)
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
  again = DLRM.init(jax.random.key(3), ND, dict(reversed(FEATURE_DIMS.items())))
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(again)):
    np.testing.assert_array_equal(a, b)


def test_dlrm_logits_match_numpy():
  params = DLRM.init(jax.random.key(0), ND, FEATURE_DIMS)
  dense, acts = inputs()
  np.testing.assert_allclose(
    DLRM.apply(params, dense, acts), numpy_dlrm(params, dense, acts), rtol=1e-5, atol=1e-5
  )


def test_dlrm_without_dense_features_sums_the_embeddings_as_first_order_term():
  """Ratings data has no dense features: x is the sum of the feature vectors."""
  model = pipeline.DLRM(bottom_mlp_dims=(8,), top_mlp_dims=(10,))
  params = model.init(jax.random.key(1), 0, FEATURE_DIMS)
  assert "bottom_mlp" not in params
  assert params["top_mlp"]["layer_0"]["kernel"].shape == (8 + 3, 10)
  _, acts = inputs()
  dense = np.zeros((B, 0), np.float32)
  np.testing.assert_allclose(
    model.apply(params, dense, acts), numpy_dlrm(params, dense, acts), rtol=1e-5, atol=1e-5
  )


def test_dlrm_errors_name_the_problem():
  with pytest.raises(ValueError, match=r"^DLRM: bottom_mlp_dims=\(\) must be non-empty"):
    pipeline.DLRM(bottom_mlp_dims=())
  with pytest.raises(ValueError, match=r"^DLRM: dense_dim=-1 must be >= 0$"):
    DLRM.init(jax.random.key(0), -1, FEATURE_DIMS)
  params = DLRM.init(jax.random.key(0), ND, FEATURE_DIMS)
  dense, acts = inputs()
  with pytest.raises(
    ValueError,
    match=r"^DLRM: 2 features \(and 5 dense\) give 3 interactions; the params were made for 6$",
  ):
    DLRM.apply(params, dense, {"a": acts["a"], "b": acts["b"]})
  acts["c"] = acts["c"][:, :4]
  with pytest.raises(ValueError, match=r"^DLRM: feature 'c' has dim 4, neither the interaction"):
    DLRM.apply(params, dense, acts)


def numpy_dcn(params, dense, acts):
  p = f64(params)
  x0 = np.concatenate([dense] + [acts[n] for n in sorted(acts)], axis=1).astype(np.float64)
  x = x0
  for i in range(len(p["cross"])):
    layer = p["cross"][f"layer_{i}"]
    mixed = x @ layer["kernel"] if "kernel" in layer else (x @ layer["u"]) @ layer["v"]
    x = x0 * (mixed + layer["bias"]) + x
  return numpy_mlp(p["mlp"], x, relu_last=False)[:, 0]


@pytest.mark.parametrize("rank", [0, 3])
def test_dcn_v2_logits_match_numpy(rank):
  model = pipeline.DCNv2(cross_layers=2, cross_rank=rank, mlp_dims=(7,))
  params = model.init(jax.random.key(2), ND, FEATURE_DIMS)
  width = ND + 8 + 4 + 8
  cross = params["cross"]["layer_0"]
  if rank:
    assert (cross["u"].shape, cross["v"].shape) == ((width, 3), (3, width))
  else:
    assert cross["kernel"].shape == (width, width)
  np.testing.assert_array_equal(cross["bias"], np.zeros(width, np.float32))
  assert params["mlp"]["layer_0"]["kernel"].shape == (width, 7)
  # Nonzero biases, so the test sees them used.
  params = jax.tree.map(lambda x: x + 0.01, params)
  dense, acts = inputs(1)
  np.testing.assert_allclose(
    model.apply(params, dense, acts), numpy_dcn(params, dense, acts), rtol=1e-4, atol=1e-5
  )


def test_dcn_v2_errors_name_the_problem():
  with pytest.raises(ValueError, match=r"^DCN-v2: cross_layers=0 must be >= 1$"):
    pipeline.DCNv2(cross_layers=0)
  with pytest.raises(ValueError, match=r"^DCN-v2: cross_rank=-1 must be >= 0 \(0: full rank\)$"):
    pipeline.DCNv2(cross_rank=-1)
  model = pipeline.DCNv2(cross_layers=1)
  params = model.init(jax.random.key(0), ND, FEATURE_DIMS)
  dense, acts = inputs()
  del acts["b"]
  with pytest.raises(ValueError, match=r"^DCN-v2: dense and embeddings concatenate to width 21;"):
    model.apply(params, dense, acts)


def model_config(**fields):
  base = dict(
    name="dlrm",
    factory="",
    embedding_dim=8,
    bottom_mlp_dims=(12, 8),
    top_mlp_dims=(10,),
    cross_layers=2,
    cross_rank=0,
  )
  return ml_collections.ConfigDict({**base, **fields})


def test_make_model_builds_the_builtins_from_their_config_fields():
  assert pipeline.make_model(model_config()) == DLRM
  assert pipeline.make_model(model_config(name="dcn_v2", cross_rank=4)) == pipeline.DCNv2(
    cross_layers=2, cross_rank=4, mlp_dims=(10,)
  )
  assert sorted(pipeline.BUILTIN_MODELS) == ["dcn_v2", "dlrm"]


class _NotAModel:
  def init(self, rng, dense_dim, feature_dims):
    return {}


def _not_a_model(config):
  del config
  return _NotAModel()


def _own_model(config):
  return pipeline.DCNv2(cross_layers=int(config.cross_layers))


def test_make_model_calls_a_factory_with_the_model_config():
  config = model_config(factory=f"{__name__}:_own_model", cross_layers=1)
  assert pipeline.make_model(config) == pipeline.DCNv2(cross_layers=1)
  assert registry.model_name(config) == f"{__name__}:_own_model"
  assert registry.model_name(model_config(name="dcn_v2")) == "dcn_v2"


@pytest.mark.parametrize(
  "fields, message",
  [
    (
      dict(name="mlp"),
      r"^config.model.name='mlp' is not a built-in model \['dcn_v2', 'dlrm'\]; give your own"
      r" with config.model.factory='package.module:function'$",
    ),
    (dict(factory="no_colon"), r"^config.model.factory='no_colon' is not of the form"),
    (
      dict(factory="no_such_module_xyz:make"),
      r"^config.model.factory='no_such_module_xyz:make': cannot import module"
      r" 'no_such_module_xyz' \(ModuleNotFoundError: ",
    ),
    (
      dict(factory=f"{__name__}:missing"),
      rf"^config.model.factory='{__name__}:missing': module '{__name__}' has no function",
    ),
    (
      dict(factory=f"{__name__}:_not_a_model"),
      rf"^config.model.factory='{__name__}:_not_a_model' made a _NotAModel, which has no apply:",
    ),
  ],
)
def test_make_model_errors_are_one_line_naming_the_field(fields, message):
  with pytest.raises(ValueError, match=message):
    pipeline.make_model(model_config(**fields))


def test_a_builtin_missing_its_fields_names_them():
  config = ml_collections.ConfigDict(dict(name="dcn_v2", top_mlp_dims=(4,)))
  with pytest.raises(
    ValueError, match=r"^config.model has no field 'cross_layers', which model 'dcn_v2' needs$"
  ):
    pipeline.make_model(config)

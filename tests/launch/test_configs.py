"""The shipped configs build valid specs, models and input configs."""

import paths
import importlib.util
import os

import pytest

import jax

from sparsepipe import pipeline
from sparsepipe import transforms
from sparsepipe.launch.config import fields
from sparsepipe.launch.config import config_specs
from sparsepipe.launch.config.shipped import config_path

CHECKOUT_CONFIGS = os.path.join(paths.REPO_ROOT, "configs")


def _load_file(path):
  spec = importlib.util.spec_from_file_location("config_under_test", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def _load(name):
  return _load_file(config_path(name))


@pytest.mark.parametrize("name", ["demo", "criteo"])
def test_shipped_configs_are_in_the_package_and_the_checkout_files_match(name):
  assert config_path(name).startswith(os.path.dirname(config_specs.__file__))
  assert _load_file(os.path.join(CHECKOUT_CONFIGS, f"{name}.py")) == _load(name)


def test_unknown_or_path_like_names_are_not_shipped_configs():
  assert config_path("nope") is None
  assert config_path("../configs/demo") is None


@pytest.mark.parametrize("name, num_features, num_dense", [("demo", 4, 4), ("criteo", 26, 13)])
def test_config_builds_specs_and_model(name, num_features, num_dense):
  config = _load(name)
  batch = config.global_batch_size  # one process: the same per host
  specs = config_specs.build_feature_specs(config, global_batch_size=batch, global_device_count=8)
  assert sorted(specs) == sorted(config.features.keys())
  assert len(specs) == num_features
  for feature in specs.values():
    assert feature.input_shape[0] == batch
    assert feature.table_spec.stacked_table_spec is not None
  model = pipeline.make_model(config.model)
  assert model == pipeline.DLRM(config.model.bottom_mlp_dims, config.model.top_mlp_dims)
  params = jax.eval_shape(
    lambda key: model.init(key, num_dense, pipeline.feature_dims_of(specs)), jax.random.key(0)
  )
  assert params["bottom_mlp"]["layer_0"]["kernel"].shape[0] == num_dense
  assert config_specs.input_config(config, "/data").per_host_batch_size == batch


def test_zero_limits_mean_the_worst_case_of_the_batch():
  config = _load("demo")
  # 128 samples over 8 devices x 2 SCs = 8 per SC, 1+1+3+8 = 13 ids each.
  assert config_specs.worst_case_ids_per_partition(config, 128, 8) == 104
  specs = config_specs.build_feature_specs(config, global_batch_size=128, global_device_count=8)
  (limits,) = transforms.get_stack_limits(specs).values()
  assert limits["max_ids_per_partition"] == limits["max_unique_ids_per_partition"] == 104


@pytest.mark.parametrize(
  "devices, max_ids, max_unique",
  [
    # 4096 / (1 x 4 SCs) = 1024 samples x 26 ids: the worst case bounds both.
    (1, 26624, 26624),
    (2, 13312, 8192),  # 512 x 26 bounds 1024 * 4**2; 512 * 4**2 is under it
    (4, 4096, 2048),  # 1024 and 512 times 2**2, under the worst case 6656
    (8, 1024, 512),  # the devices the limits were set for: as configured
    (16, 1024, 512),  # more partitions: a partition's ids do not grow
  ],
)
def test_criteo_limits_follow_the_device_count(devices, max_ids, max_unique):
  config = _load("criteo")
  specs = config_specs.build_feature_specs(
    config, global_batch_size=4096, global_device_count=devices
  )
  for limits in transforms.get_stack_limits(specs).values():
    assert limits["max_ids_per_partition"] == max_ids
    assert limits["max_unique_ids_per_partition"] == max_unique


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("stacking", "some", r"stacking='some' is not 'auto' or 'none'"),
    (
      "embedding_optimizer.name",
      "rmsprop",
      r"embedding_optimizer.name='rmsprop' is not one of \['adagrad',"
      r" 'adagrad_momentum', 'adam', 'ftrl', 'laprop', 'sgd'\]",
    ),
  ],
)
def test_bad_config_values_are_named(field, value, message):
  config = _load("demo")
  node, key = (
    (config, field) if "." not in field else (config[field.split(".")[0]], field.split(".")[1])
  )
  node[key] = value
  with pytest.raises(ValueError, match=message):
    config_specs.build_feature_specs(config, global_batch_size=128, global_device_count=8)


def test_every_config_field_is_documented_once():
  assert sorted(fields.FIELD_DOCS) == sorted(fields.config_fields())


def test_the_config_reference_is_current():
  with open(os.path.join(paths.REPO_ROOT, "docs", "reference", "config.md"), encoding="utf-8") as f:
    assert f.read() == fields.render_reference(), (
      "docs/reference/config.md is stale:"
      " python -m sparsepipe.launch.config.fields > docs/reference/config.md"
    )


def test_the_shuffle_window_reaches_the_input_and_is_256_for_a_new_job_by_default():
  config = _load("demo")
  assert config.data.shuffle_window == -1  # a resumed job's window, else a new job's
  assert config_specs.input_config(config, "/d", process_count=1).shuffle_window == 256
  config.data.shuffle_window = 64
  got = config_specs.input_config(config, "/d", process_count=1)
  assert (got.shuffle, got.shuffle_window) == (True, 64)

"""Config features from a manifest; train and eval manifests that must agree."""

import dataclasses
import importlib.util

import numpy as np
import pytest

from sparsepipe import data
from sparsepipe.launch.config import config_specs
from sparsepipe.launch.config import from_manifest as dataset_config

from sparsepipe.launch.config.shipped import config_path


def write(path, vocab, *, num_dense=2, info=None, weighted=(), ids=None):
  """8 examples; feature f has ids.get(f, 1) ids (all 0) in each."""
  schema = data.make_schema(num_dense, vocab, weighted=weighted)
  n, ids = 8, ids or {}
  sparse = {
    name: data.RaggedBatch(
      np.zeros(n * ids.get(name, 1), np.int32),
      np.full(n, ids.get(name, 1), np.int32),
      np.ones(n * ids.get(name, 1), np.float32) if name in weighted else None,
    )
    for name in vocab
  }
  batch = data.ExampleBatch(np.zeros(n, np.float32), np.zeros((n, num_dense), np.float32), sparse)
  manifest = data.write_batches(str(path), schema, [batch])
  # The writer records what it saw; these tests pose other converter info.
  return manifest if info is None else dataclasses.replace(manifest, info=info)


def load_dataset_config():
  spec = importlib.util.spec_from_file_location("dataset", config_path("dataset"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def test_features_from_recorded_ids_per_example(tmp_path):
  info = {
    "ids_per_example": {
      "user": {"max": 1, "mean": 1.0},
      "genres": {"max": 6, "mean": 2.5},
      "empty": {"max": 0, "mean": 0.0},
    }
  }
  manifest = write(tmp_path / "d", {"user": 100, "genres": 20, "empty": 5}, info=info)
  features = dataset_config.features_from_manifest(manifest)
  assert sorted(features.keys()) == ["empty", "genres", "user"]
  assert features.user.to_dict() == dict(
    vocab_size=100, min_ids=0, max_ids=1, zipf_exponent=1.1, combiner="sum"
  )
  assert (features.genres.max_ids, features.genres.combiner) == (6, "mean")
  assert (features.empty.max_ids, features.empty.combiner) == (1, "sum")


def test_features_without_stats_use_converter_info_or_defaults(tmp_path):
  csv_like = write(
    tmp_path / "csv", {"user": 10, "genres": 20}, info={"multivalent_columns": ["genres"]}
  )
  features = dataset_config.features_from_manifest(csv_like)
  assert (features.user.max_ids, features.user.combiner) == (1, "sum")
  assert features.genres.max_ids == dataset_config.MULTIVALENT_MAX_IDS
  assert features.genres.combiner == "mean"
  synthetic = write(
    tmp_path / "syn",
    {"a": 10, "b": 20},
    info={"features": [{"name": "a", "max_ids": 3}, {"name": "b", "max_ids": 1}]},
  )
  features = dataset_config.features_from_manifest(synthetic)
  assert (features.a.max_ids, features.a.combiner, features.b.max_ids) == (3, "mean", 1)


def test_bad_recorded_stats_are_a_clear_error(tmp_path):
  manifest = write(tmp_path / "d", {"a": 10}, info={"ids_per_example": {"a": {"max": 2.5}}})
  with pytest.raises(
    ValueError,
    match=r"recorded max ids per example of feature 'a' is 2.5,"
    r" not a non-negative integer",
  ):
    dataset_config.features_from_manifest(manifest)


def test_mismatched_manifests_list_every_difference(tmp_path):
  train = write(tmp_path / "train", {"a": 10, "b": 20, "c": 5}, num_dense=3)
  evaluation = write(tmp_path / "eval", {"a": 10, "b": 21, "d": 5}, num_dense=2, weighted=("a",))
  with pytest.raises(ValueError) as e:
    dataset_config.check_manifests_agree(train, evaluation)
  assert str(e.value) == (
    f"train data '{train.directory}' and eval data '{evaluation.directory}' disagree:"
    " features the other lacks: ['d'] (eval), ['c'] (train); feature 'b' vocab_size: 21"
    " (eval), 20 (train); feature 'a' weighted: True (eval), False (train); dense columns:"
    " 2 (eval), 3 (train)"
  )
  dataset_config.check_manifests_agree(
    train, write(tmp_path / "same", {"c": 5, "a": 10, "b": 20}, num_dense=3)
  )


def test_dataset_config_builds_specs_from_the_train_manifest(tmp_path):
  write(tmp_path / "train", {"user": 100, "genres": 20}, num_dense=3, ids={"genres": 4})
  write(tmp_path / "eval", {"user": 100, "genres": 20}, num_dense=3)
  config = load_dataset_config()
  assert config.features_from_manifest and config.eval.data_dir == ""
  config.data.dir = str(tmp_path / "train")
  config.eval.data_dir = str(tmp_path / "eval")
  resolved = dataset_config.apply_manifest(config)
  assert len(config.features) == 0  # the given config is unchanged
  assert resolved.synthetic.num_dense == 3
  specs = config_specs.build_feature_specs(resolved, global_batch_size=64, global_device_count=8)
  assert sorted(specs) == ["genres", "user"]
  assert specs["genres"].input_shape == (64, 4)
  assert specs["genres"].table_spec.combiner == "mean"
  assert specs["user"].table_spec.vocabulary_size == 100


def test_dataset_config_needs_data_dir_and_agreeing_eval(tmp_path):
  config = load_dataset_config()
  with pytest.raises(ValueError, match=r"set --config.data.dir to a dataset directory"):
    dataset_config.apply_manifest(config)
  write(tmp_path / "train", {"user": 100}, num_dense=3)
  write(tmp_path / "eval", {"user": 99}, num_dense=3)
  config.data.dir = str(tmp_path / "train")
  config.eval.data_dir = str(tmp_path / "eval")
  with pytest.raises(ValueError, match=r"feature 'user' vocab_size: 99 \(eval\), 100 \(train\)"):
    dataset_config.apply_manifest(config)


def test_max_ids_below_the_recorded_ones_are_refused(tmp_path):
  manifest = write(tmp_path / "ds", {"a": 10, "b": 20, "c": 5}, ids={"a": 3, "b": 2})
  config = load_dataset_config()
  config.features = dataset_config.features_from_manifest(manifest)
  dataset_config.check_max_ids(config, manifest)  # as recorded: fine
  config.features.a.max_ids, config.features.b.max_ids = 2, 1
  with pytest.raises(ValueError) as e:
    dataset_config.check_max_ids(config, manifest)
  assert str(e.value) == (
    f"dataset '{manifest.directory}': feature 'a' has examples of 3 ids,"
    " config.features.a.max_ids = 2; 'b' has examples of 2 ids, config.features.b.max_ids = 1"
    " (the COO buffers are sized by max_ids): raise max_ids to at least the data's"
  )
  # A manifest that records nothing is not checked (max_ids stays the guess it is).
  dataset_config.check_max_ids(config, dataclasses.replace(manifest, info={}))


def test_the_eval_config_takes_the_most_ids_of_the_eval_data_or_the_config(tmp_path):
  """The eval step's worst-case limits come from this config: eval examples of more
  ids than the train data's once overflowed them in the final eval."""
  train = write(tmp_path / "train", {"a": 10, "b": 20, "c": 5}, ids={"a": 1, "b": 4, "c": 2})
  evaluation = write(tmp_path / "eval", {"a": 10, "b": 20, "c": 5}, ids={"a": 7, "b": 2})
  config = load_dataset_config()
  config.data.dir = train.directory
  config.features = dataset_config.features_from_manifest(train)
  got = dataset_config.with_recorded_max_ids(config, evaluation)
  assert {n: f.max_ids for n, f in got.features.items()} == {"a": 7, "b": 4, "c": 2}
  assert {n: f.max_ids for n, f in config.features.items()} == {"a": 1, "b": 4, "c": 2}
  assert got.features.a.combiner == "sum"  # only max_ids changes
  specs = config_specs.build_feature_specs(
    got, global_batch_size=16, global_device_count=1, worst_case_limits=True
  )
  assert [s.input_shape for s in specs.values()] == [(16, 7), (16, 4), (16, 2)]
  unrecorded = dataclasses.replace(evaluation, info={})  # nothing to go by: the config's
  assert dataset_config.with_recorded_max_ids(config, unrecorded).to_dict() == config.to_dict()


def test_eval_data_converted_by_other_rules_is_refused(tmp_path):
  """Eval data whose ids or dense values were made otherwise (here hashed where the
  train data read integer ids) was once evaluated without a word: an AUC of numbers
  that mean nothing. The rules are data.conversion_rules' (serving's tests cover each)."""
  rules = {"converter": "sparsepipe.data.csv", "integer_id_columns": ["a"]}
  train = write(tmp_path / "train", {"a": 10}, info=rules)
  hashed = write(tmp_path / "eval", {"a": 10}, info={**rules, "integer_id_columns": []})
  with pytest.raises(ValueError) as e:
    dataset_config.check_manifests_agree(train, hashed)
  assert str(e.value) == (
    f"train data '{train.directory}' and eval data '{hashed.directory}' disagree:"
    " integer_id_columns: [] (eval), ['a'] (train)"
  )
  dataset_config.check_manifests_agree(train, write(tmp_path / "same", {"a": 10}, info=rules))
  # The Parquet converter records "no weight columns" as {}, the CSV one not at all.
  parquet = {**rules, "converter": "sparsepipe.data.parquet", "weight_columns": {}}
  dataset_config.check_manifests_agree(train, write(tmp_path / "pq", {"a": 10}, info=parquet))
  # A Parquet dataset of 0.3 did not record its list (multivalent) columns: not compared.
  listed = write(tmp_path / "mv", {"a": 10}, info={**rules, "multivalent_columns": ["a"]})
  dataset_config.check_manifests_agree(listed, write(tmp_path / "pq03", {"a": 10}, info=parquet))
  with pytest.raises(ValueError, match=r"multivalent_columns: \[\] \(eval\), \['a'\]"):
    dataset_config.check_manifests_agree(listed, train)
  # Another converter's rules, which serving refuses by name, are refused alike.
  criteo = write(tmp_path / "c", {"a": 10}, info={**rules, "converter": "sparsepipe.data.criteo"})
  with pytest.raises(ValueError) as e:
    dataset_config.check_manifests_agree(train, criteo)
  assert str(e.value) == (
    f"train data '{train.directory}' and eval data '{criteo.directory}' disagree: made by:"
    " 'sparsepipe.data.criteo' (eval), 'sparsepipe.data.csv' (train); dense_transform:"
    " 'none' (eval), {} (train)"  # Criteo's own default
  )

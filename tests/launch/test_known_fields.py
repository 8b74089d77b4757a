"""A config file's fields against the base config's (launch.config.known_fields): a
config file's misspelt field once trained with the default, with status 0."""

import os

import ml_collections
import pytest

from sparsepipe.launch.config.known_fields import complete_config
from sparsepipe.launch.config.shipped import criteo, dataset, demo

import subprocess_harness as harness  # pylint: disable=g-bad-import-order


@pytest.mark.parametrize("module", [criteo, dataset, demo])
def test_the_shipped_configs_are_complete_and_unchanged(module):
  config = module.get_config()
  config.lock()
  before = config.to_dict()
  assert complete_config(config).to_dict() == before


@pytest.mark.parametrize(
  "field, value, message",
  [
    (
      "num_stepz",
      3,
      "config.num_stepz: the config has no such field; did you mean config.num_steps?",
    ),
    (
      "checkpoint.every_step",
      5,
      "config.checkpoint.every_step: the config has no such field; did you mean"
      " config.checkpoint.every_steps?",
    ),
    (
      "features.category.max_idz",
      2,
      "config.features.category.max_idz: the config has no such field; did you mean"
      " config.features.category.max_ids?",
    ),
    ("learning_rate", 0.1, "config.learning_rate: the config has no such field"),
  ],
)
def test_a_field_the_base_config_lacks_is_named_with_the_closest(field, value, message):
  config = demo.get_config()
  node, _, key = field.rpartition(".")
  (config[node] if node else config)[key] = value
  with pytest.raises(ValueError) as refused:
    complete_config(config)
  assert str(refused.value) == (
    message + " (docs/reference/config.md lists them; a user model's own fields go under"
    " config.model, with config.model.factory)"
  )


def test_a_user_models_fields_are_its_own_and_a_built_in_models_are_checked():
  config = demo.get_config()
  config.model.hidden = 7
  with pytest.raises(ValueError, match=r"^config.model.hidden: the config has no such field"):
    complete_config(config)  # a typo for dlrm's fields was ignored
  assert complete_config(config, overrides_to_come=True).model.hidden == 7  # factory may come
  config.model.factory = "my_model:make"
  assert complete_config(config).model.hidden == 7
  config = demo.get_config()
  config.model.bottom_mlp_sizes = (32, 8)
  with pytest.raises(ValueError) as refused:
    complete_config(config)
  assert str(refused.value).startswith(
    "config.model.bottom_mlp_sizes: the config has no such field; did you mean"
    " config.model.bottom_mlp_dims?"
  )


def test_fields_a_config_leaves_out_take_their_defaults():
  config = demo.get_config()
  config.features.extra = ml_collections.ConfigDict({"vocab_size": 100})
  config.lock()
  extra = complete_config(config).features.extra.to_dict()
  assert extra == dict(vocab_size=100, min_ids=1, max_ids=1, zipf_exponent=1.1, combiner="sum")
  bare = complete_config({"num_steps": 3, "features": {"a": {"vocab_size": 10, "max_ids": 2}}})
  assert isinstance(bare, ml_collections.ConfigDict)
  assert (bare.num_steps, bare.features.a.max_ids, bare.features.a.combiner) == (3, 2, "sum")
  assert bare.checkpoint.to_dict() == demo.base_config([]).checkpoint.to_dict()


@pytest.mark.parametrize(
  "config, message",
  [
    (
      {"features": {"a": {"max_ids": 3}}},
      "config.features.a.vocab_size is required (it has no default)",
    ),
    (
      {"num_steps": 3},
      "config.features names no feature: give each one's vocab_size (config.features.NAME ="
      " sparsepipe.launch.config.base_config.feature(vocab_size)), or take them from a dataset with"
      " features_from_manifest=True (--config=dataset)",
    ),
    (
      [("num_steps", 3)],
      "the config is a list, not an ml_collections.ConfigDict: a config file's get_config()"
      " returns one (start from sparsepipe.launch.config.base_config.base_config)",
    ),
  ],
)
def test_a_config_the_job_cannot_complete_is_named(config, message):
  with pytest.raises(ValueError) as refused:
    complete_config(config)
  assert str(refused.value) == message


def _launch(tmp_path, source, *flags):
  (tmp_path / "my_config.py").write_text(source)
  return harness.run_module(
    "sparsepipe.launch",
    *[f"--config={tmp_path / 'my_config.py'}", f"--workdir={tmp_path / 'job'}", *flags],
  )


def test_the_launcher_names_a_config_files_typo_before_anything_is_made(tmp_path):
  out = _launch(
    tmp_path,
    "from sparsepipe.launch.config.shipped import demo\n\n\ndef get_config():\n"
    "  config = demo.get_config()\n  config.checkpoint.every_step = 5\n  return config\n",
  )
  assert (out.returncode, out.stdout) == (1, "")
  assert out.stderr == (
    f"error: --config={tmp_path / 'my_config.py'}: config.checkpoint.every_step: the config has"
    " no such field; did you mean config.checkpoint.every_steps? (docs/reference/config.md lists"
    " them; a user model's own fields go under config.model, with config.model.factory)\n"
  )
  assert not os.path.exists(tmp_path / "job")
  # A field the file leaves out takes its default, and the command line may set it.
  source = (
    "import ml_collections\n\n\ndef get_config():\n  return ml_collections.ConfigDict("
    "{'num_steps': 2, 'features': {'u': {'vocab_size': 100}}})\n"
  )
  out = _launch(tmp_path, source, "--config.checkpoint.every_steps=1", "--config.seed=3")
  assert out.returncode == 0, out.stderr
  assert sorted(os.listdir(tmp_path / "job" / "checkpoints")) == ["1", "2"]
  out = _launch(tmp_path, "def get_config(:\n")
  assert (out.returncode, out.stderr) == (
    1,
    f"error: --config file '{tmp_path / 'my_config.py'}' line 1: invalid syntax\n",
  )
  out = _launch(tmp_path, "NUM_STEPS = 3\n")
  assert (out.returncode, out.stdout) == (1, "")
  assert out.stderr == (
    f"error: --config file '{tmp_path / 'my_config.py'}' defines no get_config(): a config"
    " file's get_config() returns an ml_collections.ConfigDict (docs/reference/config.md)\n"
  )

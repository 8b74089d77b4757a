"""Jobs saved by 0.3.0 resume: every config key added since is mutable or declared.

A key absent from a saved job's config differs from any value of it
(checkpointing.config_differences), so a new key with neither declaration
would make every job saved before it "another job" at its next start.
tests/golden/config_keys_0.3.0.json lists the keys of 0.3.0's shipped
configs (features left out: they are the data's).
"""

import fnmatch
import importlib.util
import json
import os

import pytest

from sparsepipe.checkpointing.metadata import flatten_config, to_json_value
from sparsepipe.launch import MUTABLE_CONFIG_KEYS
from sparsepipe.launch.config.shipped import config_path
from sparsepipe.launch.job.checkpoints import ADDED_CONFIG_KEYS

from paths import REPO_ROOT


def _keys(name):
  spec = importlib.util.spec_from_file_location(f"{name}_config", config_path(name))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return set(flatten_config(to_json_value(module.get_config().to_dict())))


@pytest.mark.parametrize("name", ["demo", "criteo", "dataset"])
def test_keys_added_since_0_3_0_are_mutable_or_have_their_former_value(name):
  with open(os.path.join(REPO_ROOT, "tests", "golden", "config_keys_0.3.0.json")) as f:
    old = set(json.load(f))
  added = sorted(k for k in _keys(name) - old if k.split(".")[1] != "features")
  undeclared = [
    k
    for k in added
    if k not in ADDED_CONFIG_KEYS
    and not any(fnmatch.fnmatchcase(k, p) for p in MUTABLE_CONFIG_KEYS)
  ]
  assert "config.data.shuffle_window" in added
  assert undeclared == []

"""Packed records by default: synthetic.examples_per_record and data.shuffle_window
default to "as the job was saved", else 128 and 256 (config/packing.py)."""

import json
import os

import jax
import ml_collections
import pytest

from sparsepipe import core
from sparsepipe import data
from sparsepipe.launch import train_and_evaluate
from sparsepipe.launch.config import packing
from sparsepipe.launch.job import training_data

import launch_testing  # pylint: disable=g-bad-import-order


def test_the_defaults_are_a_resumed_jobs_values_else_a_new_jobs():
  assert packing.shuffle_window(-1) == 256
  assert packing.shuffle_window(-1, 0) == 0
  assert packing.shuffle_window(64, 0) == 64
  assert packing.shuffle_window(0) == 0
  assert packing.examples_per_record(0) == 128
  assert packing.examples_per_record(0, 1) == 1
  assert packing.examples_per_record(8, 1) == 8
  with pytest.raises(ValueError) as e:
    packing.shuffle_window(-2)
  assert str(e.value) == (
    "config.data.shuffle_window=-2: -1 (the default: a resumed job's window, else 256),"
    " 0 (whole records) or a window of records"
  )
  with pytest.raises(ValueError) as e:
    packing.examples_per_record(-1)
  assert str(e.value) == (
    "config.synthetic.examples_per_record=-1: 0 (the default: a resumed job's packing,"
    " else 128) or the examples per record"
  )


def test_a_job_saved_before_the_window_resumes_without_one():
  """A config saved by 0.3.0 has no data.shuffle_window: its records stayed whole."""
  saved = ml_collections.ConfigDict({"data": {"shuffle": True}, "synthetic": {}})
  saved.synthetic.examples_per_record = 1
  config = launch_testing.tiny_config()
  assert (config.data.shuffle_window, config.synthetic.examples_per_record) == (-1, 0)
  packing.resolve_saved_packing(config, saved)
  assert (config.data.shuffle_window, config.synthetic.examples_per_record) == (0, 1)
  fresh = launch_testing.tiny_config()
  packing.resolve_saved_packing(fresh, None)  # a new job: its packing comes with its data
  assert (fresh.data.shuffle_window, fresh.synthetic.examples_per_record) == (256, 0)


def test_generated_data_is_packed_unless_the_workdir_has_data_of_another_packing(tmp_path):
  config = launch_testing.tiny_config()
  directory = training_data.ensure_dataset(config, str(tmp_path / "new"), show_progress=False)
  assert data.read_manifest(directory).examples_per_record == 128
  assert config.synthetic.examples_per_record == 128
  # Data generated with records of one example (as before this default) is kept.
  older = str(tmp_path / "older")
  training_data.ensure_dataset(
    launch_testing.tiny_config(synthetic__examples_per_record=1), older, show_progress=False
  )
  config = launch_testing.tiny_config()
  directory = training_data.ensure_dataset(config, older, show_progress=False)
  assert data.read_manifest(directory).examples_per_record == 1
  assert config.synthetic.examples_per_record == 1


def _saved_values(workdir: str, step: int) -> tuple[int, int]:
  path = os.path.join(workdir, "checkpoints", str(step), "metadata", "metadata.json")
  with open(path) as f:
    config = json.load(f)["config"]
  return config["data"]["shuffle_window"], config["synthetic"]["examples_per_record"]


def test_a_job_saved_with_whole_records_resumes_with_them_by_default(tmp_path, monkeypatch):
  """Trained to 4 with records of one example and no window, then resumed to 8 with
  the defaults: the same batches as the job run to 8 with those values throughout;
  a new job with the defaults saves its window and packing, and other batches."""
  one_device = core.make_mesh
  monkeypatch.setattr(core, "make_mesh", lambda: one_device(jax.devices()[:1]))
  old = {"data__shuffle_window": 0, "synthetic__examples_per_record": 1, "pipelining": False}
  uninterrupted = str(tmp_path / "uninterrupted")
  train_and_evaluate(launch_testing.tiny_config(**old), uninterrupted)
  resumed = str(tmp_path / "resumed")
  train_and_evaluate(launch_testing.tiny_config(**old, num_steps=4), resumed)
  train_and_evaluate(launch_testing.tiny_config(pipelining=False), resumed)
  assert _saved_values(resumed, 8) == (0, 1)
  assert launch_testing.batch_losses(resumed) == launch_testing.batch_losses(uninterrupted)
  new = str(tmp_path / "new")
  train_and_evaluate(launch_testing.tiny_config(pipelining=False, num_steps=4), new)
  assert _saved_values(new, 4) == (256, 128)
  new_losses = launch_testing.batch_losses(new)
  assert new_losses != {b: launch_testing.batch_losses(resumed)[b] for b in new_losses}

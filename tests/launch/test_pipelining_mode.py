"""config.pipelining: true, false or "auto" (the default), and what a job records.

"auto" is sequential on CPU and on one device, pipelined on more than one
GPU or TPU device, and a resumed job keeps the mode it was saved with.
"""

import pytest

from sparsepipe import checkpointing
from sparsepipe import pipeline
from sparsepipe.launch import train_and_evaluate
from sparsepipe.launch.config.base_config import base_config
from sparsepipe.launch.config.pipelining import resolve_pipelining
from sparsepipe.launch.job.checkpoints import saved_job
from sparsepipe.launch.job.training_data import ensure_dataset

import launch_testing  # pylint: disable=g-bad-import-order


@pytest.mark.parametrize(
  "platform, devices, expected",
  [
    ("cpu", 1, False),
    ("cpu", 8, False),
    ("gpu", 1, False),
    ("gpu", 2, True),
    ("tpu", 1, False),
    ("tpu", 4, True),
  ],
)
def test_the_rule_pipelines_only_on_several_gpu_or_tpu_devices(platform, devices, expected):
  assert pipeline.pipelining_pays_off(platform, devices) is expected
  assert resolve_pipelining("auto", platform, devices) is expected


@pytest.mark.parametrize("value, expected", [(True, True), ("true", True), ("False", False)])
def test_an_explicit_mode_wins_over_the_rule_and_the_saved_mode(value, expected):
  for platform, devices in (("cpu", 1), ("gpu", 8)):
    for saved in (None, not expected):
      assert resolve_pipelining(value, platform, devices, saved) is expected


def test_auto_keeps_the_saved_mode():
  assert resolve_pipelining("auto", "cpu", 1, saved=True) is True
  assert resolve_pipelining("AUTO", "gpu", 8, saved=False) is False


def test_auto_is_the_default_and_a_bad_value_is_named():
  assert base_config(()).pipelining == "auto"
  with pytest.raises(ValueError) as e:
    resolve_pipelining("yes", "cpu", 1)
  assert str(e.value) == "config.pipelining='yes': expected true, false or auto"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("pipelining_mode")
  return ensure_dataset(launch_testing.tiny_config(), str(root), show_progress=False)


def _config(data_dir, num_steps, pipelining):
  return launch_testing.tiny_config(data__dir=data_dir, num_steps=num_steps, pipelining=pipelining)


def _saved_mode(workdir):
  return saved_job(workdir, None).config.pipelining


def test_auto_on_cpu_trains_and_records_the_sequential_step(data_dir, tmp_path):
  auto, sequential = str(tmp_path / "auto"), str(tmp_path / "sequential")
  train_and_evaluate(_config(data_dir, 5, "auto"), auto)
  train_and_evaluate(_config(data_dir, 5, False), sequential)
  assert _saved_mode(auto) is False
  losses = launch_testing.batch_losses(auto)
  assert sorted(losses) == [1, 2, 3, 4, 5]
  assert losses == launch_testing.batch_losses(sequential)


def test_a_pipelined_job_resumed_under_auto_stays_pipelined(data_dir, tmp_path):
  """Saved pipelined, resumed with the default: the saved mode, not the CPU's rule.

  Exactly as a pipelined job raised from 4 to 8 batches: batches 1-4 equal
  the uninterrupted job's; after the drain at batch 4 the later lookups see
  batch 4's update one batch earlier (float rounding apart).
  """
  uninterrupted, resumed = str(tmp_path / "uninterrupted"), str(tmp_path / "resumed")
  train_and_evaluate(_config(data_dir, 8, True), uninterrupted)
  train_and_evaluate(_config(data_dir, 4, True), resumed)
  train_and_evaluate(_config(data_dir, 8, "auto"), resumed)
  assert _saved_mode(resumed) is True
  ours, theirs = launch_testing.batch_losses(resumed), launch_testing.batch_losses(uninterrupted)
  assert sorted(ours) == list(range(1, 9))
  assert [ours[b] for b in range(1, 5)] == [theirs[b] for b in range(1, 5)]
  assert [ours[b] for b in range(5, 9)] == pytest.approx([theirs[b] for b in range(5, 9)], rel=1e-3)


def test_an_explicit_mode_other_than_the_saved_one_is_refused(data_dir, tmp_path):
  """A changed config.pipelining is a changed config (the checkpoint layout differs)."""
  workdir = str(tmp_path / "job")
  train_and_evaluate(_config(data_dir, 2, True), workdir)
  with pytest.raises(checkpointing.IncompatibleCheckpointError) as e:
    train_and_evaluate(_config(data_dir, 3, False), workdir)
  assert "config.pipelining" in str(e.value)
  assert _saved_mode(workdir) is True

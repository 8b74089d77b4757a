"""A config value the job cannot use is one line naming the field, before any data is
made. NaN learning rates once trained to a NaN loss, negative ones and negative epoch
counts trained, and an unknown optimizer or a table dim of 0 failed only after the
data was generated in the workdir."""

import os
import sys

import jax
import pytest

from sparsepipe import data
from sparsepipe.launch.config.checks import check_config

import datasets  # pylint: disable=g-bad-import-order
import launch_testing  # pylint: disable=g-bad-import-order
import subprocess_harness as harness  # pylint: disable=g-bad-import-order


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("embedding_optimizer.learning_rate", float("nan"), "=nan must be a finite number"),
    ("dense_optimizer.learning_rate", float("inf"), "=inf must be a finite number"),
    ("embedding_optimizer.learning_rate", -1.0, "=-1 must be >= 0"),
    ("num_epochs", -1.0, "=-1 must be >= 0"),
    ("global_batch_size", -64, "=-64 must be >= 0 (0: set per_host_batch_size)"),
    ("model.embedding_dim", 0, "=0 must be >= 1"),
    ("data.num_workers", -1, "=-1 must be >= 0"),
    ("checkpoint.every_steps", 0, "=0 must be >= 1 (batches)"),
    ("checkpoint.keep", 0, "=0 must be >= 1 (checkpoints kept)"),
    ("fdo.headroom", 0.5, "=0.5 must be >= 1"),
  ],
)
def test_a_value_out_of_range_names_the_field(field, value, message):
  config = launch_testing.tiny_config(**{field.replace(".", "__"): value})
  with pytest.raises(ValueError) as refused:
    check_config(config, jax.make_mesh((1,), ("data",)))
  assert str(refused.value) == f"config.{field}{message}"


def test_names_that_are_not_known_are_refused():
  mesh = jax.make_mesh((1,), ("data",))
  config = launch_testing.tiny_config(embedding_optimizer__name="adamw")
  with pytest.raises(ValueError, match=r"^embedding_optimizer.name='adamw' is not one of \["):
    check_config(config, mesh)
  config = launch_testing.tiny_config(stacking="foo")
  with pytest.raises(ValueError, match=r"^config.stacking='foo' is not 'auto' or 'none'$"):
    check_config(config, mesh)
  check_config(launch_testing.tiny_config(), mesh)  # the shipped values pass


def test_a_launch_refused_for_its_config_leaves_no_workdir(tmp_path):
  workdir = tmp_path / "job"
  command = [sys.executable, "-m", "sparsepipe.launch", f"--workdir={workdir}"]
  command += ["--config.dense_optimizer.name=lamb"]
  out = harness.run(command, env=harness.cpu_env(1), timeout_s=300)
  assert out.returncode == 1, out.describe()
  assert out.stderr.splitlines()[-1].startswith(
    "error: dense_optimizer.name='lamb' is not one of ["
  )
  assert not os.path.exists(workdir)


def test_a_launch_that_fails_after_generating_its_data_leaves_no_workdir(tmp_path):
  """Eval data of other features is found only once the train data exists: the launch
  used to leave the workdir it made, with data/ and data_eval/ in it."""
  other = tmp_path / "other"
  datasets.write_numbered(str(other), [data.SyntheticFeature("x", 10)], 8, 1, 8)
  missing = tmp_path / "missing"
  for given, last_line in (
    (missing, f"config.eval.data_dir='{missing}': no manifest.json in '{missing}' (not a"),
    (other, "train data '"),
  ):
    workdir = tmp_path / "job"
    command = [sys.executable, "-m", "sparsepipe.launch", f"--workdir={workdir}"]
    command += [f"--config.eval.data_dir={given}", "--config.synthetic.num_examples=512"]
    out = harness.run(command, env=harness.cpu_env(1), timeout_s=300)
    assert out.returncode == 1, out.describe()
    assert out.stderr.splitlines()[-1].startswith(f"error: {last_line}"), out.describe()
    assert not os.path.exists(workdir)
  made_before = tmp_path / "mine"  # a workdir that exists keeps only what it had
  made_before.mkdir()
  (made_before / "notes.txt").write_text("mine")
  command = [sys.executable, "-m", "sparsepipe.launch", f"--workdir={made_before}"]
  command += [f"--config.eval.data_dir={other}", "--config.synthetic.num_examples=512"]
  out = harness.run(command, env=harness.cpu_env(1), timeout_s=300)
  assert out.returncode == 1, out.describe()
  assert os.listdir(made_before) == ["notes.txt"]

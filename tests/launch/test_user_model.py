"""A model of the user's own, named by config.model.factory: the launcher trains it as any.

The model file is written by the test (nothing in sparsepipe knows it): a
two-layer MLP over the concatenated dense and embedding vectors, with a
field of its own in the config file. It trains with FDO retunes, evaluates,
is preempted and resumes exactly, and launch.evaluate scores its checkpoint.
"""

import os
import signal
import sys
import textwrap

import pytest

from sparsepipe.launch.job.training_data import ensure_dataset

import launch_testing  # pylint: disable=g-bad-import-order
import subprocess_harness as harness  # pylint: disable=g-bad-import-order

MODEL = textwrap.dedent(
  """
  import jax
  import jax.numpy as jnp


  class TwoLayer:
    def __init__(self, hidden):
      self.hidden = hidden

    def init(self, rng, dense_dim, feature_dims):
      width = dense_dim + sum(feature_dims.values())
      k1, k2 = jax.random.split(rng)
      return {
        "w1": jax.random.normal(k1, (width, self.hidden)) / jnp.sqrt(width),
        "w2": jax.random.normal(k2, (self.hidden,)) / jnp.sqrt(self.hidden),
      }

    def apply(self, params, dense, embeddings):
      x = jnp.concatenate([dense] + [embeddings[f] for f in sorted(embeddings)], axis=1)
      return jax.nn.relu(x @ params["w1"]) @ params["w2"]


  def make(model_config):
    return TwoLayer(int(model_config.hidden))
  """
)

CONFIG = textwrap.dedent(
  """
  from sparsepipe.launch.config.shipped import demo


  def get_config():
    config = demo.get_config()
    config.model.factory = "my_model:make"
    config.model.hidden = 12
    return config
  """
)


@pytest.mark.slow
def test_a_user_model_trains_evaluates_resumes_and_retunes_fdo(tmp_path):
  (tmp_path / "my_model.py").write_text(MODEL)
  (tmp_path / "my_config.py").write_text(CONFIG)
  data_dir = ensure_dataset(launch_testing.tiny_config(), str(tmp_path), show_progress=False)
  env = harness.cpu_env(8, compilation_cache_dir=harness.SESSION_JAX_CACHE)
  env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])

  def command(workdir):
    overrides = launch_testing.flag_overrides(
      data__dir=data_dir, eval__data_dir=data_dir, eval__every_steps=4
    )
    return [
      sys.executable,
      "-m",
      "sparsepipe.launch",
      f"--config={tmp_path / 'my_config.py'}",
      *[o for o in overrides if not o.startswith("--config.model.")],
      f"--workdir={workdir}",
    ]

  reference = str(tmp_path / "reference")
  result = harness.run(command(reference), env=env, timeout_s=300)
  assert result.returncode == 0, result.describe()
  assert [e["batch"] for e in launch_testing.events(reference, "fdo")] == [4]
  assert [e["batch"] for e in launch_testing.events(reference, "eval")] == [4, 8]
  workdir = str(tmp_path / "stopped")
  runs = harness.run_interrupted(
    command(workdir),
    [harness.Interruption(signal.SIGTERM, r"batch 2/8 .*")],
    env=env,
    timeout_s=300,
  )
  assert runs[0][0].returncode == 42
  assert launch_testing.batch_losses(workdir) == launch_testing.batch_losses(reference)
  out = harness.run(
    [sys.executable, "-m", "sparsepipe.launch.evaluate", f"--workdir={workdir}"],
    env=env,
    timeout_s=300,
  )
  assert out.returncode == 0, out.describe()
  (final_eval,) = launch_testing.events(reference, "eval")[-1:]
  assert out.lines[-1].startswith(f"checkpoint 8 (after batch 8): AUC {final_eval['auc']:.4f}")

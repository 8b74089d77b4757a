"""fdo.steps_per_doubling: a retune whose statistics grew a little keeps the limits, and
so the compiled step (no compilation, no stall), where exact limits would change."""

import os

import jax
import numpy as np

from sparsepipe import core
from sparsepipe import transforms
from sparsepipe.launch import train_and_evaluate
from sparsepipe.launch.job import fdo
from sparsepipe.launch.job.model import JobModel

import launch_testing  # pylint: disable=g-bad-import-order


def _exact_max_ids(workdir: str, batch: int) -> np.ndarray:
  """The max_ids limits that the retune after `batch` gives with exact limits (0 steps)."""
  stats = transforms.NPZFileFDOClient(
    os.path.join(workdir, "fdo", f"after_batch_{batch:09d}")
  ).load()
  (limits,) = fdo.scale_stats(stats, 1.5, 0).max_ids_per_partition.values()
  return limits


def test_a_retune_whose_statistics_grew_a_little_keeps_the_limits_and_the_step(
  tmp_path, monkeypatch
):
  """1 device, batches of 128, retunes after batches 2 and 4 of 8: the statistics after batch 4 give
  other exact limits than after batch 2 (a new step), but the same of 8 steps per doubling,
  the default: one step for the worst case, one for the retune after batch 2, none after."""
  one_device = core.make_mesh
  monkeypatch.setattr(core, "make_mesh", lambda: one_device(jax.devices()[:1]))
  made = []
  make_trainer = JobModel.make_trainer
  monkeypatch.setattr(
    JobModel, "make_trainer", lambda model, specs: made.append(specs) or make_trainer(model, specs)
  )
  workdir = str(tmp_path / "job")
  config = launch_testing.tiny_config(
    per_host_batch_size=128,
    fdo__first_after=2,
    fdo__compile_ahead=0.0,
    data__num_workers=0,
    pipelining=False,
    # The data whose statistics give the limits below: records of one example.
    synthetic__examples_per_record=1,
    data__shuffle_window=0,
  )
  assert config.fdo.steps_per_doubling == 8
  train_and_evaluate(config, workdir)
  retunes = launch_testing.events(workdir, "fdo")
  assert [e["batch"] for e in retunes] == [2, 4]
  assert retunes[0]["limits"] == retunes[1]["limits"]
  (limits,) = retunes[0]["limits"].values()
  assert limits["max_ids_per_partition"] == 480  # ..., 448, 480, 512, 576, ...
  early, later = _exact_max_ids(workdir, 2), _exact_max_ids(workdir, 4)
  assert early.max() < later.max() <= 480
  assert len(made) == 2

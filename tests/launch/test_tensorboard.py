"""TensorBoardWriter writes event files that parse back to the same scalars."""

import math
import os
import time

import pytest

from sparsepipe.launch.job.output import JobOutput
from sparsepipe.launch.job.tensorboard import TensorBoardWriter

import launch_testing  # pylint: disable=g-bad-import-order


def read_scalars(logdir):
  """(step, tag, value) of every scalar in the event files."""
  return [
    (event.step, value.tag, value.simple_value)
    for event in launch_testing.read_events(logdir)
    for value in event.summary.value
  ]


def test_scalars_round_trip(tmp_path):
  with TensorBoardWriter(str(tmp_path), enabled=True) as writer:
    writer.scalars(10, {"eval/auc": 0.75, "eval/examples": 1000})
    writer.scalars(20, {"eval/auc": float("nan")})
    writer.flush()
  scalars = read_scalars(str(tmp_path / "tensorboard"))
  assert scalars[:2] == [(10, "eval/auc", 0.75), (10, "eval/examples", 1000.0)]
  assert scalars[2][:2] == (20, "eval/auc") and math.isnan(scalars[2][2])
  assert len(scalars) == 3


def test_disabled_writer_writes_nothing(tmp_path):
  writer = TensorBoardWriter(str(tmp_path), enabled=False)
  writer.scalars(1, {"eval/auc": 0.5})
  writer.close()
  assert not os.path.exists(tmp_path / "tensorboard")


def test_process_zero_writes_by_default(tmp_path):
  writer = TensorBoardWriter(str(tmp_path))
  assert writer.enabled
  writer.close()


def _run(workdir, resume_after, losses, evals):
  output = JobOutput(str(workdir), total_batches=8, enabled=True)
  output.resume_after(resume_after)
  for batch in range(resume_after + 1, resume_after + 1 + len(losses)):
    output.loss(batch, losses[batch - resume_after - 1])
    if batch in evals:
      output.record({"event": "eval", "batch": batch, "auc": evals[batch]})
  output.close()
  time.sleep(1.05)  # tensorboardX names event files by the second


def test_a_resumed_job_shows_each_point_once_with_its_latest_value(tmp_path):
  # Killed after batch 6 (checkpoint at 4), resumed at 4 to the end, rerun when done.
  _run(tmp_path, 0, [0.9, 0.8, 0.7, 0.6, 0.5, 0.4], {4: 0.6})
  _run(tmp_path, 4, [0.45, 0.35, 0.3, 0.2], {8: 0.7})
  _run(tmp_path, 8, [], {})
  assert launch_testing.tensorboard_view(str(tmp_path / "tensorboard")) == pytest.approx(
    {
      **{(b, "train/loss"): v for b, v in zip(range(1, 5), [0.9, 0.8, 0.7, 0.6])},
      **{(b, "train/loss"): v for b, v in zip(range(5, 9), [0.45, 0.35, 0.3, 0.2])},
      (4, "eval/auc"): 0.6,
      (8, "eval/auc"): 0.7,
    }
  )

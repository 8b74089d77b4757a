"""TensorBoardWriter writes event files that parse back to the same scalars."""

import os
import time

import pytest

from sparsepipe.launch.job.job_output import JobOutput
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
    writer.scalars(20, {"eval/auc": 0.5})
    writer.flush()
  scalars = read_scalars(str(tmp_path / "tensorboard"))
  assert scalars == [(10, "eval/auc", 0.75), (10, "eval/examples", 1000.0), (20, "eval/auc", 0.5)]


def test_non_finite_scalars_are_no_points(tmp_path, capfd):
  """A degenerate eval (one example) has NaN metrics: TensorBoard gets no point for
  them (tensorboardX warned "NaN or Inf found in input tensor" and kept them), also
  when a resume replays them from metrics.jsonl, where they are null."""
  nan = float("nan")
  output = JobOutput(str(tmp_path), total_batches=4, enabled=True)
  output.resume_after(0)
  output.loss(1, 0.5)
  output.loss(2, float("inf"))
  output.event("eval", 2, auc=nan, logloss=0.25, ne=nan, calibration=float("-inf"), examples=1)
  output.close()
  with open(tmp_path / "metrics.jsonl") as f:
    assert f.read().splitlines()[-1] == (
      '{"event": "eval", "batch": 2, "auc": null, "logloss": 0.25, "ne": null,'
      ' "calibration": null, "examples": 1}'
    )
  time.sleep(1.05)  # tensorboardX names event files by the second
  output = JobOutput(str(tmp_path), total_batches=4, enabled=True)
  output.resume_after(2)  # replays batch 2's records: the eval's nulls
  output.close()
  assert launch_testing.tensorboard_view(str(tmp_path / "tensorboard")) == {
    (1, "train/loss"): 0.5,
    (2, "eval/logloss"): 0.25,
  }
  assert "NaN or Inf" not in capfd.readouterr().err


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

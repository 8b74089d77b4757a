"""TensorBoardWriter writes event files that parse back to the same scalars."""

import glob
import math
import os
import struct
import time

import pytest

from tensorboardX.proto import event_pb2

from sparsepipe.launch.job.output import JobOutput
from sparsepipe.launch.job.tensorboard import TensorBoardWriter


def read_events(logdir):
  """Every Event of the event files, files in name order (TFRecord framing)."""
  for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
    with open(path, "rb") as f:
      data = f.read()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack("<Q", data[pos : pos + 8])
      yield event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length])
      pos += 12 + length + 4


def read_scalars(logdir):
  """(step, tag, value) of every scalar in the event files."""
  return [
    (event.step, value.tag, value.simple_value)
    for event in read_events(logdir)
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


def tensorboard_view(logdir):
  """{(step, tag): value} as TensorBoard shows the event files: a SessionLog START at
  step s (a writer's purge_step) drops the points of step >= s read before it."""
  points = {}
  for event in read_events(logdir):
    if event.HasField("session_log") and event.session_log.status == 1:  # START
      points = {k: v for k, v in points.items() if k[0] < event.step}
    for value in event.summary.value:
      key = (event.step, value.tag)
      assert key not in points, f"{key} shown twice"
      points[key] = value.simple_value
  return points


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
  assert tensorboard_view(str(tmp_path / "tensorboard")) == pytest.approx(
    {
      **{(b, "train/loss"): v for b, v in zip(range(1, 5), [0.9, 0.8, 0.7, 0.6])},
      **{(b, "train/loss"): v for b, v in zip(range(5, 9), [0.45, 0.35, 0.3, 0.2])},
      (4, "eval/auc"): 0.6,
      (8, "eval/auc"): 0.7,
    }
  )

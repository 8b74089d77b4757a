"""TensorBoardWriter writes event files that parse back to the same scalars."""

import glob
import math
import os
import struct

from tensorboardX.proto import event_pb2

from sparsepipe.launch.job.tensorboard import TensorBoardWriter


def read_scalars(logdir):
  """(step, tag, value) of every scalar in the event files (TFRecord framing)."""
  out = []
  for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
    with open(path, "rb") as f:
      data = f.read()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack("<Q", data[pos : pos + 8])
      event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length])
      pos += 12 + length + 4
      for value in event.summary.value:
        out.append((event.step, value.tag, value.simple_value))
  return out


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

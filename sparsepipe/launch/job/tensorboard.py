"""Scalars for TensorBoard: event files under <workdir>/tensorboard.

A thin tensorboardX event-file writer: `scalars(step, {"eval/auc": 0.79,
...})` writes one scalar per name at `step`. The events are written as they
come, into the file's buffer, and `flush()` puts every one so far into the
file: tensorboardX's `SummaryWriter` hands them to a thread through a queue,
and its `flush()` left the queued ones out (a kill then lost them for good;
job_output.py). Only process 0 writes (every process computes the same merged
eval metrics); elsewhere the writer does nothing, so the job can call it
unconditionally. Point TensorBoard at `<workdir>/tensorboard`.
"""

from __future__ import annotations

import math
import os
import time
from typing import Mapping

import jax

TENSORBOARD_DIR = "tensorboard"


class TensorBoardWriter:
  """Writes scalars to event files under `<workdir>/tensorboard` (process 0 only).

  Args:
    workdir: the job's workdir.
    enabled: write at all; default: this is JAX process 0.
    purge_step: a resumed job's first step: TensorBoard drops the points
      saved at this step and later (a SessionLog START there, as tensorboardX's
      SummaryWriter(purge_step=) writes), so every
      point appears once however often the job was restarted.
  """

  def __init__(self, workdir: str, *, enabled: bool | None = None, purge_step: int | None = None):
    self.logdir = os.path.join(workdir, TENSORBOARD_DIR)
    self.enabled = jax.process_index() == 0 if enabled is None else bool(enabled)
    self._writer = None
    if self.enabled:
      # pylint: disable=g-import-not-at-top
      from tensorboardX.event_file_writer import EventsWriter
      from tensorboardX.proto import event_pb2
      from tensorboardX.proto import summary_pb2

      self._event_pb2, self._summary_pb2 = event_pb2, summary_pb2
      os.makedirs(self.logdir, exist_ok=True)
      self._writer = EventsWriter(os.path.join(self.logdir, "events"))  # writes file_version
      if purge_step is not None:  # as SummaryWriter(purge_step=) marks it
        start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
        self._write(event_pb2.Event(step=int(purge_step), session_log=start))

  def _write(self, event) -> None:
    event.wall_time = time.time()
    self._writer.write_event(event)

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    """One scalar per name at `step`; a non-finite or None value (a degenerate AUC,
    null in metrics.jsonl) is no point: a missing point is the honest record."""
    if self._writer is None:
      return
    for name, value in values.items():
      if value is None or not math.isfinite(float(value)):
        continue
      summary = self._summary_pb2.Summary(
        value=[self._summary_pb2.Summary.Value(tag=name, simple_value=float(value))]
      )
      self._write(self._event_pb2.Event(step=int(step), summary=summary))

  def flush(self) -> None:
    """Every scalar written so far reaches the event file."""
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._writer = None

  def __enter__(self) -> TensorBoardWriter:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

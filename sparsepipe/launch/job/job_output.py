"""The one writer of a job's outputs: metrics.jsonl, the progress line, TensorBoard.

Every hook reports through it, with the batch number the record belongs to
(batch n: the n-th batch trained, schedule.py), so the three outputs agree:
a loss is a metrics.jsonl line and a `train/loss` point at step n; an eval
is a line, `eval/*` points at step n and a line on the console; a start's
record (startup.py) is `startup/*` points, a named phase a `time/<name>_s`
point; an event
(checkpoint, FDO, preemption, ...) is a line and a console message.

A job resumed after batch n first calls `resume_after(n)`: metrics.jsonl
loses the records of later batches, TensorBoard drops its points from step n
on (purge_step) and gets the step-n points back from the kept lines, so
each point, evals included, appears once however often the job restarted.
Only process 0 writes; the others call the same methods, which do nothing,
and `recorded` answers them with process 0's records.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils

from sparsepipe.launch.job.metrics_log import MetricsLog
from sparsepipe.launch.job.metrics_log import ProgressLine
from sparsepipe.launch.job.tensorboard import TensorBoardWriter

METRICS_FILENAME = "metrics.jsonl"


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _process_0s(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """Process 0's `records` on every process (only process 0 reads metrics.jsonl).

  They decide work all processes do together: process 1 once ran the eval
  of a resume's batch that process 0 skipped as done, and both waited forever.
  """
  if jax.process_count() == 1:
    return records
  data = np.frombuffer(json.dumps(records).encode(), np.uint8)
  size = int(multihost_utils.broadcast_one_to_all(np.int64(data.size)))
  buffer = np.zeros(size, np.uint8)
  if jax.process_index() == 0:
    buffer[:] = data
  return json.loads(np.asarray(multihost_utils.broadcast_one_to_all(buffer), np.uint8).tobytes())


class JobOutput:
  """metrics.jsonl, the progress line and TensorBoard of one job (process 0 writes)."""

  def __init__(self, workdir: str, *, total_batches: int, enabled: bool | None = None):
    self.workdir = workdir
    self.enabled = jax.process_index() == 0 if enabled is None else bool(enabled)
    self.metrics = MetricsLog(os.path.join(workdir, METRICS_FILENAME), enabled=self.enabled)
    self.line = ProgressLine(total_batches, enabled=self.enabled)
    self._tensorboard: TensorBoardWriter | None = None
    self._kept: list[dict[str, Any]] = []

  @property
  def metrics_path(self) -> str:
    return self.metrics.path

  def resume_after(self, batch: int) -> None:
    """Starts the outputs after batch `batch` (0: a fresh job): later records go."""
    kept = self.metrics.truncate_after(batch)
    self._kept = _process_0s([r for r in kept if "event" in r])
    self._tensorboard = TensorBoardWriter(self.workdir, enabled=self.enabled, purge_step=batch)
    for record in kept:
      if record.get("batch") == batch:
        self._scalars(record)

  def recorded(self, event: str, batch: int) -> dict[str, Any] | None:
    """The `event` line of `batch` in metrics.jsonl kept at the resume (e.g. an eval
    finished before a kill), or None. The same on every process: what it says
    decides work they do together (an eval)."""
    found = [r for r in self._kept if r.get("event") == event and r.get("batch") == batch]
    return found[-1] if found else None

  def _scalars(self, record: Mapping[str, Any]) -> None:
    if self._tensorboard is None:
      return
    batch = int(record["batch"])
    if "loss" in record and "event" not in record:
      self._tensorboard.scalars(batch, {"train/loss": record["loss"]})
    elif record.get("event") == "eval":
      values = {k: v for k, v in record.items() if k not in ("event", "batch", "examples")}
      self._tensorboard.scalars(batch, {f"eval/{k}": v for k, v in values.items()})
      self._tensorboard.flush()
    elif record.get("event") == "startup":
      values = {k: v for k, v in record.items() if k != "batch" and _is_number(v)}
      self._tensorboard.scalars(batch, {f"startup/{k}": v for k, v in values.items()})
    elif record.get("event") == "phase":
      self._tensorboard.scalars(batch, {f"time/{record['phase']}_s": record["seconds"]})

  def record(self, record: dict[str, Any]) -> None:
    """One metrics.jsonl line (with its TensorBoard points, for losses and evals)."""
    self.metrics.write(record)
    self._scalars(record)

  def loss(self, batch: int, loss: float) -> None:
    self.record({"batch": batch, "loss": loss})

  def event(self, kind: str, batch: int, message: str | None = None, **fields: Any) -> None:
    """An event line, and `message` (if any) as a line of its own on the console."""
    self.record({"event": kind, "batch": batch, **fields})
    if message:
      self.line.message(message)

  def message(self, text: str) -> None:
    """A line of its own on the console (not in metrics.jsonl)."""
    self.line.message(text)

  def mark(self, text: str) -> None:
    """The latest event on the progress line (e.g. 'ckpt @20')."""
    self.line.event(text)

  def progress(
    self, batch: int, rate: float | None, loss: float | None, wait: float | None, epoch: float
  ) -> None:
    self.line.update(batch, rate, loss, wait, epoch)

  def flush(self) -> None:
    """What was recorded reaches the files (before a checkpoint: a resume from it
    replays only its own step's points into TensorBoard, so earlier ones still
    in the writer's buffer would be lost by a kill). metrics.jsonl is flushed
    per line."""
    if self._tensorboard is not None:
      self._tensorboard.flush()

  def close(self) -> None:
    self.metrics.close()
    if self._tensorboard is not None:
      self._tensorboard.close()

"""The job's per-step work, as hooks of the training loop.

`LossLog` turns each trained batch's loss into a metrics.jsonl record and
the progress line, and stops the job on a non-finite loss or update before
anything is saved. `CheckpointHook` saves when Orbax's interval says so or
a preemption was noticed (then it stops the loop at that boundary).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import numpy as np

from sparsepipe import checkpointing
from sparsepipe import pipeline
from sparsepipe.launch.job.metrics import IntervalMeter
from sparsepipe.launch.job.metrics import MetricsLog
from sparsepipe.launch.job.metrics import ProgressLine
from sparsepipe.launch.job.schedule import Position
from sparsepipe.launch.job.schedule import SegmentSchedule


class NonFiniteLossError(FloatingPointError):
  """Training produced a non-finite loss or update: the job stops unsaved."""


class LossLog:
  """Per-batch losses -> metrics.jsonl and the progress line (flushed every `log_every`)."""

  def __init__(
    self,
    metrics: MetricsLog,
    progress: ProgressLine,
    *,
    global_batch: int,
    log_every: int,
    tensorboard: Any = None,
  ):
    self.metrics = metrics
    self.progress = progress
    self.tensorboard = tensorboard
    self.global_batch = global_batch
    self.log_every = max(int(log_every), 1)
    self.meter = IntervalMeter()
    self.pending: list[tuple[int, Any]] = []
    self.last_loss: float | None = None
    self.trained = 0

  def add(self, batch: int, output: Any, data_wait_seconds: float) -> None:
    """Records the TC output of global batch `batch` (device arrays)."""
    self.pending.append((batch, output))
    self.meter.add(self.global_batch, data_wait_seconds)
    self.trained += 1
    if (batch + 1) % self.log_every == 0:
      self.flush()
      rate, wait = self.meter.read()
      self.progress.update(batch + 1, rate, self.last_loss, wait)
      self.meter.reset()

  def flush(self) -> None:
    """Writes the pending losses; raises NonFiniteLossError on the first bad one."""
    if not self.pending:
      return
    outputs = jax.device_get([output for _, output in self.pending])
    batches = [batch for batch, _ in self.pending]
    self.pending.clear()
    for batch, output in zip(batches, outputs):
      loss = float(pipeline.loss_of(output))
      if not math.isfinite(loss) or not bool(np.all(output.get("finite", True))):
        raise NonFiniteLossError(
          f"batch {batch}: the loss is {loss} or an update is not finite; training"
          " stopped before saving it (the newest checkpoint predates this batch)."
          " Check the data (labels, dense values) and the learning rates"
        )
      self.last_loss = loss
      self.metrics.write({"batch": batch, "loss": loss})
      if self.tensorboard is not None:
        self.tensorboard.scalars(batch + 1, {"train/loss": loss})


class CheckpointHook:
  """Saves at Orbax's interval or on preemption; stops the loop on preemption."""

  def __init__(
    self,
    save: Callable[[Position, bool], bool],
    mngr: checkpointing.TrainingCheckpointManager,
    watcher: checkpointing.PreemptionWatcher,
    losses: LossLog,
    schedule: SegmentSchedule,
  ):
    self._save = save
    self._mngr = mngr
    self._watcher = watcher
    self._losses = losses
    self._schedule = schedule
    self.last_saved: int | None = None
    self.preempted = False

  def save(self, position: Position, *, force: bool) -> None:
    """Flushes the losses (so metrics.jsonl covers the checkpoint) and saves."""
    self._losses.flush()
    step = self._schedule.checkpoint_step(position)
    if self._save(position, force):
      self.last_saved = step
      trained = self._schedule.batches_with_output(position)
      self._losses.metrics.write({"event": "checkpoint", "step": step, "batches_trained": trained})
      self._losses.progress.message(f"checkpoint step {step} saving ({trained} batches trained)")
      self._losses.progress.event(f"ckpt @{trained}")

  def __call__(self, position: Position) -> bool:
    """After a pipeline step: save if due; True (stop) when preempted."""
    step = self._schedule.checkpoint_step(position)
    self.preempted = self._watcher.should_stop(step)
    if self.preempted or self._mngr.should_save(step):
      self.save(position, force=self.preempted)
    if self.preempted:
      self._mngr.wait_until_finished()
      self._losses.metrics.write({"event": "preempted", "step": step})
      self._losses.progress.message(
        f"sparsepipe: preempted; checkpoint step {step} saved"
        f" ({self._schedule.batches_with_output(position)} batches trained), exiting"
      )
    return self.preempted

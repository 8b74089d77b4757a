"""The job's work around the training loop, one hook per concern.

A hook is called by the loop (`pipeline.train`) after every pipeline step
with the StepResult and may stop the loop by returning True; the job also
calls `start()` once before training, `segment_end()` after each segment's
last step and `end()` when the job is done (not when preempted). Every hook
reads and writes the job through its JobContext (context.py), the first
hook, and reports through the one writer (job_output.py). Adding a concern is
adding one class to `make_hooks`.

Order matters: losses are recorded before a checkpoint saves them; a
preemption is noticed before the checkpoint that honours it; an eval runs
after the checkpoint of its boundary.
"""

from __future__ import annotations

import math
import time
from typing import Any

import jax
import numpy as np

from sparsepipe import core
from sparsepipe import pipeline
from sparsepipe.launch.job.fdo import AheadCompiles
from sparsepipe.launch.job.context import JobContext
from sparsepipe.launch.job.metrics_log import IntervalMeter
from sparsepipe.launch.job.metrics_log import SteadyRate
from sparsepipe.launch.job.startup import CompileCounter
from sparsepipe.launch.job.startup import record_phase


class NonFiniteLossError(FloatingPointError):
  """Training produced a non-finite loss or update: the job stops unsaved."""


class JobHook:
  """One concern of the job (see the module docstring); the defaults do nothing."""

  def __init__(self, job: JobContext):
    self.job = job

  def start(self) -> None:
    """Before the first step of this run (fresh or restored)."""

  def __call__(self, result: pipeline.StepResult) -> bool:
    """After a pipeline step; True stops the loop at this boundary."""
    del result
    return False

  def segment_end(self) -> None:
    """After the last step of a segment (its drain, or the step that reads its last batch)."""

  def end(self) -> None:
    """After the job's last step."""


class LossHook(JobHook):
  """Per-batch losses -> metrics.jsonl and TensorBoard; stops on a non-finite one.

  The losses stay on the devices until `flush()` (every log_every_steps
  batches, and before a checkpoint), so the loop never waits for them.
  """

  def __init__(self, job: JobContext):
    super().__init__(job)
    self.pending: list[tuple[int, Any]] = []
    self.last_loss: float | None = None
    self.trained = 0

  def __call__(self, result: pipeline.StepResult) -> bool:
    if result.batch_index is not None:
      self.pending.append((self.job.position.start + result.batch_index + 1, result.output))
      self.trained += 1
    return False

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
      self.job.output.loss(batch, loss)

  def segment_end(self) -> None:
    self.flush()


class ProgressHook(JobHook):
  """The progress line every log_every_steps batches: rate, loss, data wait, epoch.

  Its rate and data wait are those of the intervals in which nothing but
  training happened (no compilation: JAX's compile events, counted; no save,
  no eval: the hooks doing those call `disturbed()`), over the last 10 such
  intervals on the line ('-' before the first) and over all of them in the
  summary. A segment's end is no disturbance of its own: an FDO retune that
  left the limits unchanged compiles nothing (with fdo.every_steps <=
  log_every_steps every interval held one, and the line never had a rate).
  """

  WINDOW = 10  # intervals of the line's rate

  def __init__(self, job: JobContext):
    super().__init__(job)
    self.every = max(int(job.config.log_every_steps), 1)
    self.meter = IntervalMeter()
    self.steady = SteadyRate(self.WINDOW)
    self._disturbed = True
    self.compiles = CompileCounter()  # any thread's: a compile ahead, a retune's step
    self._compiles_seen = 0

  def _compiled(self) -> bool:
    """Whether JAX compiled (or loaded a program from its cache) since the last call."""
    seen = self.compiles.requests
    compiled, self._compiles_seen = seen != self._compiles_seen, seen
    return compiled

  def disturbed(self) -> None:
    """Something else than training ran in this interval: not steady state."""
    self._disturbed = True

  def start(self) -> None:
    self.meter.reset()
    self._disturbed = True  # the first interval compiles

  def __call__(self, result: pipeline.StepResult) -> bool:
    if result.batch_index is None:
      return False
    self.meter.add(self.job.global_batch, result.data_wait_seconds)
    batch = self.job.position.start + result.batch_index + 1
    if batch % self.every == 0:
      self.job.hooks["losses"].flush()
      if not self._compiled() and not self._disturbed:
        self.steady.add(self.meter.examples, self.meter.seconds, self.meter.wait_seconds)
      self._disturbed = False
      rate, wait = self.steady.recent()
      last = self.job.hooks["losses"].last_loss
      self.job.output.progress(batch, rate, last, wait, self.job.epoch(batch))
      self.meter.reset()
    return False

  def steady_rate(self) -> float | None:
    """Examples/s of the undisturbed intervals (None if there was none)."""
    return self.steady.overall()

  def end(self) -> None:
    self.compiles.close()


class HeapHook(JobHook):
  """Gives the compiler's freed heap back after each compilation (core/memory.py).

  At the start, before the first step: what making or restoring the state
  freed (its programs' compilation, their temporaries, restore buffers).
  Then after each of a run's or segment's first two pipeline steps, which
  compile its programs (fill and steady; a segment carried in, only the
  steady one): the first program's compiler heap is returned before the
  second compiles and the first steps' buffers land above it, not only once
  both have run.
  """

  COMPILING_STEPS = 2

  def __init__(self, job: JobContext):
    super().__init__(job)
    self.steps = 0

  def start(self) -> None:
    self.steps = 0
    core.release_freed_heap()

  def segment_end(self) -> None:
    self.steps = 0

  def __call__(self, result: pipeline.StepResult) -> bool:
    del result
    self.steps += 1
    if self.steps <= self.COMPILING_STEPS:
      core.release_freed_heap()
    return False


class StartupHook(JobHook):
  """Records where the start's time went at the first trained batch (startup.py)."""

  def __call__(self, result: pipeline.StepResult) -> bool:
    timer = self.job.startup
    if timer is None or timer.done:
      return False
    if timer.step(result.data_wait_seconds, result.output):
      timer.record(self.job.output, self.job.position.start + result.batch_index + 1)
    return False


class RetuneStallHook(JobHook):
  """Measures each FDO retune's stall and records it as a `retune_stall` phase (startup.py).

  The stall is the gap between the last batch trained before the retune and
  the first batch trained after it (each with its output ready), less one
  steady batch time. The gap holds what the job does at the retune that is
  not training: a checkpoint due there, the FDO merge, the wait for the new
  limits' step to compile (none when it was compiled ahead, fdo.py
  AheadCompiles), handing the batches in flight over (pipelining/handover.py)
  and the first step of the new segment. The steady batch time is a
  throughput: the time from the segment's second batch trained to its last
  one over the batches between (the first two compile the steps; a
  checkpoint or eval inside the segment counts in its time). The loop only
  dispatches a step (JAX runs it asynchronously, and the time between the
  hook's calls would be dispatch time), so the hook waits for the output of
  those batches: three waits per segment. With no steady time measured (a
  segment that trains two batches or fewer, or a job resumed after a
  segment's second batch) no stall is recorded. `compiled_ahead`: whether
  the new step was compiled ahead for the limits the retune took
  (AheadCompiles.foreseen).
  """

  STEADY_FROM = 1  # the batch index from which no step of a segment compiles

  def __init__(self, job: JobContext):
    super().__init__(job)
    self.steady_from: float | None = None  # when batch STEADY_FROM was trained
    self.steady: float | None = None
    self.ended: float | None = None  # when the segment's last batch was trained
    self.retuned_after: int | None = None
    self.foreseen: bool | None = None  # AheadCompiles.foreseen of the retune

  def segment_end(self) -> None:
    end = self.job.position.end
    self.retuned_after = end if self.job.schedule.retunes_after(end) else None
    compiles = self.job.hooks.get("compile_ahead")
    self.foreseen = compiles.ahead.foreseen if compiles is not None else None

  def __call__(self, result: pipeline.StepResult) -> bool:
    position, index = self.job.position, result.batch_index
    # A segment that hands over trains its last batch in the next one.
    last = position.length - (1 if position.drains else 2)
    if index is None or (index not in (self.STEADY_FROM, last) and self.retuned_after is None):
      return False
    jax.block_until_ready(result.output)
    now = time.perf_counter()
    if self.retuned_after is not None and self.steady is not None:
      gap = now - self.ended
      record_phase(
        self.job.output,
        "retune_stall",
        self.retuned_after,
        gap - self.steady,
        gap_s=round(gap, 6),
        steady_batch_s=round(self.steady, 6),
        compiled_ahead=self.foreseen,
      )
    self.retuned_after = None
    if index == self.STEADY_FROM:
      self.steady_from = now
    if index == last:
      measured = self.steady_from is not None and last > self.STEADY_FROM
      self.steady = (now - self.steady_from) / (last - self.STEADY_FROM) if measured else None
      self.ended, self.steady_from = now, None
    return False


class CompileAheadHook(JobHook):
  """Compiles the step of the next retune's likely limits part-way through a segment
  (fdo.py AheadCompiles); the retune asks `ahead` for its step."""

  def __init__(self, job: JobContext):
    super().__init__(job)
    fdo = job.config.fdo
    self.ahead = AheadCompiles(
      job.model,
      job.schedule,
      float(fdo.get("compile_ahead", 0.0)),
      float(fdo.headroom),
      int(fdo.steps_per_doubling),
    )

  def __call__(self, result: pipeline.StepResult) -> bool:
    del result
    job = self.job
    if not job.preempted and self.ahead.due(job.position):
      self.ahead.derive(job.setup, job.position)
    return False

  def end(self) -> None:
    self.ahead.wait()  # the job leaves no compiling thread behind


class PreemptionHook(JobHook):
  """Stops the loop at the first batch boundary after a preemption notice (or Ctrl-C).

  Every process asks the watcher at every batch boundary, with the batch
  number (consecutive at consecutive boundaries), so under jax.distributed
  all processes agree on the boundary to stop at.
  """

  def __call__(self, result: pipeline.StepResult) -> bool:
    del result
    job = self.job
    if job.position.at_boundary and job.watcher.should_stop(job.batch):
      job.preempted = True
    return job.preempted


class CheckpointHook(JobHook):
  """Saves at every checkpoint.every_steps-th batch boundary, on preemption and at the end."""

  def __init__(self, job: JobContext):
    super().__init__(job)
    self.every = int(job.config.checkpoint.every_steps)
    if self.every < 1:
      raise ValueError(f"checkpoint.every_steps={self.every} must be >= 1 (batches)")
    self.last_saved: int | None = job.resumed_from
    self.writing = False  # an asynchronous save whose freed heap is not yet given back

  def save(self) -> None:
    """Flushes the losses and the outputs (metrics.jsonl and TensorBoard's event file
    cover the checkpoint: a resume from it replays only its own step's points,
    job_output.py) and saves.

    What the save's writing freed goes back to the kernel once it is
    written (core.release_freed_heap): glibc kept it, 0.8x the state's
    bytes for the criteo config (benchmarks/memory.py), above which the
    next steps' buffers would land.
    """
    job = self.job
    job.hooks["losses"].flush()
    job.output.flush()
    job.hooks["progress"].disturbed()
    saved = job.checkpoints.save(
      job.position, job.setup, job.train_state, job.pipeline_state, job_id=job.job_id
    )
    if saved:
      self.writing = bool(job.checkpoints.mngr.saving_in_progress())
      if not self.writing:
        core.release_freed_heap()
      self.last_saved = job.batch
      job.output.event("checkpoint", job.batch, f"checkpoint after batch {job.batch} saving")
      # The progress line names a checkpoint once it is written (a kill before then
      # resumes from the one before).
      job.output.mark(f"ckpt @{job.batch} saving" if self.writing else f"ckpt @{job.batch}")

  def __call__(self, result: pipeline.StepResult) -> bool:
    del result
    job = self.job
    if self.writing and not job.checkpoints.mngr.saving_in_progress():
      self.writing = False
      core.release_freed_heap()
      job.output.mark(f"ckpt @{self.last_saved}")
    if not job.position.at_boundary:
      return False
    if job.preempted:
      return self.stop_here()
    if job.batch % self.every == 0:
      self.save()
    return False

  def stop_here(self, during: str = "") -> bool:
    """The job stops at this boundary: saved (if not yet), written, and said; True.

    Once written, the watcher gives the signals back to the launcher: a second
    Ctrl-C then has nothing left to abort (it said "without saving", and raised
    its KeyboardInterrupt where Python could only report it).
    """
    job = self.job
    job.preempted = True
    if self.last_saved != job.batch:
      self.save()
    job.checkpoints.mngr.wait_until_finished()
    job.watcher.uninstall()
    job.output.event(
      "preempted",
      job.batch,
      f"sparsepipe: preempted{during}; checkpoint after batch {job.batch} saved, exiting",
    )
    return True

  def end(self) -> None:
    if self.last_saved != self.job.batch:
      self.save()
    self.job.checkpoints.mngr.wait_until_finished()


class EvalHook(JobHook):
  """Held-out evaluation at every eval.every_steps-th batch boundary and at the end."""

  def __init__(self, job: JobContext):
    super().__init__(job)
    self.last_eval: pipeline.EvalMetrics | None = None

  def _due(self, batch: int) -> bool:
    every = self.job.evaluation.every
    return bool(every) and 0 < batch < self.job.schedule.num_steps and batch % every == 0

  def run(self, stoppable: bool = True) -> bool:
    """Evaluates at this boundary; False if a stop signal abandoned the eval (one
    process: job/evaluation.py), which then stops the job here."""
    job = self.job
    job.hooks["progress"].disturbed()
    stop = (lambda: job.watcher.requested) if stoppable else None
    metrics = job.evaluation.run(job.train_state, stop=stop)
    if metrics is None:
      job.hooks["checkpoints"].stop_here(f" during the eval after batch {job.batch}")
      return False
    self.last_eval = metrics
    job.output.event(
      "eval", job.batch, f"eval after batch {job.batch}: {metrics.describe()}", **metrics.as_dict()
    )
    return True

  def start(self) -> None:
    # The eval of the boundary the job resumed at, unless it finished before the stop
    # (to its end: a stop now is honoured at the first boundary).
    job = self.job
    if self._due(job.batch) and not job.output.recorded("eval", job.batch):
      self.run(stoppable=False)
      if job.startup is not None and not job.startup.done:  # its own phase, not "compile"
        job.startup.mark("eval")

  def __call__(self, result: pipeline.StepResult) -> bool:
    del result
    job = self.job
    if job.position.at_boundary and not job.preempted and self._due(job.batch):
      return not self.run()
    return False

  def end(self) -> None:
    if not self.job.output.recorded("eval", self.job.batch):
      self.run()


def make_hooks(job: JobContext) -> list[Any]:
  """The job's hooks in the order the loop calls them (the context first)."""
  job.hooks = {
    "losses": LossHook(job),
    "progress": ProgressHook(job),
    "heap": HeapHook(job),
    "startup": StartupHook(job),
    "retune_stall": RetuneStallHook(job),
    "preemption": PreemptionHook(job),
    "compile_ahead": CompileAheadHook(job),
    "checkpoints": CheckpointHook(job),
  }
  if job.evaluation is not None:
    job.hooks["evaluation"] = EvalHook(job)
  return [job, *job.hooks.values()]

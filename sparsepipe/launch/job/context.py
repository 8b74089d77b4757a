"""What every hook of a job sees: the job's parts and where it stands.

The context is also the job's first hook: after every pipeline step it
takes the new states and position from the loop's StepResult, so the
hooks after it (hooks.py) read the current ones. Hooks reach each other
only through it (e.g. a checkpoint flushes the losses first).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sparsepipe import checkpointing
from sparsepipe import pipeline
from sparsepipe.launch.job.checkpoints import JobCheckpoints
from sparsepipe.launch.job.evaluation import JobEval
from sparsepipe.launch.job.model import JobModel
from sparsepipe.launch.job.model import Setup
from sparsepipe.launch.job.job_output import JobOutput
from sparsepipe.launch.job.schedule import Position
from sparsepipe.launch.job.schedule import Schedule


@dataclasses.dataclass
class JobContext:
  """One process's job: its parts, its state and where it stands.

  Attributes:
    config, workdir: the job's config and workdir.
    model: specs, model, optimizers and input of the config on the mesh.
    schedule: the segments of the job.
    output: metrics.jsonl, the progress line and TensorBoard.
    checkpoints: saving and restoring the job.
    watcher: the preemption signals.
    evaluation: the eval passes, or None without an eval set.
    setup, train_state, pipeline_state, position: the current ones.
    job_id: the job's identity, made at its first start and kept in every
      checkpoint (exports name it, so deltas apply only to their own job).
    resumed_from: the checkpoint step the job started from, or None.
    preempted: set when a preemption stops the job at this boundary.
    startup: the StartupTimer of this run's start (startup.py), or None.
    hooks: the job's hooks by kind, for the ones that work together.
    train_metrics: what each `pipeline.train` call of this process measured.
  """

  config: Any
  workdir: str
  model: JobModel
  schedule: Schedule
  output: JobOutput
  checkpoints: JobCheckpoints
  watcher: checkpointing.PreemptionWatcher
  evaluation: JobEval | None
  setup: Setup
  train_state: pipeline.TrainState
  pipeline_state: pipeline.PipelineState | None
  position: Position
  job_id: str
  resumed_from: int | None = None
  preempted: bool = False
  startup: Any = None
  hooks: dict[str, Any] = dataclasses.field(default_factory=dict)
  train_metrics: list[pipeline.TrainMetrics] = dataclasses.field(default_factory=list)

  @property
  def batch(self) -> int:
    """Batches trained so far (the number of the last one)."""
    return self.position.batches_trained

  @property
  def global_batch(self) -> int:
    return self.model.global_batch

  def epoch(self, batch: int) -> float:
    """Epochs of the training data that `batch` batches cover."""
    return batch * self.global_batch / self.model.epoch_examples

  def __call__(self, result: pipeline.StepResult) -> bool:
    """The loop's step result becomes the current state (a hook that never stops)."""
    self.train_state, self.pipeline_state = result.train_state, result.pipeline_state
    self.position = self.position.at_step(result.next_pipeline_step)
    return False


@dataclasses.dataclass(frozen=True)
class JobResult:
  """What a job did.

  Attributes:
    batches_trained: batches trained over the whole job (the last one's number).
    position: where the job stopped.
    checkpoint_step: the newest checkpoint step when the job stopped.
    resumed_from: the checkpoint step the job resumed from, or None.
    preempted: True if it stopped early to honour a preemption.
    last_loss: the loss of the last batch trained in this run, or None.
    examples_per_second: examples trained per second of training in this run
      (compilation, FDO retunes, evals and saves included).
    steady_examples_per_second: the median of the progress line's intervals,
      or None for a run of fewer than 3 intervals.
    last_eval: the metrics of the last eval of this run, or None.
  """

  batches_trained: int
  position: Position
  checkpoint_step: int | None
  resumed_from: int | None
  preempted: bool
  last_loss: float | None
  examples_per_second: float
  steady_examples_per_second: float | None = None
  last_eval: pipeline.EvalMetrics | None = None

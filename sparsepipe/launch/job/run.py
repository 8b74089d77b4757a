"""train_and_evaluate: the whole job, from config and workdir to a trained model.

Data pipeline -> pipelined train step -> checkpoints, with FDO retuning the
COO limits between segments (schedule.py) and preemption saving at the next
pipeline step boundary. The loop is the library's (`pipeline.train`, one
call per segment); the job plugs in its hooks (hooks.py). Everything a
resumed job needs is in the newest intact checkpoint, and the resumed job is
bit-identical to an uninterrupted one.

Call on every process (after jax.distributed.initialize when multi-host).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax

from sparsepipe import checkpointing
from sparsepipe import core
from sparsepipe import pipeline
from sparsepipe import transforms
from sparsepipe.launch.job import dataset
from sparsepipe.launch.config import from_manifest as dataset_config
from sparsepipe.launch.job import fdo as fdo_retune
from sparsepipe.launch.job.checkpoints import JobCheckpoints
from sparsepipe.launch.job.checkpoints import Restored
from sparsepipe.launch.job.evaluation import JobEval
from sparsepipe.launch.job.model import JobModel
from sparsepipe.launch.job.model import Setup
from sparsepipe.launch.job.metrics import MetricsLog
from sparsepipe.launch.job.metrics import ProgressLine
from sparsepipe.launch.job.schedule import Position
from sparsepipe.launch.job.schedule import SegmentSchedule
from sparsepipe.launch.job.hooks import CheckpointHook
from sparsepipe.launch.job.hooks import LossLog
from sparsepipe.launch.job.tensorboard import TensorBoardWriter
from sparsepipe.launch.job.workdir_lock import exclusive_workdir

# Config keys a resumed job may change (dotted, fnmatch patterns).
MUTABLE_CONFIG_KEYS = (
  "config.num_steps",
  "config.log_every_steps",
  "config.checkpoint.*",
  "config.eval.*",
)


@dataclasses.dataclass(frozen=True)
class JobResult:
  """What a job did.

  Attributes:
    batches_trained: batches whose dense step ran, over the whole job.
    position: where the job stopped (segment, pipeline step).
    checkpoint_step: the newest checkpoint step when the job stopped.
    resumed_from: the checkpoint step the job resumed from, or None.
    preempted: True if it stopped early to honour a preemption.
    last_loss: the loss of the last trained batch, or None.
    examples_per_second: examples trained per second in this process's run.
    last_eval: the metrics of the last eval of this run, or None.
  """

  batches_trained: int
  position: Position
  checkpoint_step: int | None
  resumed_from: int | None
  preempted: bool
  last_loss: float | None
  examples_per_second: float
  last_eval: pipeline.EvalMetrics | None = None


class _Job:
  """One process's share of a job (see train_and_evaluate)."""

  def __init__(self, config: Any, workdir: str):
    if config.features_from_manifest:
      config = dataset_config.apply_manifest(config)
    self.config = config
    self.workdir = os.path.abspath(workdir)
    os.makedirs(self.workdir, exist_ok=True)
    is_chief = jax.process_index() == 0
    self.mesh = core.make_mesh()
    self.schedule = SegmentSchedule.from_config(config)
    data_dir = dataset.ensure_dataset(config, self.workdir, show_progress=is_chief)
    self.model = JobModel(config, data_dir, self.mesh)
    self.metrics = MetricsLog(os.path.join(self.workdir, "metrics.jsonl"), enabled=is_chief)
    self.progress = ProgressLine(int(config.num_steps), enabled=is_chief)
    self.tensorboard = TensorBoardWriter(self.workdir, enabled=is_chief)
    self.losses = LossLog(
      self.metrics,
      self.progress,
      global_batch=self.model.global_batch,
      log_every=int(config.log_every_steps),
      tensorboard=self.tensorboard,
    )
    eval_dir = dataset.eval_data_dir(config, self.workdir)
    self.evaluation = eval_dir and JobEval(
      self.model,
      self.metrics,
      self.progress,
      self.tensorboard,
      data_dir=eval_dir,
      num_steps=self.schedule.num_steps,
    )
    self.last_eval: pipeline.EvalMetrics | None = None
    self.run_info = checkpointing.RunInfo.create(
      config, self.mesh, data_worker_count=self.model.input_config.num_workers
    )

  def run(self) -> JobResult:
    ckpt = self.config.checkpoint
    with checkpointing.TrainingCheckpointManager(
      os.path.join(self.workdir, "checkpoints"),
      self.run_info,
      save_interval_steps=int(ckpt.every_steps),
      keep_latest=int(ckpt.keep),
      async_save=bool(ckpt.async_save),
      fingerprint_arrays=bool(ckpt.verify_arrays),
      mutable_config_keys=MUTABLE_CONFIG_KEYS,
    ) as mngr:
      with checkpointing.PreemptionWatcher(mngr) as watcher:
        try:
          return self._run(JobCheckpoints(mngr, self.model, self.schedule), watcher)
        finally:
          self.metrics.close()
          self.tensorboard.close()

  def _start(self, ckpts: JobCheckpoints) -> Restored:
    """The newest checkpoint, or a fresh state at the start (announced either way)."""
    restored = ckpts.restore()
    schedule, where = self.schedule, ckpts.mngr.directory
    if restored is None:
      setup = self.model.setup(self.model.base_specs)
      restored = Restored(
        setup,
        self.model.fresh_train_state(),
        setup.trainer.initial_pipeline_state(),
        Position(0, 0),
        None,
      )
      self.metrics.truncate_batches(0)
      self.progress.message(
        f"sparsepipe: training {schedule.num_steps} batches of {self.model.global_batch}"
        f" on {_count(self.mesh.size, 'device')} ({_count(jax.process_count(), 'process')});"
        f" workdir {self.workdir}"
      )
      return restored
    self.metrics.truncate_batches(schedule.batches_with_output(restored.position))
    self.metrics.write({"event": "resume", "step": restored.checkpoint_step})
    batch = schedule.batches_consumed(restored.position)
    if restored.position == schedule.final():
      self.progress.message(
        f"sparsepipe: already trained {schedule.num_steps} batches (checkpoint step"
        f" {restored.checkpoint_step} in {where}); raise --config.num_steps to train more"
      )
    else:
      self.progress.message(
        f"sparsepipe: resumed from checkpoint step {restored.checkpoint_step} (batch"
        f" {batch} of {schedule.num_steps})"
      )
    return restored

  def _evaluate(self, train_state: Any, trained: int, *, final: bool = False) -> None:
    """An eval pass if one is due after `trained` batches (always at the end)."""
    if self.evaluation and (final or self.evaluation.due(trained)):
      self.last_eval = self.evaluation.run(train_state, trained)

  def _run(self, ckpts: JobCheckpoints, watcher: checkpointing.PreemptionWatcher) -> JobResult:
    state = self._start(ckpts)
    t_start = time.perf_counter()
    # The eval of the boundary it resumed at (it may not have run before the kill).
    self._evaluate(state.train_state, self.schedule.batches_with_output(state.position))
    setup, train_state, pipeline_state = state.setup, state.train_state, state.pipeline_state
    position = state.position
    hook = CheckpointHook(
      lambda pos, force: ckpts.save(pos, setup, train_state, pipeline_state, force=force),
      ckpts.mngr,
      watcher,
      self.losses,
      self.schedule,
    )
    hook.last_saved = state.checkpoint_step
    try:
      for segment in range(position.segment, self.schedule.num_segments):
        if segment != position.segment:
          setup = self._next_segment(setup, segment - 1)
          position, pipeline_state = Position(segment, 0), None

        def on_step(result: pipeline.StepResult, segment: int = segment) -> bool:
          nonlocal train_state, pipeline_state, position
          train_state, pipeline_state = result.train_state, result.pipeline_state
          position = Position(segment, result.next_pipeline_step)
          if result.batch_index is None:
            return hook(position)
          batch = self.schedule.first_batch(segment) + result.batch_index
          self.losses.add(batch, result.output, result.data_wait_seconds)
          stop = hook(position)
          if not stop:
            self._evaluate(train_state, batch + 1)
          return stop

        train_state, pipeline_state, _ = pipeline.train(
          setup.trainer,
          train_state,
          setup.iterator,
          self.schedule.length(segment),
          pipeline_state=pipeline_state,
          hooks=(on_step,),
        )
        if hook.preempted:
          return self._result(position, hook, state.checkpoint_step, True, t_start)
      hook.save(position, force=True)
      ckpts.mngr.wait_until_finished()
      self._evaluate(train_state, self.schedule.num_steps, final=True)
      return self._finish(position, hook, state.checkpoint_step, t_start, ckpts.mngr.directory)
    finally:
      setup.close()

  def _finish(self, position, hook, resumed_from, t_start, directory) -> JobResult:
    result = self._result(position, hook, resumed_from, False, t_start)
    step = self.schedule.checkpoint_step(position)
    self.metrics.write({"event": "done", "step": step, "batches": self.schedule.num_steps})
    if self.losses.trained:
      auc = "" if self.last_eval is None else f", eval AUC {self.last_eval.auc:.4f}"
      self.progress.message(
        f"sparsepipe: done: {self.schedule.num_steps} batches, last loss"
        f" {result.last_loss:.4f}{auc}, {result.examples_per_second:,.0f} examples/s;"
        f" checkpoint step {hook.last_saved} in {directory}; metrics in {self.metrics.path}"
      )
    return result

  def _next_segment(self, setup: Setup, segment: int) -> Setup:
    """FDO retune at a drained boundary; rebuilds step and input if limits changed."""
    if not int(self.config.fdo.every_steps):
      return setup
    specs, merged = fdo_retune.retune_limits(
      setup.feature_specs,
      setup.iterator.stats_totals().as_stats(),
      stats_dir=os.path.join(self.workdir, "fdo", f"segment_{segment:06d}"),
      headroom=float(self.config.fdo.headroom),
      num_sc_per_device=self.model.num_sc,
      global_device_count=self.mesh.size,
    )
    after = self.schedule.first_batch(segment + 1)
    self.metrics.write(
      {
        "event": "fdo",
        "after_batch": after,
        "limits": transforms.get_stack_limits(specs),
        # Per host a running sum; across hosts the FDO merge takes the max.
        "dropped_ids_largest_host": {k: int(v) for k, v in merged.id_drop_counters.items()},
      }
    )
    change = fdo_retune.describe_limits(setup.feature_specs, specs)
    self.progress.message(f"sparsepipe: FDO after batch {after}: {change}")
    if transforms.get_stack_limits(specs) == transforms.get_stack_limits(setup.feature_specs):
      return setup
    iterator = self.model.make_iterator(specs)
    iterator.set_state(setup.iterator.get_state())
    setup.close()
    return Setup(specs, self.model.make_trainer(specs), iterator)

  def _result(self, position, hook, resumed_from, preempted, t_start) -> JobResult:
    seconds = max(time.perf_counter() - t_start, 1e-9)
    return JobResult(
      batches_trained=self.schedule.batches_with_output(position),
      position=position,
      checkpoint_step=hook.last_saved,
      resumed_from=resumed_from,
      preempted=preempted,
      last_loss=self.losses.last_loss,
      examples_per_second=self.losses.trained * self.model.global_batch / seconds,
      last_eval=self.last_eval,
    )


def _count(n: int, noun: str) -> str:
  return f"{n} {noun}" if n == 1 else f"{n} {noun}es" if noun.endswith("s") else f"{n} {noun}s"


def train_and_evaluate(config: Any, workdir: str) -> JobResult:
  """Trains config.num_steps batches (resuming from workdir's checkpoints).

  Args:
    config: an ml_collections config like configs/demo.py.
    workdir: where the dataset (if generated), checkpoints, FDO statistics
      and metrics.jsonl live.

  Returns:
    A JobResult; `preempted` tells the caller to exit with
    checkpointing.PREEMPTED_EXIT_CODE.

  Raises:
    WorkdirInUseError: another job is running in `workdir` (workdir_lock.py).
  """
  with exclusive_workdir(os.path.abspath(workdir)):
    return _Job(config, workdir).run()

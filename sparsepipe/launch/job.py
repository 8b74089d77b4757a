"""train_and_evaluate: the whole job, from config and workdir to a trained model.

Data pipeline -> pipelined train step -> checkpoints, with FDO retuning the
COO limits between segments (schedule.py) and preemption saving at the next
pipeline step boundary. Everything a resumed job needs is in the newest
intact checkpoint: train state (params, ZeRO shards, step), embedding tables
and slots, PipelineState, every process's data iterator, the FDO limits and
segment; the resumed job is bit-identical to an uninterrupted one.

Call on every process (after jax.distributed.initialize when multi-host).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax

from sparsepipe import core
from sparsepipe import checkpointing
from sparsepipe import data
from sparsepipe import pipeline
from sparsepipe import transforms
from sparsepipe.launch import config_specs
from sparsepipe.launch import dataset
from sparsepipe.launch import fdo_retune
from sparsepipe.launch.metrics import IntervalMeter
from sparsepipe.launch.metrics import MetricsLog
from sparsepipe.launch.metrics import ProgressLine
from sparsepipe.launch.schedule import Position
from sparsepipe.launch.schedule import SegmentSchedule

# Config keys a resumed job may change (dotted, fnmatch patterns).
MUTABLE_CONFIG_KEYS = (
    "config.num_steps",
    "config.log_every_steps",
    "config.checkpoint.*",
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
  """

  batches_trained: int
  position: Position
  checkpoint_step: int | None
  resumed_from: int | None
  preempted: bool
  last_loss: float | None
  examples_per_second: float


@dataclasses.dataclass
class _Setup:
  """The parts of a job that depend on the current COO limits."""

  feature_specs: Any
  trainer: pipeline.PipelinedTrainer
  iterator: transforms.InputPipelineIterator


class _Job:
  """One process's share of a job (see train_and_evaluate)."""

  def __init__(self, config: Any, workdir: str):
    self.config = config
    self.workdir = os.path.abspath(workdir)
    os.makedirs(self.workdir, exist_ok=True)
    self.is_chief = jax.process_index() == 0
    self.mesh = core.make_mesh()
    self.num_sc = int(config.num_sc_per_device)
    self.global_batch = int(config.per_host_batch_size) * jax.process_count()
    self.schedule = SegmentSchedule.create(int(config.num_steps), int(config.fdo.every_steps))
    self.data_dir = dataset.ensure_dataset(config, self.workdir, show_progress=self.is_chief)
    self.num_dense = data.read_manifest(self.data_dir).schema.num_dense
    self.base_specs = config_specs.build_feature_specs(
        config, global_batch_size=self.global_batch, global_device_count=self.mesh.size
    )
    self.model = config_specs.dlrm_config(config, self.base_specs, self.num_dense)
    self.dense_optimizer = config_specs.dense_optimizer(config, self.mesh)
    self.tc_stage = pipeline.make_dlrm_tc_stage(self.model, self.dense_optimizer, self.mesh)
    self.input_config = config_specs.input_config(config, self.data_dir)
    self.metrics = MetricsLog(os.path.join(self.workdir, "metrics.jsonl"), enabled=self.is_chief)
    self.progress = ProgressLine(int(config.num_steps), enabled=self.is_chief)
    self.run_info = checkpointing.RunInfo.create(
        config, self.mesh, data_worker_count=self.input_config.num_workers
    )

  # -- building ----------------------------------------------------------------

  def abstract_train_state(self, feature_specs: Any) -> pipeline.TrainState:
    params = jax.eval_shape(
        lambda key: pipeline.init_dlrm_params(key, self.model), jax.random.key(0)
    )
    embeddings = pipeline.abstract_embedding_variables(
        feature_specs, self.mesh, num_sc_per_device=self.num_sc
    )
    return pipeline.abstract_train_state(self.dense_optimizer, params, self.mesh, embeddings)

  def fresh_train_state(self) -> pipeline.TrainState:
    params_key, tables_key = jax.random.split(jax.random.key(int(self.config.seed)))
    params = pipeline.init_dlrm_params(params_key, self.model)
    embeddings = pipeline.init_embedding_variables(
        tables_key, self.base_specs, self.mesh, num_sc_per_device=self.num_sc
    )
    return pipeline.create_train_state(self.dense_optimizer, params, self.mesh, embeddings)

  def make_trainer(self, feature_specs: Any) -> pipeline.PipelinedTrainer:
    example = pipeline.abstract_train_batch(
        feature_specs,
        self.mesh,
        global_batch_size=self.global_batch,
        num_dense=self.num_dense,
        num_sc_per_device=self.num_sc,
    )
    return pipeline.make_pipelined_trainer(
        self.mesh,
        self.abstract_train_state(feature_specs),
        example,
        self.tc_stage,
        feature_specs=feature_specs,
        num_sc_per_device=self.num_sc,
    )

  def make_iterator(self, feature_specs: Any) -> transforms.InputPipelineIterator:
    return pipeline.make_input_pipeline(
        self.input_config,
        feature_specs,
        self.mesh,
        worker_init_fn=checkpointing.ignore_sigterm_in_worker,
    )

  def setup(self, feature_specs: Any) -> _Setup:
    return _Setup(feature_specs, self.make_trainer(feature_specs), self.make_iterator(feature_specs))

  # -- checkpoints --------------------------------------------------------------

  @staticmethod
  def _split(train_state: pipeline.TrainState) -> tuple[dict[str, Any], Any]:
    dense = {"step": train_state.step, "params": train_state.params, "opt_state": train_state.opt_state}
    return dense, train_state.embedding_variables

  def fdo_item(self, segment: int, feature_specs: Any) -> dict[str, Any]:
    return {
        "segment": segment,
        "segment_batches": self.schedule.segment_batches,
        "segment_length": self.schedule.length(segment),
        "limits": transforms.get_stack_limits(feature_specs),
    }

  def save(self, mngr, position: Position, setup: _Setup, train_state, pipeline_state, *, force: bool) -> bool:
    dense, embeddings = self._split(train_state)
    state = checkpointing.TrainingState(
        train_state=dense,
        embeddings=embeddings,
        pipeline_state=pipeline_state,
        data_iter=setup.iterator,
        fdo=self.fdo_item(position.segment, setup.feature_specs),
    )
    progress = checkpointing.Progress(
        pipeline_step=position.pipeline_step,
        batches_consumed=self.schedule.batches_consumed(position),
        pipeline_drained=self.schedule.is_drained(position),
    )
    return mngr.save(
        self.schedule.checkpoint_step(position),
        state,
        progress,
        feature_limits=transforms.get_stack_limits(setup.feature_specs),
        force=force,
    )

  def _check_position(self, where: str, restored: Any) -> Position:
    """The saved position, if this run's schedule has the same segment there."""
    fdo = restored.fdo
    position = Position(int(fdo["segment"]), restored.metadata.progress.pipeline_step)
    if fdo["segment_batches"] != self.schedule.segment_batches:
      raise checkpointing.IncompatibleCheckpointError(
          f"{where} was written with FDO segments of {fdo['segment_batches']}"
          f" batches; this run has {self.schedule.segment_batches}"
          " (config.fdo.every_steps, or config.num_steps when FDO is off)"
      )
    if position.segment >= self.schedule.num_segments or (
        self.schedule.length(position.segment) != fdo["segment_length"]
    ):
      raise checkpointing.IncompatibleCheckpointError(
          f"{where} is in segment {position.segment} of"
          f" {fdo['segment_length']} batches; with"
          f" num_steps={self.schedule.num_steps} that segment would not exist"
          " or have another length, which changes its pipeline run"
      )
    return position

  def restore(self, mngr):
    """(setup, train_state, pipeline_state, position, step) of the newest intact step, or None.

    The restore targets depend on the saved FDO limits (buffer shapes of the
    PipelineState and of the input pipeline), so they are built from each
    candidate step's metadata; corrupt steps are skipped by the manager.
    """
    setups: list[_Setup] = []

    def targets(saved: checkpointing.CheckpointMetadata) -> checkpointing.RestoreTargets:
      specs = transforms.apply_stack_limits(self.base_specs, saved.feature_limits)
      setups.append(self.setup(specs))
      dense, embeddings = self._split(self.abstract_train_state(specs))
      return checkpointing.RestoreTargets(
          train_state=dense,
          embeddings=embeddings,
          pipeline_state=setups[-1].trainer.abstract_pipeline_state,
          data_iter=setups[-1].iterator,
      )

    relayout = checkpointing.embedding_relayout(
        self.base_specs,
        self.mesh,
        num_sc_per_device=self.num_sc,
        saved_feature_specs=lambda devices: config_specs.build_feature_specs(
            self.config, global_batch_size=self.global_batch, global_device_count=devices
        ),
    )
    try:
      restored = mngr.restore(targets, relayouts={"embeddings": relayout})
    finally:
      for unused in setups[:-1]:  # from steps that turned out corrupt
        _close(unused.iterator)
    if restored is None:
      return None
    setup = setups[-1]
    position = self._check_position(mngr.where(restored.step), restored)
    train_state = pipeline.TrainState(
        step=restored.train_state["step"],
        params=restored.train_state["params"],
        opt_state=restored.train_state["opt_state"],
        embedding_variables=restored.embeddings,
    )
    pipeline_state = restored.pipeline_state
    if pipeline_state is None:  # device count changed at a drained step
      pipeline_state = setup.trainer.initial_pipeline_state()
    return setup, train_state, pipeline_state, position, restored.step

  # -- the loop -------------------------------------------------------------------

  def run(self) -> JobResult:
    config = self.config
    ckpt = config.checkpoint
    with checkpointing.TrainingCheckpointManager(
        os.path.join(self.workdir, "checkpoints"),
        self.run_info,
        save_interval_steps=int(ckpt.every_steps),
        keep_latest=int(ckpt.keep),
        async_save=bool(ckpt.async_save),
        fingerprint_arrays=bool(ckpt.verify_arrays),
        mutable_config_keys=MUTABLE_CONFIG_KEYS,
    ) as mngr:
      watcher = checkpointing.PreemptionWatcher(mngr)
      with watcher:
        try:
          return self._run(mngr, watcher)
        finally:
          self.metrics.close()

  def _run(self, mngr, watcher) -> JobResult:
    restored = self.restore(mngr)
    if restored is None:
      setup = self.setup(self.base_specs)
      train_state = self.fresh_train_state()
      pipeline_state = setup.trainer.initial_pipeline_state()
      position, resumed_from = Position(0, 0), None
      self.metrics.truncate_batches(0)
      self.progress.message(
          f"sparsepipe: training {self.schedule.num_steps} batches of"
          f" {self.global_batch} on {self.mesh.size} devices"
          f" ({jax.process_count()} processes); workdir {self.workdir}"
      )
    else:
      setup, train_state, pipeline_state, position, resumed_from = restored
      self.metrics.truncate_batches(self.schedule.batches_with_output(position))
      self.metrics.write({"event": "resume", "step": resumed_from})
      if position == self.schedule.final():
        self.progress.message(
            f"sparsepipe: already trained {self.schedule.num_steps} batches"
            f" (checkpoint step {resumed_from} in {mngr.directory}); raise"
            " --config.num_steps to train more"
        )
      else:
        self.progress.message(
            f"sparsepipe: resumed from checkpoint step {resumed_from} (batch"
            f" {self.schedule.batches_consumed(position)} of {self.schedule.num_steps})"
        )
    last_saved = resumed_from
    meter, last_loss, trained = IntervalMeter(), None, 0
    pending: list[tuple[int, Any]] = []
    log_every = max(int(self.config.log_every_steps), 1)
    t_start = time.perf_counter()

    def flush() -> None:
      nonlocal last_loss
      if not pending:
        return
      losses = jax.device_get([loss for _, loss in pending])
      for (batch, _), loss in zip(pending, losses):
        last_loss = float(loss)
        self.metrics.write({"batch": batch, "loss": last_loss})
      pending.clear()

    try:
      while True:
        segment = position.segment
        length = self.schedule.length(segment)
        while position.pipeline_step < length + 2:
          p = position.pipeline_step
          t0 = time.perf_counter()
          batch = next(setup.iterator) if p < length else None
          waited = time.perf_counter() - t0
          train_state, pipeline_state, output = setup.trainer.run_pipeline_step(
              train_state, pipeline_state, batch, pipeline.is_fake_tc_step(p, length)
          )
          position = Position(segment, p + 1)
          if pipeline.is_output_valid(p, length):
            batch_index = self.schedule.first_batch(segment) + p - 1
            pending.append((batch_index, output["loss"]))
            meter.add(self.global_batch, waited)
            trained += 1
            if (batch_index + 1) % log_every == 0:
              flush()
              rate, wait = meter.read()
              self.progress.update(batch_index + 1, rate, last_loss, wait)
              meter.reset()
          step = self.schedule.checkpoint_step(position)
          preempted = watcher.should_stop(step)
          if preempted or mngr.should_save(step):
            flush()
            if self.save(mngr, position, setup, train_state, pipeline_state, force=preempted):
              last_saved = step
              self.metrics.write({"event": "checkpoint", "step": step})
              self.progress.message(f"checkpoint {step} saving")
              self.progress.event(f"ckpt {step}")
          if preempted:
            mngr.wait_until_finished()
            self.metrics.write({"event": "preempted", "step": step})
            self.progress.message(
                f"sparsepipe: preempted; checkpoint step {step} saved, exiting"
            )
            return self._result(trained, position, last_saved, resumed_from, True, last_loss, t_start)
        if segment + 1 >= self.schedule.num_segments:
          break
        setup = self._next_segment(setup, segment)
        pipeline_state = setup.trainer.initial_pipeline_state()
        position = Position(segment + 1, 0)
      flush()
      step = self.schedule.checkpoint_step(position)
      if self.save(mngr, position, setup, train_state, pipeline_state, force=True):
        last_saved = step
        self.metrics.write({"event": "checkpoint", "step": step})
      mngr.wait_until_finished()
      result = self._result(trained, position, last_saved, resumed_from, False, last_loss, t_start)
      self.metrics.write({"event": "done", "step": step, "batches": self.schedule.num_steps})
      if trained:
        self.progress.message(
            f"sparsepipe: done: {self.schedule.num_steps} batches, last loss"
            f" {result.last_loss:.4f}, {result.examples_per_second:,.0f}"
            f" examples/s; checkpoint step {last_saved} in {mngr.directory};"
            f" metrics in {self.metrics.path}"
        )
      return result
    finally:
      _close(setup.iterator)

  def _next_segment(self, setup: _Setup, segment: int) -> _Setup:
    """FDO retune at a drained boundary; rebuilds step and input if limits changed."""
    if not int(self.config.fdo.every_steps):
      return setup
    specs, merged = fdo_retune.retune_limits(
        setup.feature_specs,
        setup.iterator.stats_totals().as_stats(),
        stats_dir=os.path.join(self.workdir, "fdo", f"segment_{segment:06d}"),
        headroom=float(self.config.fdo.headroom),
        num_sc_per_device=self.num_sc,
        global_device_count=self.mesh.size,
    )
    change = fdo_retune.describe_limits(setup.feature_specs, specs)
    self.metrics.write({
        "event": "fdo",
        "after_batch": self.schedule.first_batch(segment + 1),
        "limits": transforms.get_stack_limits(specs),
        # Per host a running sum; across hosts the FDO merge takes the max.
        "dropped_ids_largest_host": {k: int(v) for k, v in merged.id_drop_counters.items()},
    })
    self.progress.message(f"sparsepipe: FDO after batch {self.schedule.first_batch(segment + 1)}: {change}")
    if transforms.get_stack_limits(specs) == transforms.get_stack_limits(setup.feature_specs):
      return setup
    iterator = self.make_iterator(specs)
    iterator.set_state(setup.iterator.get_state())
    _close(setup.iterator)
    return _Setup(specs, self.make_trainer(specs), iterator)

  def _result(self, trained, position, last_saved, resumed_from, preempted, last_loss, t_start) -> JobResult:
    seconds = max(time.perf_counter() - t_start, 1e-9)
    return JobResult(
        batches_trained=self.schedule.batches_with_output(position),
        position=position,
        checkpoint_step=last_saved,
        resumed_from=resumed_from,
        preempted=preempted,
        last_loss=last_loss,
        examples_per_second=trained * self.global_batch / seconds,
    )


def _close(iterator: Any) -> None:
  close = getattr(iterator, "close", None)
  if close is not None:
    close()


def train_and_evaluate(config: Any, workdir: str) -> JobResult:
  """Trains config.num_steps batches (resuming from workdir's checkpoints).

  Args:
    config: an ml_collections config like configs/demo.py.
    workdir: where the dataset (if generated), checkpoints, FDO statistics
      and metrics.jsonl live.

  Returns:
    A JobResult; `preempted` tells the caller to exit with
    checkpointing.PREEMPTED_EXIT_CODE.
  """
  return _Job(config, workdir).run()

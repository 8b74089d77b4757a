"""The job's checkpoints: what one holds at a position, and the newest one restored.

A checkpoint step is Orbax's step number: the pipeline steps of the whole
job, `segment * (segment_batches + 2) + pipeline_step` (schedule.py). People
read batches; the step only names the directory.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from sparsepipe import checkpointing
from sparsepipe import pipeline
from sparsepipe import transforms
from sparsepipe.launch.job.model import JobModel
from sparsepipe.launch.job.model import Setup
from sparsepipe.launch.job.schedule import Position
from sparsepipe.launch.job.schedule import SegmentSchedule


@dataclasses.dataclass
class Restored:
  """A job state read back from the newest intact checkpoint."""

  setup: Setup
  train_state: pipeline.TrainState
  pipeline_state: pipeline.PipelineState
  position: Position
  checkpoint_step: int


def split_train_state(train_state: pipeline.TrainState) -> tuple[dict[str, Any], Any]:
  """(dense item, embeddings item): the two checkpoint items of a TrainState."""
  dense = {
    "step": train_state.step,
    "params": train_state.params,
    "opt_state": train_state.opt_state,
  }
  return dense, train_state.embedding_variables


class JobCheckpoints:
  """Saves and restores a job's state through a TrainingCheckpointManager."""

  def __init__(
    self,
    mngr: checkpointing.TrainingCheckpointManager,
    model: JobModel,
    schedule: SegmentSchedule,
  ):
    self.mngr = mngr
    self.model = model
    self.schedule = schedule

  def _fdo_item(self, segment: int, feature_specs: Any) -> dict[str, Any]:
    return {
      "segment": segment,
      "segment_batches": self.schedule.segment_batches,
      "segment_length": self.schedule.length(segment),
      "limits": transforms.get_stack_limits(feature_specs),
    }

  def save(
    self, position: Position, setup: Setup, train_state: Any, pipeline_state: Any, *, force: bool
  ) -> bool:
    """Saves the job at `position` (asynchronously); False if Orbax skipped it."""
    dense, embeddings = split_train_state(train_state)
    state = checkpointing.TrainingState(
      train_state=dense,
      embeddings=embeddings,
      pipeline_state=pipeline_state,
      data_iter=setup.iterator,
      fdo=self._fdo_item(position.segment, setup.feature_specs),
    )
    progress = checkpointing.Progress(
      pipeline_step=position.pipeline_step,
      batches_consumed=self.schedule.batches_consumed(position),
      pipeline_drained=self.schedule.is_drained(position),
    )
    return self.mngr.save(
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

  def restore(self, step: int | None = None) -> Restored | None:
    """The newest intact checkpoint (or `step`), or None if there is none.

    The restore targets depend on the saved FDO limits (buffer shapes of the
    PipelineState and of the input pipeline), so they are built from each
    candidate step's metadata; corrupt steps are skipped by the manager.
    """
    model, setups = self.model, []

    def targets(saved: checkpointing.CheckpointMetadata) -> checkpointing.RestoreTargets:
      limits = transforms.carry_stack_limits(
        saved.feature_limits,
        model.base_specs,
        saved_global_device_count=saved.run.device_count,
        global_device_count=model.mesh.size,
        num_sc_per_device=model.num_sc,
      )
      specs = transforms.apply_stack_limits(model.base_specs, limits)
      setups.append(model.setup(specs))
      dense, embeddings = split_train_state(model.abstract_train_state(specs))
      return checkpointing.RestoreTargets(
        train_state=dense,
        embeddings=embeddings,
        pipeline_state=setups[-1].trainer.abstract_pipeline_state,
        data_iter=setups[-1].iterator,
      )

    relayout = checkpointing.embedding_relayout(
      model.base_specs,
      model.mesh,
      num_sc_per_device=model.num_sc,
      saved_feature_specs=model.feature_specs_for,
    )
    try:
      restored = self.mngr.restore(targets, step=step, relayouts={"embeddings": relayout})
    finally:
      for unused in setups[:-1]:  # from steps that turned out corrupt
        unused.close()
    if restored is None:
      if setups:
        setups[-1].close()
      return None
    setup = setups[-1]
    if restored.metadata.run.device_count != model.mesh.size:
      # The FDO maxima are per device of the saved layout: retune from the new one.
      setup.iterator.reset_stats_maxima()
    train_state = pipeline.TrainState(
      step=restored.train_state["step"],
      params=restored.train_state["params"],
      opt_state=restored.train_state["opt_state"],
      embedding_variables=restored.embeddings,
    )
    pipeline_state = restored.pipeline_state
    if pipeline_state is None:  # device count changed at a drained step
      # Fresh buffers at the saved step (drained: at 0 or after the drain);
      # at step 0 the loop would train the segment again.
      pipeline_state = setup.trainer.initial_pipeline_state()
      pipeline_state = pipeline_state.replace(
        pipeline_step=jax.device_put(
          np.int32(restored.metadata.progress.pipeline_step), pipeline_state.pipeline_step.sharding
        )
      )
    position = self._check_position(self.mngr.where(restored.step), restored)
    return Restored(setup, train_state, pipeline_state, position, restored.step)

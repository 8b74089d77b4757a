"""The job's checkpoints: what one holds at a batch boundary, and restoring one anywhere.

A checkpoint step is the number of batches trained (schedule.py): the job
saves at batch boundaries only, so `checkpoints/500` is the job after batch
500. Besides the arrays, the data position and the FDO limits, a step
records its segment ({"segment", "start", "length", "to_end", "carried_in"}
in the "fdo" item) and which batches its PipelineState buffers
(LoopPosition.in_flight).

Restoring onto any mesh: the saved limits are carried to the current device
count (transforms.carry_stack_limits), the tables re-laid out by logical row,
the ZeRO shards re-padded, and the PipelineState's buffered COO inputs made
again from their batches for the current mesh
(checkpointing.pipeline_state_relayout with the input's `batch_at`); the
data iterator continues at the same global batch on any process count.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from sparsepipe import checkpointing
from sparsepipe import pipeline
from sparsepipe import transforms
from sparsepipe.core.saved_work import a_kind
from sparsepipe.core.saved_work import saved_work
from sparsepipe.launch.config import packing
from sparsepipe.launch.config import config_specs
from sparsepipe.launch.config.pipelining import pipelining_choice, resolve_pipelining
from sparsepipe.launch.job.model import JobModel
from sparsepipe.launch.job.model import Setup
from sparsepipe.launch.job.schedule import Position

# The format whose steps count batches (launch/job/schedule.py); older
# launcher steps counted pipeline steps.
BATCH_STEPS_FORMAT = 4

# Config keys a resumed job may change (dotted, fnmatch patterns).
MUTABLE_CONFIG_KEYS = (
  "config.num_steps",
  "config.num_epochs",
  "config.data.num_workers",
  "config.data.allow_id_dropping",
  "config.log_every_steps",
  "config.compilation_cache_dir",
  "config.fdo.every_steps",
  "config.fdo.first_after",
  "config.fdo.compile_ahead",
  "config.fdo.steps_per_doubling",
  "config.checkpoint.*",
  "config.eval.*",
)

# Config keys added since 0.3.0 -> the value that does what jobs saved before
# them did, so that those jobs resume (a saved config without the key has it).
ADDED_CONFIG_KEYS = {"config.data.shuffle_window": 0}

# Config keys of paths: a job saves them absolute (resolved from the directory it
# was started in), and a step saved with a relative one resumes where it names
# the same place.
PATH_CONFIG_KEYS = ("config.data.dir",)

# How the configs of a job's steps may differ: what a job resumes with, and
# what evaluate and export restore with (the newest intact step may be older
# than the one whose config they read).
CONFIG_RULES = dict(
  mutable_config_keys=MUTABLE_CONFIG_KEYS,
  added_config_keys=ADDED_CONFIG_KEYS,
  path_config_keys=PATH_CONFIG_KEYS,
)


# Reads of the newest step's config while a running job deletes its older steps.
_READ_ATTEMPTS = 5


@dataclasses.dataclass
class Restored:
  """A job state read back from a checkpoint.

  Attributes:
    setup: specs, trainer and input for the restored limits on this mesh
      (None when only the model was read: `restore_model`).
    feature_specs: the feature specs with the restored limits, on this mesh.
    train_state, pipeline_state: the state, laid out for this mesh
      (pipeline_state None when only the model was read).
    position: where the saved job stood (its segment as it was planned).
    checkpoint_step: the step restored.
    metadata: the step's CheckpointMetadata (its run, its format).
    job_id: the job's identity, the same in every checkpoint of one job
      (None for checkpoints of format 3 and older).
  """

  setup: Setup | None
  feature_specs: Any
  train_state: pipeline.TrainState
  pipeline_state: pipeline.PipelineState | None
  position: Position
  checkpoint_step: int
  metadata: checkpointing.CheckpointMetadata
  job_id: str | None

  @property
  def format_version(self) -> int:
    return self.metadata.format_version


def split_train_state(train_state: pipeline.TrainState) -> tuple[dict[str, Any], Any]:
  """(dense item, embeddings item): the two checkpoint items of a TrainState."""
  dense = {
    "step": train_state.step,
    "params": train_state.params,
    "opt_state": train_state.opt_state,
  }
  return dense, train_state.embedding_variables


def saved_position(fdo: dict[str, Any], meta: checkpointing.CheckpointMetadata) -> Position:
  """The Position a step was saved at (its segment from the "fdo" item)."""
  step = meta.progress.pipeline_step
  pipelined = bool(pipelining_choice(meta.run.config.get("pipelining", True)))
  if meta.format_version >= BATCH_STEPS_FORMAT:
    return Position(
      int(fdo["segment"]),
      int(fdo["start"]),
      int(fdo["length"]),
      bool(fdo["to_end"]),
      step,
      pipelined,
      carried_in=bool(fdo.get("carried_in", False)),  # segments saved by 0.3 all drained
    )
  to_end = not int(meta.run.config.get("fdo", {}).get("every_steps", 0))
  start = int(fdo["segment"]) * int(fdo["segment_batches"])
  return Position(int(fdo["segment"]), start, int(fdo["segment_length"]), to_end, step, pipelined)


class JobCheckpoints:
  """Saves and restores a job's state through a TrainingCheckpointManager."""

  def __init__(self, mngr: checkpointing.TrainingCheckpointManager, model: JobModel):
    self.mngr = mngr
    self.model = model

  def save(
    self,
    position: Position,
    setup: Setup,
    train_state: Any,
    pipeline_state: Any,
    *,
    job_id: str,
    force: bool = True,
  ) -> bool:
    """Saves the job at batch boundary `position` (asynchronously); False if it exists."""
    if not position.at_boundary:
      raise ValueError(f"{position} is not a batch boundary: the job saves only at those")
    dense, embeddings = split_train_state(train_state)
    fdo = {
      "segment": position.segment,
      "start": position.start,
      "length": position.length,
      "to_end": position.to_end,
      "carried_in": position.carried_in,
      "limits": transforms.get_stack_limits(setup.feature_specs),
      "job_id": job_id,
    }
    state = checkpointing.CheckpointItems(
      train_state=dense,
      embeddings=embeddings,
      pipeline_state=pipeline_state,
      data_iter=setup.iterator,
      fdo=fdo,
    )
    loop = checkpointing.LoopPosition(
      pipeline_step=position.pipeline_step,
      batches_consumed=position.batches_read,
      pipeline_drained=position.drained,
      in_flight=position.in_flight,
    )
    return self.mngr.save(
      position.batches_trained,
      state,
      loop,
      feature_limits=fdo["limits"],
      training_data=self.model.manifest.to_dict(),
      force=force,
    )

  def _specs(self, saved: checkpointing.CheckpointMetadata) -> Any:
    """The feature specs of this mesh with the saved limits carried to it."""
    model = self.model
    limits = transforms.carry_stack_limits(
      saved.feature_limits,
      model.base_specs,
      saved_global_device_count=saved.run.device_count,
      global_device_count=model.mesh.size,
      num_sc_per_device=model.num_sc,
    )
    return transforms.apply_stack_limits(model.base_specs, limits)

  def _targets(self, setups: list[Setup], specs_seen: list[Any], with_setup: bool):
    model = self.model

    def targets(saved: checkpointing.CheckpointMetadata) -> checkpointing.RestoreTargets:
      specs = self._specs(saved)
      specs_seen.append(specs)
      tracked = saved.format_version >= BATCH_STEPS_FORMAT  # per-row updates from format 4
      dense, embeddings = split_train_state(
        model.abstract_train_state(specs, track_updates=tracked)
      )
      if not with_setup:
        return checkpointing.RestoreTargets(dense, embeddings, None, None)
      setups.append(model.setup(specs))
      return checkpointing.RestoreTargets(
        train_state=dense,
        embeddings=embeddings,
        pipeline_state=setups[-1].trainer.abstract_pipeline_state,
        data_iter=setups[-1].iterator,
      )

    return targets

  def _relayouts(self, setups: list[Setup]) -> dict[str, checkpointing.Relayout]:
    model = self.model
    return {
      "embeddings": checkpointing.embedding_relayout(
        model.base_specs,
        model.mesh,
        num_sc_per_device=model.num_sc,
        saved_feature_specs=model.feature_specs_for,
      ),
      # The buffered batches, made again by the input of the chosen step's setup.
      "pipeline_state": checkpointing.pipeline_state_relayout(
        lambda index: setups[-1].iterator.batch_at(index).unpacked().sparse,
        lambda: setups[-1].trainer.initial_pipeline_state(),
      ),
    }

  def _carry_stats(self, setup: Setup, saved_devices: int) -> None:
    """The FDO maxima of another device count, carried to this one as bounds."""
    mesh_size, num_sc = self.model.mesh.size, self.model.num_sc
    bounds = transforms.most_ids_per_sparsecore(setup.feature_specs, mesh_size * num_sc)
    setup.iterator.carry_stats_maxima(
      lambda field, stack, value: transforms.carry_stats_maximum(
        field,
        value,
        bound=bounds[stack],
        saved_global_device_count=saved_devices,
        global_device_count=mesh_size,
        num_sc_per_device=num_sc,
      )
    )

  def _read(self, step: int | None, with_setup: bool) -> Restored | None:
    setups: list[Setup] = []
    specs_seen: list[Any] = []
    items = checkpointing.ARRAY_ITEMS if with_setup else ("train_state", "embeddings")
    try:
      restored = self.mngr.restore(
        self._targets(setups, specs_seen, with_setup),
        step=step,
        relayouts=self._relayouts(setups),
        items=items,
      )
    finally:
      for unused in setups[:-1]:  # from steps that turned out corrupt
        unused.close()
    if restored is None:
      if setups:
        setups[-1].close()
      return None
    setup = setups[-1] if setups else None
    if setup is not None and restored.metadata.run.device_count != self.model.mesh.size:
      self._carry_stats(setup, restored.metadata.run.device_count)
    train_state = pipeline.TrainState(
      step=restored.train_state["step"],
      params=restored.train_state["params"],
      opt_state=restored.train_state["opt_state"],
      embedding_variables=restored.embeddings,
    )
    return Restored(
      setup,
      specs_seen[-1],
      train_state,
      restored.pipeline_state,
      saved_position(restored.fdo, restored.metadata),
      restored.step,
      restored.metadata,
      restored.fdo.get("job_id"),
    )

  def restore(self, step: int | None = None) -> Restored | None:
    """The newest intact checkpoint (or `step`) on this mesh, or None if there is none.

    The restore targets depend on the saved FDO limits (buffer shapes of the
    PipelineState and of the input), so they are built from each candidate
    step's metadata; corrupt steps are skipped by the manager.
    """
    return self._read(step, with_setup=True)

  def restore_model(self, step: int | None = None) -> Restored | None:
    """Only the model of a checkpoint (TrainState): no PipelineState, input or trainer.

    For evaluating or exporting a step.
    """
    return self._read(step, with_setup=False)


@dataclasses.dataclass(frozen=True)
class SavedJob:
  """What a checkpoint of a workdir says of its job, read without restoring it.

  Attributes:
    directory: the workdir's checkpoints directory.
    step: the step read.
    config: the job's config as saved there.
    training_data: the trained dataset's manifest JSON as saved there (None
      in steps saved by 0.3 and earlier).
  """

  directory: str
  step: int
  config: ml_collections.ConfigDict
  training_data: Any


def saved_job(workdir: str, step: int | None) -> SavedJob:
  """The SavedJob of checkpoint `step`, else of the newest step, of a workdir.

  Read-only, as everything that reads a job's checkpoints from outside the
  job (evaluate, export): the job may be running and writing there, and a
  writable manager would delete its save in progress.
  """
  directory = os.path.join(os.path.abspath(workdir), checkpointing.CHECKPOINTS_DIRNAME)
  if not os.path.isdir(directory):
    other = saved_work(workdir)
    if other is not None and other[0] != "workdir":  # e.g. an export given for its job
      raise ValueError(
        f"'{workdir}' is {a_kind(other[0])} (it has {other[1]}), not a job's"
        " workdir: give the --workdir the job trained in"
      )
    if os.path.isfile(workdir):
      raise ValueError(f"'{workdir}' is a file, not a job's workdir")
    if not os.path.exists(workdir):
      raise ValueError(f"'{workdir}' does not exist (give the --workdir the job trained in)")
    parent = os.path.dirname(os.path.abspath(workdir))
    if os.path.basename(os.path.abspath(workdir)) == checkpointing.CHECKPOINTS_DIRNAME and (
      (saved_work(parent) or ("",))[0] == "workdir"
    ):
      raise ValueError(
        f"'{workdir}' is the checkpoints folder of the job in '{parent}': give that as --workdir"
      )
    raise ValueError(f"no checkpoints in '{workdir}' (no '{directory}')")
  for _ in range(_READ_ATTEMPTS):
    with checkpointing.TrainingCheckpointManager(directory, None, read_only=True) as reader:
      steps = [step] if step is not None else sorted(reader.all_steps(), reverse=True)
      if not steps:
        raise ValueError(f"no checkpoint in '{directory}'")
      saved = _newest_readable(reader, steps, given=step is not None)
    if saved is not None:
      return saved
  raise ValueError(
    f"the newest checkpoint in '{directory}' was deleted while it was read,"
    f" {_READ_ATTEMPTS} times in a row (a job saving faster than it can be read): give --step"
  )


def _newest_readable(reader: Any, steps: list[int], *, given: bool) -> SavedJob | None:
  """The SavedJob of the first of `steps` whose metadata reads; None when one was
  deleted since it was listed (a running job saved newer ones: list them again).
  A corrupt one is passed over as the restore passes over it (unless `given`)."""
  for candidate in steps:
    try:
      meta = reader.read_metadata(candidate)
    except (checkpointing.StepNotKeptError, FileNotFoundError):
      if given or os.path.isdir(os.path.join(str(reader.directory), str(candidate))):
        raise
      return None
    except checkpointing.CorruptCheckpointError:
      if given or candidate == steps[-1]:
        raise
      continue
    config = ml_collections.ConfigDict(meta.run.config)
    return SavedJob(str(reader.directory), candidate, config, meta.training_data)
  return None


def in_flight_bytes(model: JobModel) -> int:
  """What a save of `model`'s state writes, or a restore reads, at once
  (checkpointing.in_flight_bound: the tables' shards do not depend on the limits)."""
  return checkpointing.in_flight_bound(model.abstract_train_state(model.base_specs))


def restore_saved_model(
  directory: str, model: JobModel, run: checkpointing.RunInfo, step: int | None
) -> Restored:
  """The model of `step`, or of the newest intact step as of now (read-only)."""
  with checkpointing.TrainingCheckpointManager(
    directory, run, read_only=True, in_flight_bytes=in_flight_bytes(model), **CONFIG_RULES
  ) as mngr:
    restored = JobCheckpoints(mngr, model).restore_model(step)
  if restored is None:
    raise ValueError(f"no checkpoint in '{directory}'")
  return restored


def _newest_saved_config(workdir: str) -> Any:
  """The config of the newest checkpoint of `workdir`; None without one.

  Whether there is a checkpoints folder is process 0's answer on every process:
  Orbax's managers open together (their barriers), and another process may
  already have made the folder for its own manager. Each process looked for
  itself, and a process that came later opened a reader while the others opened
  the job's manager ("sync_global_devices name mismatch", seen in CI).
  """
  directory = os.path.join(os.path.abspath(workdir), checkpointing.CHECKPOINTS_DIRNAME)
  found = os.path.isdir(directory)
  if jax.process_count() > 1:
    found = bool(multihost_utils.broadcast_one_to_all(np.int32(found)))
  if not found:
    return None
  try:
    return saved_job(workdir, None).config
  except ValueError:  # no checkpoint yet, or one that restore will name
    return None


def resolve_job_defaults(config: Any, workdir: str, mesh: Any) -> None:
  """Sets the fields whose default is "as the job was saved" to what the job runs
  with, recorded so in its checkpoints: config.pipelining (a bool),
  data.shuffle_window and synthetic.examples_per_record (config/packing.py), and
  an unset num_steps (config/config_specs.py, resolve_run_length).

  "auto" pipelining keeps the mode of the job's newest checkpoint, so a job
  resumes with the step (and the checkpoint layout) it was saved with; a
  fresh job takes `pipeline.pipelining_pays_off` for its devices. An
  explicit value that differs from the saved one is refused at restore, as
  a changed config.
  """
  saved = _newest_saved_config(workdir)
  saved_mode = None if saved is None else pipelining_choice(saved.get("pipelining", True))
  mode = resolve_pipelining(config.pipelining, mesh.devices.flat[0].platform, mesh.size, saved_mode)
  with config.ignore_type():
    config.pipelining = mode
  packing.resolve_saved_packing(config, saved)
  config_specs.resolve_run_length(config, saved)

"""One Orbax CheckpointManager for the whole training state.

Each step directory holds four items, each bound to one handler type:

  arrays          PyTree     {"train_state": dense params, ZeRO optimizer
                             shards, step; "embeddings": stacked tables and
                             optimizer slots; "pipeline_state": the
                             PipelineState} (step_items.py: one item, so a
                             save starts Orbax's per-item work once)
  data_iter       Grain      one JSON iterator state per process
  fdo             JsonSave   FDO limits per stack and statistics
  metadata        MetadataHandler  JSON: RunInfo, LoopPosition, feature limits,
                                   digests of the JSON items, and one file of
                                   partial array fingerprints per process

Steps of format 2 (one Orbax item per array part) are still restored.

Saves are asynchronous: the loop blocks only while Orbax copies the arrays
to the host (saving.py; the data iterator's read-ahead is paused meanwhile);
the files are written and the fingerprints summed in the background. Orbax
decides which steps to save (save_interval_steps, and the preemption sync
point under jax.distributed) and keeps the newest `keep_latest` steps.
`close()` (or leaving the `with` block) waits for the last save: a process
that exits without it loses that step.

Restore (restore/reader.py) takes the newest intact step: a step with a missing
item or an unreadable or garbled file is skipped, and once an older step is
restored it is renamed `<step>.corrupt`, with one warning line naming the
step, the item and the reason (corrupt.py).
`<step>.orbax-checkpoint-tmp` directories of interrupted saves are ignored
(and deleted when a writable manager opens). A step written by an
incompatible run, or for another dataset, is refused
(IncompatibleCheckpointError), never skipped or renamed. A read-only
manager (`read_only=True`, for readers beside a running job) saves,
renames and deletes nothing. A writable manager checks when it opens that
it can write its directory (check_writable): Orbax would find out only at
the first save, in its background thread, and wait minutes for it.
"""

from __future__ import annotations

import functools
import logging as std_logging
import os
import tempfile
from typing import Any, Iterable, Mapping, Sequence

import grain
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from sparsepipe.checkpointing.integrity import corrupt
from sparsepipe.checkpointing import empty_arrays
from sparsepipe.checkpointing import saving
from sparsepipe.checkpointing.checkpoint_errors import CorruptCheckpointError
from sparsepipe.checkpointing.checkpoint_errors import StepNotKeptError
from sparsepipe.checkpointing.checkpoint_errors import UnwritableCheckpointDirectoryError
from sparsepipe.checkpointing.handlers import array_handler
from sparsepipe.checkpointing.handlers import DATA_FILE_MB
from sparsepipe.checkpointing.handlers import MetadataHandler
from sparsepipe.checkpointing.metadata import CheckpointMetadata
from sparsepipe.checkpointing.metadata import FeatureLimits
from sparsepipe.checkpointing.metadata import LoopPosition
from sparsepipe.checkpointing.metadata import RunInfo
from sparsepipe.checkpointing.restore.relayout import Relayout
from sparsepipe.checkpointing.restore.relayout import resize_zero_padded
from sparsepipe.checkpointing.restore.reader import StepReader
from sparsepipe.checkpointing.restore.reader import Targets
from sparsepipe.checkpointing.step_items import ARRAY_ITEMS
from sparsepipe.checkpointing.step_items import RestoredState
from sparsepipe.checkpointing.step_items import RestoreTargets
from sparsepipe.checkpointing.step_items import CheckpointItems
from sparsepipe.checkpointing.step_items import ARRAYS

# Re-laid out by default when the device count changes (ZeRO padding only).
DEFAULT_RELAYOUTS: Mapping[str, Relayout] = {"train_state": resize_zero_padded}


class _ReadOnlyNotices(std_logging.Filter):
  """Drops Orbax's warnings that a read-only manager's directory is read-only, and
  that a step's metadata file does not exist: a running job deletes its old steps
  while a reader (evaluate, export) lists them, and a step the reader cannot read
  is named in its own words (a corrupt step's warning, or the next newest read)."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    message = record.getMessage()
    return not message.startswith(("Given directory is read only", "Metadata file does not exist"))


_READ_ONLY_NOTICE = _ReadOnlyNotices()


def _options(interval: int, keep_latest: int, async_save: bool, read_only: bool):
  policies = ocp.checkpoint_managers
  if read_only:
    # Nothing created, saved, deleted or cleaned up: another process (the
    # training job) may be writing this directory.
    return ocp.CheckpointManagerOptions(
      read_only=True, save_interval_steps=0, max_to_keep=None, create=False
    )
  return ocp.CheckpointManagerOptions(
    # Every `interval` steps, and at JAX's preemption sync point; unlike
    # Orbax's default policy, no extra save of a fresh run's first step.
    save_decision_policy=policies.AnySavePolicy(
      [
        policies.FixedIntervalPolicy(interval),
        policies.PreemptionCheckpointingPolicy(),
      ]
    ),
    preservation_policy=policies.LatestN(keep_latest),
    enable_async_checkpointing=async_save,
    cleanup_tmp_directories=True,
    create=True,
  )


def check_writable(directory: str) -> None:
  """Creates `directory` if needed and a directory in it (removed at once), as a save
  does; UnwritableCheckpointDirectoryError naming it if that fails.

  A real attempt, not os.access: for root, access() says yes to a directory
  without write permission bits, and root's writes still fail on a read-only
  file system or in sysfs.
  """
  try:
    os.makedirs(directory, exist_ok=True)
    os.rmdir(tempfile.mkdtemp(prefix=".write-check-", dir=directory))
  except OSError as e:
    reason = e.strerror or type(e).__name__
    raise UnwritableCheckpointDirectoryError(
      f"the checkpoint directory '{directory}' cannot be written ({reason}): no checkpoint"
      " could be saved there; make it writable, or use another directory"
    ) from None


class TrainingCheckpointManager:
  """Saves and restores CheckpointItems steps in one directory.

  Call every method on every process. Use as a context manager, or call
  close(), so that the last asynchronous save completes before exit.
  """

  def __init__(
    self,
    directory: str | os.PathLike[str],
    run: RunInfo,
    *,
    save_interval_steps: int = 1,
    keep_latest: int = 3,
    async_save: bool = True,
    mutable_config_keys: Iterable[str] = (),
    added_config_keys: Mapping[str, Any] | None = None,
    path_config_keys: Iterable[str] = (),
    fingerprint_arrays: bool = True,
    read_only: bool = False,
    host_copy_gb: float = 0.0,
    in_flight_bytes: int | None = None,
    data_file_mb: float = DATA_FILE_MB,
  ):
    """Opens (or creates) the checkpoint directory; a writable one is checked
    to be writable (UnwritableCheckpointDirectoryError).

    Args:
      directory: checkpoint root; made absolute (Orbax needs it absolute).
      run: this run's RunInfo, written into every step and compared with the
        saved one on restore.
      save_interval_steps: save() saves steps that are multiples of this
        unless forced.
      keep_latest: number of newest steps kept (LatestN).
      async_save: write in a background thread (the default).
      mutable_config_keys: fnmatch patterns of dotted config keys that may
        differ on resume, e.g. ("config.num_steps", "config.checkpoint.*").
      added_config_keys: dotted config keys added after steps were saved ->
        the value that means what those steps did; a saved config without
        the key is taken to have it (metadata.config_differences).
      path_config_keys: dotted config keys of paths, the same when they name
        the same place (a step saved with a relative path, resumed with it
        made absolute).
      fingerprint_arrays: store a fingerprint of every saved array so that
        garbled data files are detected on restore (Orbax would restore
        them silently). Summed from Orbax's host copies in the background:
        one extra read of the state on the host per save, none while the
        loop waits. Steps saved without are restored unverified.
      read_only: only read: save() raises, a corrupt step is skipped but not
        renamed, and the `*.orbax-checkpoint-tmp` directories of saves in
        progress are left alone (a writable manager deletes them when it
        opens). For readers of a directory a running job writes to, e.g.
        launch.evaluate.
      host_copy_gb: > 0: a save copies device arrays to the host in batches
        of about this many GB, each written before the next is copied
        (handlers.array_handler); 0: all at once.
      in_flight_bytes: the most bytes a save writes, or a restore reads, at
        once (handlers.in_flight_bound); None: no bound.
      data_file_mb: the size of a save's data files in MiB, which bounds the
        host memory a save's writes hold (handlers.array_save).
    """
    if save_interval_steps < 1:
      raise ValueError(f"save_interval_steps={save_interval_steps} must be >= 1")
    if keep_latest < 1:
      raise ValueError(f"keep_latest={keep_latest} must be >= 1")
    if not host_copy_gb >= 0:
      raise ValueError(f"host_copy_gb={host_copy_gb} must be >= 0 (0: no bound)")
    if not data_file_mb >= 1:  # Orbax warns of chunks under 1 MiB
      raise ValueError(f"data_file_mb={data_file_mb} must be >= 1 (MiB)")
    self._run = run
    self._async = bool(async_save)
    self._fingerprint_arrays = bool(fingerprint_arrays)
    self._read_only = bool(read_only)
    self._data_file_mb = float(data_file_mb)
    # ARRAY_ITEMS: the Orbax items of format 2 and older, to read those steps.
    handlers = {
      name: array_handler(float(host_copy_gb), in_flight_bytes) for name in (ARRAYS,) + ARRAY_ITEMS
    }
    handlers.update(
      data_iter=grain.checkpoint.CheckpointHandler(),
      fdo=ocp.JsonCheckpointHandler(),
      metadata=MetadataHandler(),
    )
    directory = os.path.abspath(os.fspath(directory))
    if self._read_only:
      std_logging.getLogger("absl").addFilter(_READ_ONLY_NOTICE)  # once: same object
    else:
      check_writable(directory)  # now, not at the first save (module doc)
    self._mngr = ocp.CheckpointManager(
      epath.Path(directory),
      options=_options(int(save_interval_steps), int(keep_latest), self._async, self._read_only),
      item_handlers=handlers,
    )
    self._reader = StepReader(
      self._mngr, run, tuple(mutable_config_keys), added_config_keys, tuple(path_config_keys)
    )

  # -- inspection -------------------------------------------------------------

  @property
  def directory(self) -> epath.Path:
    return self._mngr.directory

  @property
  def run(self) -> RunInfo:
    return self._run

  def all_steps(self) -> list[int]:
    """Finished steps, oldest first (interrupted and corrupt ones excluded)."""
    return sorted(self._mngr.all_steps())

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def where(self, step: int) -> str:
    return self._reader.where(step)

  def read_metadata(self, step: int) -> CheckpointMetadata:
    """The saved CheckpointMetadata of `step` (checked against its digest)."""
    self._require_kept(step)
    return CheckpointMetadata.from_json(self._reader.sealed_metadata(step), self.where(step))

  # -- saving -----------------------------------------------------------------

  def should_save(self, step: int) -> bool:
    """Whether save() saves `step` without force (Orbax's save decision).

    True for multiples of save_interval_steps after the newest saved step,
    and at JAX's preemption sync point (with jax.distributed).
    """
    return self._mngr.should_save(step)

  def save(
    self,
    step: int,
    state: CheckpointItems,
    progress: LoopPosition,
    *,
    feature_limits: FeatureLimits | None = None,
    training_data: Mapping[str, Any] | None = None,
    force: bool = False,
  ) -> bool:
    """Starts saving `state` as `step`; returns whether a save started.

    Without `force`, only the steps of should_save() are saved. A step that
    already exists is never overwritten (returns False): e.g. a preemption
    save right after a regular save of that step. `training_data`: the
    trained dataset's manifest JSON, kept in the step's metadata
    (CheckpointMetadata.training_data).
    """
    if self._read_only:
      raise ValueError(f"{self.directory} was opened read-only; step {step} not saved")
    if step in self._mngr.all_steps():
      logging.info("%s already exists; not saved again", self.where(step))
      return False
    if not force and not self.should_save(step):
      return False
    saving.save_step(
      lambda args: self._mngr.save(step, args=args, force=True),
      empty_arrays.strip_items(state),
      self._run,
      progress,
      feature_limits=feature_limits,
      training_data=training_data,
      fingerprints=self._fingerprint_arrays,
      async_save=self._async,
      data_file_mb=self._data_file_mb,
    )
    return True

  def reached_preemption(self, step: int) -> bool:
    """JAX's preemption sync point (only with jax.distributed initialized)."""
    return self._mngr.reached_preemption(step)

  def wait_until_finished(self) -> None:
    self._mngr.wait_until_finished()

  def saving_in_progress(self) -> bool:
    """Whether an asynchronous save is still writing."""
    return self._mngr.is_saving_in_progress()

  def close(self) -> None:
    """Waits for the last save and releases the manager."""
    self._mngr.wait_until_finished()
    self._mngr.close()

  def __enter__(self) -> "TrainingCheckpointManager":
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()

  # -- restoring --------------------------------------------------------------

  def _require_kept(self, step: int) -> None:
    """StepNotKeptError naming the steps there are, if `step` is not one of them."""
    if self._reader.step_path(step).exists():
      return
    kept = ", ".join(map(str, sorted(self.all_steps()))) or "none"
    raise StepNotKeptError(
      f"{self.directory} holds no step {step}: the steps kept are {kept} (a job keeps its"
      " newest checkpoint.keep steps)"
    )

  def _unless_deleted(self, step: int, error: CorruptCheckpointError) -> CorruptCheckpointError:
    """`error`, or that `step` was deleted while it was read (not corruption)."""
    if self._reader.step_path(step).exists():
      return error
    return CorruptCheckpointError(
      f"{self.where(step)} was deleted while it was read (a job writing this"
      " directory keeps only its newest steps)"
    )

  def restore(
    self,
    targets: Targets,
    *,
    step: int | None = None,
    relayouts: Mapping[str, Relayout] | None = None,
    items: Sequence[str] = ARRAY_ITEMS,
  ) -> RestoredState | None:
    """Restores `step`, or the newest intact step; None if there is none.

    Args:
      targets: abstract trees with the current shardings and the iterator,
        or a function of the step's saved CheckpointMetadata returning them
        (when shapes depend on what was saved, e.g. FDO limits: it is called
        for each step tried, after its metadata was read and checked).
      step: a specific step (a corrupt one raises instead of falling back).
      relayouts: per item, how to convert it from another device count;
        merged over DEFAULT_RELAYOUTS ("embeddings" needs one, e.g.
        embedding_relayout).
      items: the array items to read (the others come back None; their
        targets may be None), e.g. ("train_state", "embeddings") to
        evaluate or export a step without its PipelineState.

    Raises:
      IncompatibleCheckpointError: the newest intact step was written by an
        incompatible run (config, counts, mesh, dataset, or a layout that
        cannot follow the device count).
      CorruptCheckpointError: no step could be read.
      StepNotKeptError: `step` is not in the directory.
    """
    relayouts = {**DEFAULT_RELAYOUTS, **(relayouts or {})}
    if step is not None:
      self._require_kept(step)
    steps = [step] if step is not None else sorted(self.all_steps(), reverse=True)
    if not steps:
      return None
    chosen: list[RestoreTargets] = []

    def read_targets(meta: CheckpointMetadata) -> RestoreTargets:
      chosen.append(targets(meta) if callable(targets) else targets)
      return empty_arrays.strip_items(chosen[-1])

    skipped: list[tuple[int, str]] = []
    for candidate in steps:
      try:
        restored = corrupt.agree(
          functools.partial(self._reader.restore, candidate, read_targets, relayouts, items)
        )
      except CorruptCheckpointError as e:
        error = self._unless_deleted(candidate, e)
        if step is not None:
          raise error
        skipped.append((candidate, str(error)))
        logging.info("Cannot restore %s", e)
        continue
      if skipped:
        corrupt.quarantine(self.directory, skipped, rename=not self._read_only)
        self._mngr.reload()
      return empty_arrays.refill_items(restored, chosen[-1])
    raise CorruptCheckpointError(
      f"no restorable checkpoint in {self.directory}: " + "; ".join(reason for _, reason in skipped)
    )

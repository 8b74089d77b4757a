"""One Orbax CheckpointManager for the whole training state.

Each step directory holds six items, each bound to one handler type:

  train_state     StandardSave  dense params, ZeRO optimizer shards, step
  embeddings      StandardSave  stacked tables and optimizer slots
  pipeline_state  StandardSave  the PipelineState (buffered inputs, ...)
  data_iter       Grain         one JSON iterator state per process
  fdo             JsonSave      FDO limits per stack and statistics
  metadata        MetadataHandler  JSON: RunInfo, Progress, feature limits,
                                   fingerprints and digests of every item

Saves are asynchronous: the loop blocks while the arrays are copied to the
host and their fingerprints are computed (one extra read of the state on the
devices; `fingerprint_arrays=False` skips it), the files are written in the
background. Saves happen every `save_interval_steps` steps or when forced
(preemption, end of training); the newest `keep_latest` steps are kept
(preservation_policy LatestN). `close()` (or leaving the `with` block) waits
for the last save: a process that exits without it loses that step.

Restore reads every array straight into the sharding of its target
(ShapeDtypeStructs built for the current mesh). It takes the newest step
that is intact: a step with a missing item, an unreadable or garbled file
(fingerprints and digests are checked after reading) is skipped with a
warning, and once an older step is restored the skipped directories are
renamed `<step>.corrupt` (kept, never deleted) so that new saves of those
step numbers do not collide with them. `<step>.orbax-checkpoint-tmp`
directories of interrupted saves are ignored. A step written by an
incompatible run is refused (IncompatibleCheckpointError), never skipped.

When the device count changed, arrays are read in their saved shapes onto
the current devices and re-laid out (relayout.py); a PipelineState is
restored only if the device count is unchanged, and otherwise only a
drained one is accepted (then `RestoredState.pipeline_state` is None and the
caller starts a fresh PipelineState).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from sparsepipe.checkpointing import fingerprint
from sparsepipe.checkpointing import integrity
from sparsepipe.checkpointing.errors import CorruptCheckpointError
from sparsepipe.checkpointing.errors import IncompatibleCheckpointError
from sparsepipe.checkpointing.handlers import MetadataHandler
from sparsepipe.checkpointing.handlers import MetadataRestore
from sparsepipe.checkpointing.handlers import MetadataSave
from sparsepipe.checkpointing.metadata import CheckpointMetadata
from sparsepipe.checkpointing.metadata import check_compatible
from sparsepipe.checkpointing.metadata import check_pipeline_resumable
from sparsepipe.checkpointing.metadata import FeatureLimits
from sparsepipe.checkpointing.metadata import Progress
from sparsepipe.checkpointing.metadata import RunInfo
from sparsepipe.checkpointing.metadata import to_json_value
from sparsepipe.checkpointing.relayout import Relayout
from sparsepipe.checkpointing.relayout import RelayoutContext
from sparsepipe.checkpointing.relayout import resize_zero_padded
from sparsepipe.checkpointing.targets import check_against_saved
from sparsepipe.checkpointing.targets import check_restored
from sparsepipe.checkpointing.targets import require_shardings
from sparsepipe.checkpointing.targets import saved_layout_targets

ARRAY_ITEMS = ("train_state", "embeddings", "pipeline_state")
ITEM_NAMES = ARRAY_ITEMS + ("data_iter", "fdo", "metadata")

# Re-laid out by default when the device count changes (ZeRO padding only).
DEFAULT_RELAYOUTS: Mapping[str, Relayout] = {"train_state": resize_zero_padded}

CORRUPT_SUFFIX = ".corrupt"


class TrainingState(NamedTuple):
  """Everything saved at a step.

  Attributes:
    train_state: pytree of arrays (dense params, ZeRO optimizer shards, step).
    embeddings: pytree of arrays ({stack: EmbeddingVariables}).
    pipeline_state: pytree of arrays (the PipelineState).
    data_iter: the Grain iterator (its get_state() is saved, per process).
    fdo: JSON object: FDO limits per stack and statistics.
  """

  train_state: Any
  embeddings: Any
  pipeline_state: Any
  data_iter: Any
  fdo: Mapping[str, Any]


class RestoreTargets(NamedTuple):
  """Abstract trees (ShapeDtypeStructs with the current shardings) and the
  freshly built Grain iterator that receives the saved iterator state."""

  train_state: Any
  embeddings: Any
  pipeline_state: Any
  data_iter: Any


class RestoredState(NamedTuple):
  """A restored step.

  Attributes:
    step: the restored step number.
    train_state, embeddings: trees laid out like their targets.
    pipeline_state: the restored PipelineState, or None when the device count
      changed and the saved pipeline was drained (start a fresh one).
    data_iter: the target iterator, now positioned after the saved batches.
    fdo: the saved FDO JSON object.
    metadata: the saved CheckpointMetadata (Progress, feature limits, ...).
    relaid_out: names of the items that were re-laid out.
  """

  step: int
  train_state: Any
  embeddings: Any
  pipeline_state: Any
  data_iter: Any
  fdo: dict[str, Any]
  metadata: CheckpointMetadata
  relaid_out: tuple[str, ...]


def _iterator_state(iterator: Any) -> Any:
  """The iterator's state as the JSON value Grain's handler writes."""
  state = iterator.get_state()
  if isinstance(state, bytes):  # DataLoader iterators
    state = json.loads(state.decode())
  return state


def _gather_digests(*digests: str) -> list[list[str]]:
  """For each given hex sha256, every process's value, in process order."""
  if jax.process_count() == 1:
    return [[d] for d in digests]
  words = np.concatenate(
      [np.frombuffer(bytes.fromhex(d), dtype=np.uint32) for d in digests]
  )
  rows = np.asarray(multihost_utils.process_allgather(words), np.uint32)
  per = len(words) // len(digests)
  return [
      [row[i * per : (i + 1) * per].tobytes().hex() for row in rows]
      for i in range(len(digests))
  ]


def _first_line(error: BaseException, limit: int = 400) -> str:
  """`Type: first line` of an error, without TensorStore's long spec dump."""
  lines = str(error).strip().splitlines()
  text = lines[0].split(" [tensorstore_spec=")[0] if lines else ""
  if len(text) > limit:
    text = text[: limit - 3] + "..."
  return f"{type(error).__name__}: {text}"


class TrainingCheckpointManager:
  """Saves and restores TrainingState steps in one directory.

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
      fingerprint_arrays: bool = True,
  ):
    """Opens (or creates) the checkpoint directory.

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
      fingerprint_arrays: store a fingerprint of every saved array so that
        garbled data files are detected on restore (Orbax would restore
        them silently). Costs one extra read of the state on the devices
        per save: negligible on accelerators, but on a CPU-only host it
        is most of the time an async save blocks the loop (see
        benchmarks/checkpoint.py). Steps saved without are restored
        unverified.
    """
    if save_interval_steps < 1:
      raise ValueError(f"save_interval_steps={save_interval_steps} must be >= 1")
    if keep_latest < 1:
      raise ValueError(f"keep_latest={keep_latest} must be >= 1")
    self._directory = epath.Path(os.path.abspath(os.fspath(directory)))
    self._run = run
    self._interval = int(save_interval_steps)
    self._mutable = tuple(mutable_config_keys)
    self._fingerprint_arrays = bool(fingerprint_arrays)
    options = ocp.CheckpointManagerOptions(
        preservation_policy=ocp.checkpoint_managers.LatestN(keep_latest),
        enable_async_checkpointing=async_save,
        cleanup_tmp_directories=True,
        create=True,
    )
    handlers = {name: ocp.StandardCheckpointHandler() for name in ARRAY_ITEMS}
    handlers.update(
        data_iter=grain.checkpoint.CheckpointHandler(),
        fdo=ocp.JsonCheckpointHandler(),
        metadata=MetadataHandler(),
    )
    self._mngr = ocp.CheckpointManager(
        self._directory, options=options, item_handlers=handlers
    )

  # -- inspection -------------------------------------------------------------

  @property
  def directory(self) -> epath.Path:
    return self._directory

  @property
  def run(self) -> RunInfo:
    return self._run

  def all_steps(self) -> list[int]:
    """Finished steps, oldest first (interrupted and corrupt ones excluded)."""
    return sorted(self._mngr.all_steps())

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def where(self, step: int) -> str:
    return f"checkpoint at {self._directory} step {step}"

  def read_metadata(self, step: int) -> CheckpointMetadata:
    """The saved CheckpointMetadata of `step` (checked against its digest)."""
    return CheckpointMetadata.from_json(self._read_sealed_metadata(step), self.where(step))

  # -- saving -----------------------------------------------------------------

  def should_save(self, step: int) -> bool:
    """True for the steps that save() saves without force."""
    return step % self._interval == 0

  def save(
      self,
      step: int,
      state: TrainingState,
      progress: Progress,
      *,
      feature_limits: FeatureLimits | None = None,
      force: bool = False,
  ) -> bool:
    """Starts saving `state` as `step`; returns whether a save started.

    Without `force`, only steps that are multiples of save_interval_steps
    are saved. A step that already exists is never overwritten (returns
    False): e.g. a preemption save right after a regular save of that step.
    """
    if not force and not self.should_save(step):
      return False
    if step in self._mngr.all_steps():
      logging.info("%s already exists; not saved again", self.where(step))
      return False
    if not isinstance(state.fdo, Mapping):
      raise ValueError(
          f"item 'fdo' must be a JSON object (dict), got {type(state.fdo).__name__}"
      )
    fingerprints = None
    if self._fingerprint_arrays:
      fingerprints = {
          item: fingerprint.tree_fingerprints(getattr(state, item), item)
          for item in ARRAY_ITEMS
      }
    fdo = to_json_value(state.fdo, "fdo")
    meta = CheckpointMetadata(
        self._run, progress, to_json_value(feature_limits or {}, "feature_limits")
    ).to_json()
    data_iter_digests, fdo_digests = _gather_digests(
        integrity.digest(_iterator_state(state.data_iter)), integrity.digest(fdo)
    )
    differing = [i for i, d in enumerate(fdo_digests) if d != fdo_digests[0]]
    if differing:
      raise ValueError(
          f"item 'fdo' differs between processes ({differing} differ from"
          " process 0); it is written once, by process 0: merge FDO state"
          " across processes before saving"
      )
    meta["integrity"] = {
        "fingerprints": fingerprints,
        "fdo_sha256": fdo_digests[0],
        "data_iter_sha256": data_iter_digests,
    }
    args = {item: ocp.args.StandardSave(getattr(state, item)) for item in ARRAY_ITEMS}
    args.update(
        data_iter=grain.checkpoint.CheckpointSave(state.data_iter),
        fdo=ocp.args.JsonSave(fdo),
        metadata=MetadataSave(meta),
    )
    self._mngr.save(step, args=ocp.args.Composite(**args), force=True)
    return True

  def reached_preemption(self, step: int) -> bool:
    """JAX's preemption sync point (only with jax.distributed initialized)."""
    return self._mngr.reached_preemption(step)

  def wait_until_finished(self) -> None:
    self._mngr.wait_until_finished()

  def close(self) -> None:
    """Waits for the last save and releases the manager."""
    self._mngr.wait_until_finished()
    self._mngr.close()

  def __enter__(self) -> "TrainingCheckpointManager":
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()

  # -- restoring --------------------------------------------------------------

  def restore(
      self,
      targets: RestoreTargets | Callable[[CheckpointMetadata], RestoreTargets],
      *,
      step: int | None = None,
      relayouts: Mapping[str, Relayout] | None = None,
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
        relayout.embedding_relayout).

    Raises:
      IncompatibleCheckpointError: the newest intact step was written by an
        incompatible run (config, counts, mesh, or a layout that cannot
        follow the device count).
      CorruptCheckpointError: no step could be read.
    """
    relayouts = {**DEFAULT_RELAYOUTS, **(relayouts or {})}
    steps = [step] if step is not None else sorted(self.all_steps(), reverse=True)
    if not steps:
      return None
    skipped: list[tuple[int, str]] = []
    for candidate in steps:
      try:
        restored = self._agree(lambda: self._restore_step(candidate, targets, relayouts))
      except CorruptCheckpointError as e:
        if step is not None:
          raise
        skipped.append((candidate, str(e)))
        logging.warning("Skipping %s", e)
        continue
      self._quarantine([s for s, _ in skipped])
      return restored
    raise CorruptCheckpointError(
        f"no restorable checkpoint in {self._directory}: "
        + "; ".join(reason for _, reason in skipped)
    )

  def _agree(self, attempt):
    """Runs `attempt` on every process; corrupt anywhere means corrupt everywhere."""
    try:
      result, reason = attempt(), ""
    except CorruptCheckpointError as e:
      result, reason = None, str(e)
    if jax.process_count() > 1:
      ok = multihost_utils.process_allgather(np.int32(not reason))
      failed = [i for i, v in enumerate(np.asarray(ok).ravel()) if not v]
      if failed and not reason:
        reason = f"processes {failed} could not read the checkpoint"
    if reason:
      raise CorruptCheckpointError(reason)
    return result

  def _read_sealed_metadata(self, step: int) -> dict[str, Any]:
    where = self.where(step)
    try:
      raw = self._mngr.restore(
          step, args=ocp.args.Composite(metadata=MetadataRestore())
      )["metadata"]
    except Exception as e:  # pylint: disable=broad-except
      raise CorruptCheckpointError(
          f"{where}: item 'metadata' is unreadable ({_first_line(e)})"
      ) from e
    return integrity.unseal(raw, what="item 'metadata'", where=where)

  def _check_data_iter_file(self, step: int, digests: Any) -> None:
    where = self.where(step)
    index, count = jax.process_index(), jax.process_count()
    path = self._directory / str(step) / "data_iter" / f"process_{index}-of-{count}.json"
    if not isinstance(digests, list) or len(digests) != count:
      raise CorruptCheckpointError(f"{where}: metadata data_iter_sha256 is malformed")
    try:
      state = json.loads(path.read_text())
    except Exception as e:  # pylint: disable=broad-except
      raise CorruptCheckpointError(
          f"{where}: item 'data_iter' file {path.name} is unreadable"
          f" ({_first_line(e)})"
      ) from e
    integrity.check_digest(
        state, digests[index], what=f"item 'data_iter' file {path.name}", where=where
    )

  def _restore_step(
      self,
      step: int,
      targets: RestoreTargets | Callable[[CheckpointMetadata], RestoreTargets],
      relayouts: Mapping[str, Relayout],
  ) -> RestoredState:
    where = self.where(step)
    step_dir = self._directory / str(step)
    missing = [name for name in ITEM_NAMES if not (step_dir / name).is_dir()]
    if missing:
      raise CorruptCheckpointError(f"{where}: item(s) {missing} missing")
    body = self._read_sealed_metadata(step)
    meta = CheckpointMetadata.from_json(body, where)
    check_compatible(meta, self._run, where=where, mutable_config_keys=self._mutable)
    checks = body.get("integrity")
    if not isinstance(checks, dict) or not {
        "fingerprints", "fdo_sha256", "data_iter_sha256"
    } <= set(checks):
      raise CorruptCheckpointError(f"{where}: metadata has no integrity section")

    relaid = meta.run.device_count != self._run.device_count
    items = list(ARRAY_ITEMS)
    if relaid:
      check_pipeline_resumable(meta, self._run, where=where)
      items.remove("pipeline_state")  # drained: the caller starts afresh
      for item in items:
        if item not in relayouts:
          raise IncompatibleCheckpointError(
              f"{where}: item '{item}' was saved for"
              f" {meta.run.device_count} devices and the current mesh has"
              f" {self._run.device_count}; its layout depends on the device"
              " count and no relayout was given for it (pass"
              f" relayouts={{'{item}': ...}}, e.g. embedding_relayout)"
          )
    if callable(targets):
      targets = targets(meta)
    for item in items:
      require_shardings(getattr(targets, item), item=item)

    try:
      saved_trees = self._mngr.item_metadata(step)
    except Exception as e:  # pylint: disable=broad-except
      raise CorruptCheckpointError(
          f"{where}: array metadata is unreadable ({_first_line(e)})"
      ) from e
    read_targets = {}
    for item in items:
      target, saved_tree = getattr(targets, item), saved_trees[item]
      if saved_tree is None:
        raise CorruptCheckpointError(f"{where}: item '{item}' has no array metadata")
      check_against_saved(
          target, saved_tree, item=item, where=where, compare_shapes=not relaid
      )
      read_targets[item] = (
          saved_layout_targets(target, saved_tree, item=item) if relaid else target
      )

    self._check_data_iter_file(step, checks["data_iter_sha256"])
    args = {item: ocp.args.StandardRestore(read_targets[item]) for item in items}
    args.update(
        data_iter=grain.checkpoint.CheckpointRestore(targets.data_iter),
        fdo=ocp.args.JsonRestore(),
    )
    try:
      out = self._mngr.restore(step, args=ocp.args.Composite(**args))
    except Exception as e:  # pylint: disable=broad-except
      item = self._unreadable_item(step, {i: args[i] for i in items})
      raise CorruptCheckpointError(f"{where}: {item}reading failed ({_first_line(e)})") from e
    if checks["fingerprints"] is None:
      logging.info("%s was saved without array fingerprints: not verified", where)
    else:
      for item in items:
        expected = checks["fingerprints"].get(item)
        if not isinstance(expected, dict):
          raise CorruptCheckpointError(f"{where}: no fingerprints for item '{item}'")
        fingerprint.verify(out[item], expected, item=item, where=where)
    integrity.check_digest(out["fdo"], checks["fdo_sha256"], what="item 'fdo'", where=where)

    trees = {}
    for item in items:
      tree = out[item]
      if relaid:
        context = RelayoutContext(item, where, meta, self._run)
        tree = relayouts[item](tree, getattr(targets, item), context)
        check_restored(tree, getattr(targets, item), item=item, where=where)
      trees[item] = tree
    logging.info(
        "Restored %s%s", where,
        f" (re-laid out {items} from {meta.run.device_count} to"
        f" {self._run.device_count} devices)" if relaid else "",
    )
    return RestoredState(
        step=step,
        train_state=trees["train_state"],
        embeddings=trees["embeddings"],
        pipeline_state=trees.get("pipeline_state"),
        data_iter=targets.data_iter,
        fdo=out["fdo"],
        metadata=meta,
        relaid_out=tuple(items) if relaid else (),
    )

  def _unreadable_item(self, step: int, args: Mapping[str, Any]) -> str:
    """"item 'X': " for the first array item that fails to read alone, else "".

    Only called after a failed restore, to name what is broken.
    """
    for item, arg in args.items():
      try:
        self._mngr.restore(step, args=ocp.args.Composite(**{item: arg}))
      except Exception:  # pylint: disable=broad-except
        return f"item '{item}': "
    return ""

  def _quarantine(self, steps: list[int]) -> None:
    """Renames skipped corrupt steps to `<step>.corrupt[.k]` (kept on disk)."""
    if not steps:
      return
    if jax.process_index() == 0:
      for step in steps:
        source = self._directory / str(step)
        if not source.exists():
          continue
        target = self._directory / f"{step}{CORRUPT_SUFFIX}"
        k = 1
        while target.exists():
          k += 1
          target = self._directory / f"{step}{CORRUPT_SUFFIX}.{k}"
        source.rename(target)
        logging.warning("Moved corrupt checkpoint step %d to %s", step, target)
    multihost_utils.sync_global_devices("sparsepipe_checkpoint_quarantine")
    self._mngr.reload()

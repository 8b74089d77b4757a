"""The restore path: read one step, check it, re-lay it out if needed.

Every array is read straight into the sharding of its target. Before
anything is read, the step's metadata is checked against the current run
(IncompatibleCheckpointError) and the targets against Orbax's array
metadata; after reading, the arrays' fingerprints and the JSON items'
digests are compared with the saved ones (CorruptCheckpointError). When the
device count changed, arrays are read in their saved shapes and re-laid out
(relayout.py); a PipelineState only if it was drained.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Sequence

import grain
import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from sparsepipe.checkpointing.integrity import fingerprint
from sparsepipe.checkpointing.integrity import host_fingerprint
from sparsepipe.checkpointing.integrity import digests as integrity
from sparsepipe.checkpointing import step_items
from sparsepipe.checkpointing.integrity.corrupt import first_line
from sparsepipe.checkpointing.integrity.corrupt import quiet_reads
from sparsepipe.checkpointing.checkpoint_errors import CorruptCheckpointError
from sparsepipe.checkpointing.restore.iterator_states import data_iter_filename
from sparsepipe.checkpointing.restore.iterator_states import restore_resized_iterator
from sparsepipe.checkpointing.checkpoint_errors import IncompatibleCheckpointError
from sparsepipe.checkpointing.handlers import array_restore
from sparsepipe.checkpointing.handlers import fingerprint_filename
from sparsepipe.checkpointing.handlers import MetadataRestore
from sparsepipe.checkpointing.metadata import check_compatible
from sparsepipe.checkpointing.metadata import CheckpointMetadata
from sparsepipe.checkpointing.metadata import RunInfo
from sparsepipe.checkpointing.restore.relayout import Relayout
from sparsepipe.checkpointing.restore.relayout import RelayoutContext
from sparsepipe.checkpointing.saving import PARTIAL_SUMS
from sparsepipe.checkpointing.step_items import ARRAY_ITEMS
from sparsepipe.checkpointing.step_items import RestoredState
from sparsepipe.checkpointing.step_items import RestoreTargets
from sparsepipe.checkpointing.restore.targets import check_against_saved
from sparsepipe.checkpointing.restore.targets import check_restored
from sparsepipe.checkpointing.restore.targets import require_shardings
from sparsepipe.checkpointing.restore.targets import saved_layout_targets
from sparsepipe.transforms import IteratorStateMismatchError

Targets = RestoreTargets | Callable[[CheckpointMetadata], RestoreTargets]


def _read_json(path: epath.Path, what: str, where: str) -> Any:
  try:
    return json.loads(path.read_text())
  except Exception as e:  # pylint: disable=broad-except
    raise CorruptCheckpointError(f"{where}: {what} is unreadable ({first_line(e)})") from e


def _check_dataset(saved_state: Any, iterator: Any, where: str) -> None:
  """IncompatibleCheckpointError if the iterator reads another dataset now."""
  saved = saved_state.get("metadata", {}) if isinstance(saved_state, dict) else {}
  current = getattr(iterator, "metadata", None)
  if not isinstance(saved, dict) or not isinstance(current, Mapping):
    return
  if "dataset" in saved and "dataset" in current and saved["dataset"] != current["dataset"]:
    raise IncompatibleCheckpointError(
      f"{where}: the dataset changed: the data iterator state was saved"
      f" reading dataset {saved['dataset']}, the data now is dataset"
      f" {current['dataset']}; restore with the original data, or train on"
      " the new data in a new workdir (the checkpoint is left as it is)"
    )


class StepReader:
  """Reads and checks steps of one Orbax CheckpointManager for one run."""

  def __init__(
    self,
    mngr: ocp.CheckpointManager,
    run: RunInfo,
    mutable_config_keys: tuple[str, ...],
    added_config_keys: Mapping[str, Any] | None = None,
    path_config_keys: tuple[str, ...] = (),
  ):
    self._mngr = mngr
    self._run = run
    self._mutable = mutable_config_keys
    self._added = dict(added_config_keys or {})
    self._paths = path_config_keys

  def where(self, step: int) -> str:
    return f"checkpoint at {self._mngr.directory} step {step}"

  def step_path(self, step: int) -> epath.Path:
    name_format = ocp.path.step.standard_name_format()
    return ocp.path.step.build_step_path(self._mngr.directory, name_format, step)

  def sealed_metadata(self, step: int) -> dict[str, Any]:
    """The step's metadata JSON, checked against its own digest."""
    where = self.where(step)
    try:
      with quiet_reads():
        raw = self._mngr.restore(step, args=ocp.args.Composite(metadata=MetadataRestore()))
    except Exception as e:  # pylint: disable=broad-except
      raise CorruptCheckpointError(
        f"{where}: item 'metadata' is unreadable ({first_line(e)})"
      ) from e
    return integrity.unseal(raw["metadata"], what="item 'metadata'", where=where)

  def _require_items(self, step: int, names: tuple[str, ...]) -> None:
    missing = [name for name in names if not (self.step_path(step) / name).is_dir()]
    if missing:
      raise CorruptCheckpointError(f"{self.where(step)}: item(s) {missing} missing")

  def _checked_metadata(self, step: int) -> tuple[CheckpointMetadata, dict[str, Any]]:
    where = self.where(step)
    self._require_items(step, ("metadata",))
    body = self.sealed_metadata(step)
    meta = CheckpointMetadata.from_json(body, where)
    self._require_items(step, step_items.orbax_items(meta.format_version))
    check_compatible(
      meta,
      self._run,
      where=where,
      mutable_config_keys=self._mutable,
      added_config_keys=self._added,
      path_config_keys=self._paths,
    )
    checks = body.get("integrity")
    if not isinstance(checks, dict) or not {
      "fingerprints",
      "fdo_sha256",
      "data_iter_sha256",
    } <= set(checks):
      raise CorruptCheckpointError(f"{where}: metadata has no integrity section")
    return meta, checks

  def _items(
    self,
    meta: CheckpointMetadata,
    relayouts: Mapping[str, Relayout],
    where: str,
    wanted: Sequence[str],
  ):
    """The array items to read, of those `wanted`.

    When the device count changed, every item needs a relayout, except a
    drained "pipeline_state" without one, which is left out (the caller
    starts a fresh PipelineState).
    """
    items = [item for item in ARRAY_ITEMS if item in wanted]
    if meta.run.device_count == self._run.device_count:
      return items
    if "pipeline_state" in items and "pipeline_state" not in relayouts:
      if meta.progress.pipeline_drained:
        items.remove("pipeline_state")
    for item in sorted(items, key=lambda item: item != "pipeline_state"):
      if item not in relayouts:
        raise IncompatibleCheckpointError(
          f"{where}: item '{item}' was saved for"
          f" {meta.run.device_count} devices and the current mesh has"
          f" {self._run.device_count}; its layout depends on the device"
          " count and no relayout was given for it (pass"
          f" relayouts={{'{item}': ...}}, e.g. embedding_relayout,"
          " pipeline_state_relayout)"
        )
    return items

  def _read_targets(
    self, step: int, targets: RestoreTargets, items: list[str], meta: CheckpointMetadata
  ):
    """{item: target to read into}, checked against the saved array metadata."""
    where = self.where(step)
    relaid = meta.run.device_count != self._run.device_count
    try:
      with quiet_reads():
        saved_trees = self._mngr.item_metadata(step)
    except Exception as e:  # pylint: disable=broad-except
      raise CorruptCheckpointError(
        f"{where}: array metadata is unreadable ({first_line(e)})"
      ) from e
    saved_trees = step_items.array_trees(saved_trees, items, meta.format_version)
    out = {}
    for item in items:
      target, saved_tree = getattr(targets, item), saved_trees[item]
      if saved_tree is None:
        raise CorruptCheckpointError(f"{where}: item '{item}' has no array metadata")
      check_against_saved(target, saved_tree, item=item, where=where, compare_shapes=not relaid)
      out[item] = saved_layout_targets(target, saved_tree, item=item) if relaid else target
    return out

  def _check_data_iter(self, step: int, digests: Any, iterator: Any) -> None:
    where = self.where(step)
    index, count = jax.process_index(), jax.process_count()
    name = data_iter_filename(index, count)
    if not isinstance(digests, list) or len(digests) != count:
      raise CorruptCheckpointError(f"{where}: metadata data_iter_sha256 is malformed")
    what = f"item 'data_iter' file {name}"
    state = _read_json(self.step_path(step) / "data_iter" / name, what, where)
    integrity.check_digest(state, digests[index], what=what, where=where)
    _check_dataset(state, iterator, where)

  def _restore_resized_iterator(self, step: int, meta, digests: Any, iterator: Any) -> None:
    """Another process count wrote `step`: every saved state, converted for this process."""
    where = self.where(step)
    try:
      restore_resized_iterator(
        iterator,
        self.step_path(step) / "data_iter",
        summarize_stats_maxima=meta.run.device_count != self._run.device_count,
        digests=digests,
        where=where,
      )
    except IteratorStateMismatchError as e:
      raise IncompatibleCheckpointError(
        f"{where} was written by {meta.run.process_count} processes, current run has"
        f" {self._run.process_count}: {e}"
      ) from e

  def _read(
    self,
    step: int,
    targets: RestoreTargets,
    read_targets: Mapping[str, Any],
    format_version: int,
    *,
    data_iter: bool = True,
  ) -> dict[str, Any]:
    """{array item: tree, "fdo": JSON}, and the iterator's state set (if `data_iter`)."""
    arrays = step_items.array_args(read_targets, format_version, array_restore)
    args = dict(arrays, fdo=ocp.args.JsonRestore())
    if data_iter:
      args.update(data_iter=grain.checkpoint.CheckpointRestore(targets.data_iter))
    try:
      with quiet_reads():
        out = self._mngr.restore(step, args=ocp.args.Composite(**args))
    except IteratorStateMismatchError as e:
      raise IncompatibleCheckpointError(f"{self.where(step)}: {e}") from e
    except Exception as e:  # pylint: disable=broad-except
      item = self._unreadable_item(step, read_targets, format_version)
      raise CorruptCheckpointError(
        f"{self.where(step)}: {item}reading failed ({first_line(e)})"
      ) from e
    return dict(step_items.array_trees(out, list(read_targets), format_version), fdo=out["fdo"])

  def _unreadable_item(
    self, step: int, read_targets: Mapping[str, Any], format_version: int
  ) -> str:
    """ "item 'X': " for the first array item that fails to read alone, else "".

    Only called after a failed restore, to name what is broken.
    """
    for item, target in read_targets.items():
      args = step_items.array_args({item: target}, format_version, array_restore)
      try:
        with quiet_reads():
          self._mngr.restore(step, args=ocp.args.Composite(**args))
      except Exception:  # pylint: disable=broad-except
        return f"item '{item}': "
    return ""

  def _expected_fingerprints(self, step: int, saved: Any, meta: CheckpointMetadata):
    """{item: {leaf: hex}} saved with the step, or None if it was saved without."""
    if saved is None or isinstance(saved, dict):  # dict: format_version 1
      return saved
    where = self.where(step)
    if saved != PARTIAL_SUMS:
      raise CorruptCheckpointError(f"{where}: metadata fingerprints is {saved!r}")
    partials = []
    for index in range(meta.run.process_count):
      name = fingerprint_filename(index)
      what = f"item 'metadata' file {name}"
      sealed = _read_json(self.step_path(step) / "metadata" / name, what, where)
      body = integrity.unseal(sealed, what=what, where=where)
      partials.append(body.get("partial_sums"))
    if not all(isinstance(p, dict) for p in partials):
      raise CorruptCheckpointError(f"{where}: item 'metadata' partial_sums are malformed")
    return {
      item: host_fingerprint.combine(p.get(item, {}) for p in partials) for item in ARRAY_ITEMS
    }

  def _verify(self, step: int, out: Any, checks: Mapping[str, Any], meta, items) -> None:
    where = self.where(step)
    expected = self._expected_fingerprints(step, checks["fingerprints"], meta)
    if expected is None:
      logging.info("%s was saved without array fingerprints: not verified", where)
    else:
      for item in items:
        if not isinstance(expected.get(item), dict):
          raise CorruptCheckpointError(f"{where}: no fingerprints for item '{item}'")
        fingerprint.verify(out[item], expected[item], item=item, where=where)
    integrity.check_digest(out["fdo"], checks["fdo_sha256"], what="item 'fdo'", where=where)

  def restore(
    self,
    step: int,
    targets: Targets,
    relayouts: Mapping[str, Relayout],
    wanted: Sequence[str] = ARRAY_ITEMS,
  ) -> RestoredState:
    """Reads, checks and (if needed) re-lays out the `wanted` array items of `step`."""
    where = self.where(step)
    meta, checks = self._checked_metadata(step)
    items = self._items(meta, relayouts, where, wanted)
    relaid = meta.run.device_count != self._run.device_count
    if callable(targets):
      targets = targets(meta)
    for item in items:
      require_shardings(getattr(targets, item), item=item)
    read_targets = self._read_targets(step, targets, items, meta)
    same_processes = meta.run.process_count == self._run.process_count
    read_iterator = targets.data_iter is not None  # None: a reader that needs no input
    if read_iterator and same_processes:
      self._check_data_iter(step, checks["data_iter_sha256"], targets.data_iter)
    elif read_iterator:
      self._restore_resized_iterator(step, meta, checks["data_iter_sha256"], targets.data_iter)
    out = self._read(
      step, targets, read_targets, meta.format_version, data_iter=read_iterator and same_processes
    )
    self._verify(step, out, checks, meta, items)
    trees = {}
    for item in items:
      tree = out[item]
      if relaid:
        context = RelayoutContext(item, where, meta, self._run)
        tree = relayouts[item](tree, getattr(targets, item), context)
        check_restored(tree, getattr(targets, item), item=item, where=where)
      trees[item] = tree
    logging.info(
      "Restored %s%s",
      where,
      f" (re-laid out {items} from {meta.run.device_count} to {self._run.device_count} devices)"
      if relaid
      else "",
    )
    return RestoredState(
      step=step,
      train_state=trees.get("train_state"),
      embeddings=trees.get("embeddings"),
      pipeline_state=trees.get("pipeline_state"),
      data_iter=targets.data_iter,
      fdo=out["fdo"],
      metadata=meta,
      relaid_out=tuple(items) if relaid else (),
    )

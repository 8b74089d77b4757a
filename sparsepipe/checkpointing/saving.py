"""The save path: the Orbax arguments of one step and the fingerprint hand-over.

The loop waits only while Orbax copies the arrays to the host; everything
else (writing files, summing fingerprints) happens in background commits.
The fingerprints are summed from the host shards Orbax copied
(integrity/host_fingerprint.py), handed to the metadata commit once save() is done
with them (handlers.PendingShards).

While the loop waits on an asynchronous save, the data iterator's
read-ahead threads are held (`read_ahead_paused`, transforms.InputIterator):
Orbax starts about a dozen threads in save(), and while they run Python each
start (and every other release of the GIL) waits for it, so a save right
after a fresh iterator's first batch blocked 6-9x longer
(benchmarks/checkpoint.py).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Callable, ContextManager, Mapping

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from sparsepipe.checkpointing.integrity import host_fingerprint
from sparsepipe.checkpointing.integrity import digests as integrity
from sparsepipe.checkpointing import step_items
from sparsepipe.checkpointing.handlers import array_save
from sparsepipe.checkpointing.handlers import MetadataSave
from sparsepipe.checkpointing.handlers import PendingShards
from sparsepipe.checkpointing.metadata import CheckpointMetadata
from sparsepipe.checkpointing.metadata import FeatureLimits
from sparsepipe.checkpointing.metadata import CHECKPOINT_FORMAT_VERSION
from sparsepipe.checkpointing.metadata import LoopPosition
from sparsepipe.checkpointing.metadata import RunInfo
from sparsepipe.checkpointing.metadata import to_json_value
from sparsepipe.checkpointing.step_items import ARRAY_ITEMS
from sparsepipe.checkpointing.step_items import CheckpointItems

# integrity["fingerprints"] of a step whose fingerprints are in per-process
# files of the metadata item (handlers.fingerprint_filename).
PARTIAL_SUMS = "partial_sums"


def iterator_state(iterator: Any) -> Any:
  """The iterator's state as the JSON value Grain's handler writes."""
  state = iterator.get_state()
  if isinstance(state, bytes):  # DataLoader iterators
    state = json.loads(state.decode())
  return state


def _gather_digests(*digests: str) -> list[list[str]]:
  """For each given hex sha256, every process's value, in process order."""
  if jax.process_count() == 1:
    return [[d] for d in digests]
  words = np.concatenate([np.frombuffer(bytes.fromhex(d), dtype=np.uint32) for d in digests])
  rows = np.asarray(multihost_utils.process_allgather(words), np.uint32)
  per = len(words) // len(digests)
  return [
    [row[i * per : (i + 1) * per].tobytes().hex() for row in rows] for i in range(len(digests))
  ]


def _metadata(
  state: CheckpointItems,
  fdo: Any,
  run: RunInfo,
  progress: LoopPosition,
  feature_limits: FeatureLimits | None,
  fingerprints: bool,
  training_data: Mapping[str, Any] | None,
) -> dict[str, Any]:
  """The metadata item's JSON, with digests of the JSON items of every process."""
  meta = CheckpointMetadata(
    run,
    progress,
    to_json_value(feature_limits or {}, "feature_limits"),
    training_data=training_data,
  ).to_json()
  data_iter_digests, fdo_digests = _gather_digests(
    integrity.digest(iterator_state(state.data_iter)), integrity.digest(fdo)
  )
  differing = [i for i, d in enumerate(fdo_digests) if d != fdo_digests[0]]
  if differing:
    raise ValueError(
      f"item 'fdo' differs between processes ({differing} differ from"
      " process 0); it is written once, by process 0: merge FDO state"
      " across processes before saving"
    )
  meta["integrity"] = {
    "fingerprints": PARTIAL_SUMS if fingerprints else None,
    "fdo_sha256": fdo_digests[0],
    "data_iter_sha256": data_iter_digests,
  }
  return meta


def read_ahead_paused(iterator: Any) -> ContextManager[Any]:
  """The iterator's `read_ahead_paused()` if it has one, else a no-op."""
  pause = getattr(iterator, "read_ahead_paused", None)
  return pause() if pause is not None else contextlib.nullcontext()


def take_shards(state: CheckpointItems) -> dict[str, Any]:
  """{item: host shards} of the array items (see host_fingerprint)."""
  return {item: host_fingerprint.take_shards(getattr(state, item), item) for item in ARRAY_ITEMS}


def save_step(
  save: Callable[[ocp.args.Composite], Any],
  state: CheckpointItems,
  run: RunInfo,
  progress: LoopPosition,
  *,
  feature_limits: FeatureLimits | None,
  fingerprints: bool,
  async_save: bool,
  data_file_mb: float,
  training_data: Mapping[str, Any] | None = None,
) -> None:
  """Calls `save` (Orbax's, for one step) with the arguments of every item.

  An asynchronous save pauses the data iterator's read-ahead until it
  returns (a synchronous one leaves it running: it fills its buffer while
  the files are written).
  """
  with read_ahead_paused(state.data_iter) if async_save else contextlib.nullcontext():
    if not isinstance(state.fdo, Mapping):
      raise ValueError(f"item 'fdo' must be a JSON object (dict), got {type(state.fdo).__name__}")
    for item in ARRAY_ITEMS:
      host_fingerprint.check_tree(getattr(state, item), item)
    fdo = to_json_value(state.fdo, "fdo")
    meta = _metadata(state, fdo, run, progress, feature_limits, fingerprints, training_data)
    pending = PendingShards() if fingerprints else None
    trees = {item: getattr(state, item) for item in ARRAY_ITEMS}
    args = step_items.array_args(
      trees, CHECKPOINT_FORMAT_VERSION, lambda tree, _: array_save(tree, data_file_mb)
    )
    args.update(
      data_iter=grain.checkpoint.CheckpointSave(state.data_iter),
      fdo=ocp.args.JsonSave(fdo),
      metadata=MetadataSave(meta, pending),
    )
    try:
      if pending is not None and not async_save:
        pending.set(take_shards(state))  # a synchronous save commits inside save()
      save(ocp.args.Composite(**args))
      if pending is not None and async_save:
        pending.set(take_shards(state))  # the host copies Orbax just made
    except BaseException as e:
      if pending is not None:
        pending.fail(e)
      raise

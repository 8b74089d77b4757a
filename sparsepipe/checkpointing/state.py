"""What a checkpoint step holds: the saved state, the restore targets, the result."""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

from sparsepipe.checkpointing.metadata import CheckpointMetadata

ARRAY_ITEMS = ("train_state", "embeddings", "pipeline_state")
ITEM_NAMES = ARRAY_ITEMS + ("data_iter", "fdo", "metadata")


class CheckpointItems(NamedTuple):
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
  freshly built Grain iterator that receives the saved iterator state (None:
  the iterator state is not read, e.g. to evaluate or export a step)."""

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
    metadata: the saved CheckpointMetadata (LoopPosition, feature limits, ...).
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

"""What a checkpoint step holds, and which Orbax items (directories) hold it, by format.

A step holds the saved state (`CheckpointItems`); a restore is given its
targets (`RestoreTargets`) and returns the step (`RestoredState`). Of the
items, three are trees of arrays (ARRAY_ITEMS) and three JSON.

Format 3 (written now) keeps the three array items in one Orbax item,
"arrays", as {item: tree}: Orbax starts its commit threads and copies to
the host per item, and while the loop waits on an async save that per-item
work was most of the wait (one item instead of three: about half the wait,
benchmarks/checkpoint.py). Formats 1 and 2 have one Orbax item per array
item; they are still read. Messages, fingerprints and relayouts name the
array items ("embeddings", ...) in every format.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Sequence

from sparsepipe.checkpointing.metadata import CheckpointMetadata

ARRAY_ITEMS = ("train_state", "embeddings", "pipeline_state")
ITEM_NAMES = ARRAY_ITEMS + ("data_iter", "fdo", "metadata")
ARRAYS = "arrays"  # the Orbax item of format 3
JSON_ITEMS = ("data_iter", "fdo", "metadata")
FIRST_ONE_ITEM_FORMAT = 3


def _one_item(format_version: int) -> bool:
  return format_version >= FIRST_ONE_ITEM_FORMAT


def orbax_items(format_version: int) -> tuple[str, ...]:
  """Every Orbax item a complete step of `format_version` has."""
  arrays = (ARRAYS,) if _one_item(format_version) else ARRAY_ITEMS
  return arrays + JSON_ITEMS


def array_args(
  trees: Mapping[str, Any],
  format_version: int,
  make_arg: Callable[[Any, bool], Any],
) -> dict[str, Any]:
  """{Orbax item: make_arg(tree, partial)} for the array items in `trees`.

  `partial` is True when the Orbax item holds more array items than `trees`
  gives (a restore that leaves some out).
  """
  if _one_item(format_version):
    return {ARRAYS: make_arg(dict(trees), set(trees) != set(ARRAY_ITEMS))}
  return {item: make_arg(tree, False) for item, tree in trees.items()}


def array_trees(out: Mapping[str, Any], items: Sequence[str], format_version: int) -> dict:
  """{array item: tree} from Orbax's per-item results (restored trees or metadata)."""
  if _one_item(format_version):
    arrays = out[ARRAYS]
    arrays = getattr(arrays, "tree", arrays)  # item metadata wraps the tree
    if not isinstance(arrays, Mapping):
      return {item: None for item in items}
    return {item: arrays.get(item) for item in items}
  return {item: out[item] for item in items}


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

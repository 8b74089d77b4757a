"""Zero-size arrays in checkpoints: left out on save, made again on restore.

Orbax refuses to write an array with no elements ("Cannot save arrays with
zero size"), and a job can carry some: the dense features of a dataset that
has none (ratings data) are [batch, 0] in the PipelineState. They hold no
data, so a checkpoint stores None in their place and a restore makes zeros
of the target's shape, dtype and sharding.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from sparsepipe.checkpointing.step_items import ARRAY_ITEMS


def _is_empty(x: Any) -> bool:
  return hasattr(x, "shape") and math.prod(x.shape) == 0


def without_empty(tree: Any) -> Any:
  """`tree` with every zero-size array (or ShapeDtypeStruct) replaced by None."""
  return jax.tree.map(lambda x: None if _is_empty(x) else x, tree)


def with_empty(restored: Any, target: Any) -> Any:
  """`restored` (read with `without_empty(target)`) with target's empty arrays made again."""
  values = dict(jax.tree_util.tree_flatten_with_path(restored, is_leaf=lambda x: x is None)[0])

  def fill(path, leaf):
    if not _is_empty(leaf):
      return values[path]
    sharding = getattr(leaf, "sharding", None)
    empty = np.zeros(leaf.shape, leaf.dtype)
    return jax.device_put(empty, sharding) if sharding is not None else empty

  return jax.tree_util.tree_map_with_path(fill, target)


def strip_items(items: Any) -> Any:
  """A CheckpointItems or RestoreTargets with the array items' empty leaves as None."""
  return items._replace(**{name: without_empty(getattr(items, name)) for name in ARRAY_ITEMS})


def refill_items(restored: Any, targets: Any) -> Any:
  """A RestoredState whose array items get back the empty arrays of `targets`."""
  changes = {}
  for name in ARRAY_ITEMS:
    tree = getattr(restored, name)
    if tree is not None:
      changes[name] = with_empty(tree, getattr(targets, name))
  return restored._replace(**changes)

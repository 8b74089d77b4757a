"""Abstract restore targets: ShapeDtypeStructs carrying the current shardings.

Orbax restores every array with the sharding of its target, so targets are
built from the *current* mesh, never read back from the checkpoint. This
module also compares a target with the saved array metadata, so a changed
program (another tree, shape or dtype) is refused with the leaf's name
before anything is read (Orbax would silently cast a dtype).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sparsepipe.checkpointing.checkpoint_errors import IncompatibleCheckpointError
from sparsepipe.checkpointing.leaf_paths import leaf_path, leaves_by_path


def abstract_of(tree: Any) -> Any:
  """ShapeDtypeStructs (with their shardings) of a tree of arrays."""
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def on_mesh(abstract_tree: Any, mesh: Mesh) -> Any:
  """The same targets with every NamedSharding moved onto `mesh`.

  PartitionSpecs are kept: a tree sharded over 'data' on 8 devices becomes
  one sharded over 'data' on `mesh` (e.g. a 4-device sub-mesh).
  """

  def leaf(x):
    sharding = x.sharding
    if isinstance(sharding, NamedSharding):
      sharding = NamedSharding(mesh, sharding.spec)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

  return jax.tree.map(leaf, abstract_tree)


def _divisible(sharding: Any, shape: tuple[int, ...]) -> bool:
  try:
    sharding.shard_shape(shape)
  except ValueError:
    return False
  return True


def _replicated_like(sharding: Any) -> Any:
  if isinstance(sharding, NamedSharding):
    return NamedSharding(sharding.mesh, PartitionSpec())
  return sharding


def _saved_leaves(saved_tree: Any) -> dict[str, Any]:
  tree = getattr(saved_tree, "tree", saved_tree)
  return leaves_by_path(tree)


def check_against_saved(
  target: Any,
  saved_tree: Any,
  *,
  item: str,
  where: str,
  compare_shapes: bool = True,
) -> None:
  """Raises IncompatibleCheckpointError if the target does not fit the save.

  Args:
    target: the abstract restore target (ShapeDtypeStructs).
    saved_tree: Orbax's item metadata (a tree of ArrayMetadata).
    item: the checkpoint item name, for messages.
    where: "checkpoint at DIR step N", for messages.
    compare_shapes: False when the item will be re-laid out (the device
      count changed): then only the tree and the dtypes must match.
  """
  want = leaves_by_path(target)
  have = _saved_leaves(saved_tree)
  missing = sorted(set(want) - set(have))
  extra = sorted(set(have) - set(want))
  if missing or extra:
    raise IncompatibleCheckpointError(
      f"{where}: item '{item}' has another tree structure than the current"
      f" run: leaves only in the current run {missing}, only in the"
      f" checkpoint {extra}"
    )
  for path, leaf in want.items():
    saved = have[path]
    if np.dtype(saved.dtype) != np.dtype(leaf.dtype):
      raise IncompatibleCheckpointError(
        f"{where}: item '{item}' leaf '{path}' was saved as"
        f" {np.dtype(saved.dtype).name}, current run has"
        f" {np.dtype(leaf.dtype).name}"
      )
    if compare_shapes and tuple(saved.shape) != tuple(leaf.shape):
      raise IncompatibleCheckpointError(
        f"{where}: item '{item}' leaf '{path}' was saved with shape"
        f" {tuple(saved.shape)}, current run has {tuple(leaf.shape)}"
      )


def saved_layout_targets(target: Any, saved_tree: Any, *, item: str) -> Any:
  """Targets with the *saved* shapes, placed with the current shardings.

  Used to read an item saved for another device count onto the current
  devices before re-laying it out. A saved shape that the current sharding
  does not divide is read replicated (logged).
  """
  have = _saved_leaves(saved_tree)

  def leaf(keypath, x):
    path = leaf_path(keypath)
    shape = tuple(have[path].shape)
    sharding = x.sharding
    if sharding is not None and not _divisible(sharding, shape):
      logging.info(
        "item '%s' leaf '%s': saved shape %s does not divide over %s; read replicated",
        item,
        path,
        shape,
        sharding,
      )
      sharding = _replicated_like(sharding)
    return jax.ShapeDtypeStruct(shape, x.dtype, sharding=sharding)

  return jax.tree_util.tree_map_with_path(leaf, target)


def check_restored(tree: Any, target: Any, *, item: str, where: str) -> None:
  """A re-laid-out tree must match its target exactly (shape, dtype, sharding)."""
  got = leaves_by_path(tree)
  for path, want in leaves_by_path(target).items():
    x = got.get(path)
    if x is None:
      raise IncompatibleCheckpointError(f"{where}: re-laid-out item '{item}' has no leaf '{path}'")
    if tuple(x.shape) != tuple(want.shape) or x.dtype != want.dtype:
      raise IncompatibleCheckpointError(
        f"{where}: re-laid-out item '{item}' leaf '{path}' is"
        f" {x.dtype}{tuple(x.shape)}, target {want.dtype}{tuple(want.shape)}"
      )
    if want.sharding is not None and not x.sharding.is_equivalent_to(want.sharding, x.ndim):
      raise IncompatibleCheckpointError(
        f"{where}: re-laid-out item '{item}' leaf '{path}' has sharding"
        f" {x.sharding}, target {want.sharding}"
      )


def require_shardings(target: Any, *, item: str) -> None:
  """Raises ValueError for a target leaf that is not a sharded ShapeDtypeStruct.

  Restoring without a sharding would place arrays on a default device and
  lose the layout; callers must say where every array goes.
  """
  for path, leaf in leaves_by_path(target).items():
    if getattr(leaf, "sharding", None) is None:
      raise ValueError(
        f"restore target of item '{item}' leaf '{path}' has no sharding;"
        " build targets with jax.ShapeDtypeStruct(shape, dtype,"
        " sharding=...) for the current mesh (see abstract_of, on_mesh)"
      )

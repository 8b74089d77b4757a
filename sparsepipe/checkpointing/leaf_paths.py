"""A pytree leaf's name as Orbax writes it: what checks and targets call each leaf."""

from __future__ import annotations

from typing import Any

import jax


def leaf_path(keypath: tuple[Any, ...]) -> str:
  """'opt_state/0/mu/w': a key path as Orbax names it (NamedTuple fields
  and dict keys alike)."""
  return jax.tree_util.keystr(keypath, simple=True, separator="/")


def leaves_by_path(tree: Any) -> dict[str, Any]:
  """{leaf path: leaf} of a pytree (None subtrees have no leaves)."""
  return {leaf_path(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}

"""Value fingerprints of array trees: detect garbled checkpoint data.

Orbax does not checksum array data: a few flipped bytes inside an OCDBT data
file restore silently as wrong values (measured with orbax-checkpoint
0.12.8). Every saved array therefore gets a 32-bit fingerprint, stored in the
step's metadata and compared after restore.

The fingerprint is a uint32 sum computed on the device, under jit, from the
array's bits and each element's row-major flat index with wrap-around
arithmetic. Integer sums are associative, so the value depends only on the
logical array, never on its sharding or device count: a table saved on 8
devices and restored on 4 has the same fingerprint (the shape is checked
separately, from Orbax's metadata). Saves compute the same sum from the host
copies of the shards, in the background (host_fingerprint.py); restores
compute it here, on the devices, from the arrays read.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from sparsepipe.checkpointing.checkpoint_errors import CorruptCheckpointError
from sparsepipe.checkpointing.leaf_paths import leaf_path

MIX = 0x85EBCA6B


def _words(x: jax.Array) -> jax.Array:
  """The array's bits as uint32 (8-byte elements give a trailing dim of 2)."""
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  size = np.dtype(x.dtype).itemsize
  if size in (4, 8):
    return jax.lax.bitcast_convert_type(x, jnp.uint32)
  if size == 2:
    return jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
  if size == 1:
    return jax.lax.bitcast_convert_type(x, jnp.uint8).astype(jnp.uint32)
  raise ValueError(f"cannot fingerprint dtype {x.dtype}")


def _flat_index(shape: tuple[int, ...]) -> jax.Array:
  """uint32 row-major flat index of every element (wraps past 2**32)."""
  index = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for axis in reversed(range(len(shape))):
    iota = jax.lax.broadcasted_iota(jnp.uint32, shape, axis)
    index = index + iota * jnp.uint32(stride & 0xFFFFFFFF)
    stride *= shape[axis]
  return index


def _fingerprint(x: jax.Array) -> jax.Array:
  """uint32: sum over elements of mix(word) * (2 * flat index + 1).

  mix (xorshift, then an odd multiplier) is a bijection of uint32 and the
  weight is odd, hence invertible mod 2**32: any single changed word
  changes the sum; random garbage goes unnoticed with probability 2**-32.
  One 32-bit sum per array: on CPU, XLA runs integer reductions at a
  fraction of memory speed and two sibling reductions over one array at a
  third of that again, so a 64-bit variant would cost the loop 2-6x more.
  """
  w = _words(x)
  mixed = (w ^ (w >> jnp.uint32(16))) * jnp.uint32(MIX)
  weight = _flat_index(w.shape) * jnp.uint32(2) + jnp.uint32(1)
  terms = mixed * weight
  if terms.ndim > 1:
    # Rows first: XLA:CPU splits one reduction over a large array into a tree
    # whose first level reads the terms materialized, a second copy of the
    # array at once (a restore's peak); a reduction over the trailing axes
    # computes them in place, and only the row sums are stored.
    terms = jnp.sum(terms, axis=tuple(range(1, terms.ndim)), dtype=jnp.uint32)
    terms = jax.lax.optimization_barrier(terms)  # else XLA merges the two reductions
  return jnp.sum(terms, dtype=jnp.uint32)


def _group_key(leaf: Any) -> Any:
  sharding = getattr(leaf, "sharding", None)
  if isinstance(sharding, NamedSharding):
    return sharding.mesh
  if sharding is not None:
    return frozenset(sharding.device_set)
  return None


def check_leaf(path: str, leaf: Any, item: str) -> None:
  if not isinstance(leaf, (jax.Array, np.ndarray, np.generic)):
    raise ValueError(
      f"item '{item}' leaf '{path}' is a {type(leaf).__name__}; checkpointed"
      " trees hold arrays (jax.Array or numpy) only"
    )


def tree_fingerprints(tree: Any, item: str = "tree") -> dict[str, jax.Array]:
  """{leaf path: uint32 device scalar}; dispatched, not waited for.

  Leaves on one mesh are fingerprinted by one jitted call whose outputs are
  replicated, so every process can read them (multi-host).
  """
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  groups: dict[Any, list[tuple[str, Any]]] = {}
  for keypath, leaf in leaves:
    path = leaf_path(keypath)
    check_leaf(path, leaf, item)
    groups.setdefault(_group_key(leaf), []).append((path, leaf))
  out = {}
  for key, members in groups.items():
    values = [leaf for _, leaf in members]
    mesh = key if isinstance(key, jax.sharding.Mesh) else None
    fingerprints = _fingerprint_fn(mesh, len(values))(values)
    out.update(zip((path for path, _ in members), fingerprints))
  return out


def _fingerprint_all(xs: list[Any]) -> list[jax.Array]:
  return [_fingerprint(jnp.asarray(x)) for x in xs]


@functools.lru_cache(maxsize=64)
def _fingerprint_fn(mesh: jax.sharding.Mesh | None, count: int):
  """One jitted function per (mesh, leaf count); jit caches the shapes."""
  if mesh is None:
    return jax.jit(_fingerprint_all)
  replicated = NamedSharding(mesh, PartitionSpec())
  return jax.jit(_fingerprint_all, out_shardings=[replicated] * count)


def to_hex(fingerprint: Any) -> str:
  """'0123abcd' from a uint32 fingerprint (waits for the device)."""
  return f"{int(np.asarray(fingerprint, np.uint32)):08x}"


def resolve(fingerprints: Mapping[str, Any]) -> dict[str, str]:
  """{leaf path: hex}: fetches dispatched fingerprints (blocks)."""
  return {path: to_hex(fp) for path, fp in sorted(fingerprints.items())}


def verify(tree: Any, expected: Mapping[str, str], *, item: str, where: str):
  """Raises CorruptCheckpointError if a restored leaf differs from the save."""
  got = resolve(tree_fingerprints(tree, item))
  if set(got) != set(expected):
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    raise CorruptCheckpointError(
      f"{where}: item '{item}' leaves do not match the saved fingerprints"
      f" (missing {missing}, unexpected {extra})"
    )
  for path, value in got.items():
    if value != expected[path]:
      raise CorruptCheckpointError(
        f"{where}: item '{item}' leaf '{path}' restored with fingerprint"
        f" {value}, saved {expected[path]} (garbled data file)"
      )

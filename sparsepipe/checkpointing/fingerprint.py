"""Value fingerprints of array trees: detect garbled checkpoint data.

Orbax does not checksum array data: a few flipped bytes inside an OCDBT data
file restore silently as wrong values (measured with orbax-checkpoint
0.12.8). Every saved array therefore gets a 64-bit fingerprint, stored in the
step's metadata and compared after restore.

The fingerprint is computed on the device, under jit, from the array's bits
and each element's flat index with wrap-around uint32 arithmetic. Integer
sums are associative, so the value depends only on the logical array, never
on its sharding or device count: a table saved on 8 devices and restored on
4 has the same fingerprint. Computing it is one read of the state; saves
dispatch it asynchronously and the background commit waits for it.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from sparsepipe.checkpointing.errors import CorruptCheckpointError
from sparsepipe.checkpointing.targets import leaf_path

_GOLDEN = 0x9E3779B9
_MIX = 0x85EBCA6B


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


def _fingerprint(x: jax.Array) -> jax.Array:
  """uint32[2]: two independent position-weighted sums of the array's bits."""
  w = _words(x)
  index = jnp.zeros(w.shape, jnp.uint32)
  stride = 1
  for axis in reversed(range(w.ndim)):
    iota = jax.lax.broadcasted_iota(jnp.uint32, w.shape, axis)
    index = index + iota * jnp.uint32(stride & 0xFFFFFFFF)
    stride *= w.shape[axis]
  # An odd multiplier is invertible mod 2**32: any single changed word
  # changes h1.
  h1 = jnp.sum(w * (index * jnp.uint32(2) + jnp.uint32(1)), dtype=jnp.uint32)
  m = w ^ (index * jnp.uint32(_GOLDEN))
  m = (m << jnp.uint32(13)) | (m >> jnp.uint32(19))
  h2 = jnp.sum(m * jnp.uint32(_MIX), dtype=jnp.uint32)
  return jnp.stack([h1, h2])


def _group_key(leaf: Any) -> Any:
  sharding = getattr(leaf, "sharding", None)
  if isinstance(sharding, NamedSharding):
    return sharding.mesh
  if sharding is not None:
    return frozenset(sharding.device_set)
  return None


def _check_leaf(path: str, leaf: Any, item: str) -> None:
  if not isinstance(leaf, (jax.Array, np.ndarray, np.generic)):
    raise ValueError(
        f"item '{item}' leaf '{path}' is a {type(leaf).__name__}; checkpointed"
        " trees hold arrays (jax.Array or numpy) only"
    )


def tree_fingerprints(tree: Any, item: str = "tree") -> dict[str, jax.Array]:
  """{leaf path: uint32[2] device array}; dispatched, not waited for.

  Leaves on one mesh are fingerprinted by one jitted call whose outputs are
  replicated, so every process can read them (multi-host).
  """
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  groups: dict[Any, list[tuple[str, Any]]] = {}
  for keypath, leaf in leaves:
    path = leaf_path(keypath)
    _check_leaf(path, leaf, item)
    groups.setdefault(_group_key(leaf), []).append((path, leaf))
  out = {}
  for key, members in groups.items():
    values = [leaf for _, leaf in members]
    mesh = key if isinstance(key, jax.sharding.Mesh) else None
    fn = _fingerprint_fn(mesh, len(values))
    out.update(zip((p for p, _ in members), fn(values)))
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
  """'0123abcd89ef4567' from a uint32[2] (waits for the device)."""
  h1, h2 = (int(v) for v in np.asarray(fingerprint, np.uint32))
  return f"{h1:08x}{h2:08x}"


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

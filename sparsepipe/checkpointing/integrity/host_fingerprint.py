"""Fingerprints of saved arrays computed on the host, off the training loop.

An asynchronous Orbax save copies every array's shards to host memory while
the loop waits (on a CPU backend the "copy" is a view of the buffer). The
fingerprint of fingerprint.py is a wrap-around uint32 sum over elements, so
it splits into per-shard partial sums: `take_shards` picks, right after
Orbax's copy, the host values of the shards this process writes (replica 0;
jax caches the copy, so taking them costs nothing), and `partial_sums` adds
them up in the background commit. The partial sums of all processes add up
to the device fingerprint of the whole array (`combine`), which restore
compares with the fingerprint of the array it read.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

import jax
import numpy as np

from sparsepipe.checkpointing.integrity.fingerprint import check_leaf
from sparsepipe.checkpointing.integrity.fingerprint import MIX
from sparsepipe.checkpointing.leaf_paths import leaf_path

_MASK = 0xFFFFFFFF
_CHUNK_WORDS = 1 << 16  # words per step of the sum: temporaries stay in cache


@dataclasses.dataclass(frozen=True)
class HostShard:
  """One shard's host values and where it sits in the global array."""

  value: np.ndarray
  start: tuple[int, ...]
  global_shape: tuple[int, ...]


def _start(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
  return tuple(s.indices(n)[0] for s, n in zip(index, shape))


def _leaf_shards(leaf: Any) -> list[HostShard]:
  if isinstance(leaf, jax.Array):
    shape = tuple(leaf.shape)
    return [
      HostShard(np.asarray(s.data), _start(s.index, shape), shape)
      for s in leaf.addressable_shards
      if s.replica_id == 0
    ]
  if jax.process_index() != 0:  # host values are the same on every process
    return []
  value = np.asarray(leaf)
  return [HostShard(value, (0,) * value.ndim, tuple(value.shape))]


def check_tree(tree: Any, item: str) -> None:
  """ValueError naming the first leaf that is not an array (before a save)."""
  for keypath, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    check_leaf(leaf_path(keypath), leaf, item)


def take_shards(tree: Any, item: str) -> dict[str, list[HostShard]]:
  """{leaf path: this process's replica-0 shards on the host}.

  Call after Orbax copied the arrays to the host (the values are cached
  then); the result stays valid after the device arrays are donated.
  """
  out = {}
  for keypath, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    path = leaf_path(keypath)
    check_leaf(path, leaf, item)
    out[path] = _leaf_shards(leaf)
  return out


def _words(value: np.ndarray) -> np.ndarray:
  """Like fingerprint._words: uint32 words, 8-byte elements as (..., 2)."""
  value = np.ascontiguousarray(value)
  size = value.dtype.itemsize
  if value.dtype == np.bool_ or size == 1:
    return value.view(np.uint8).astype(np.uint32)
  if size == 2:
    return value.view(np.uint16).astype(np.uint32)
  if size == 4:
    return value.view(np.uint32)
  if size == 8:
    return value.view(np.uint32).reshape(value.shape + (2,))
  raise ValueError(f"cannot fingerprint dtype {value.dtype}")


def _strides(shape: tuple[int, ...]) -> list[int]:
  strides, stride = [], 1
  for size in reversed(shape):
    strides.append(stride)
    stride *= size
  return strides[::-1]


def _index_terms(words_shape, start, strides, axes) -> np.ndarray:
  """uint32 sum over `axes` of (start + iota) * stride, broadcast over them."""
  out = np.zeros([words_shape[a] for a in axes], np.uint32)
  for k, axis in enumerate(axes):
    iota = np.arange(words_shape[axis], dtype=np.uint64) + start[axis]
    term = ((iota * strides[axis]) & _MASK).astype(np.uint32)
    out = out + term.reshape((-1,) + (1,) * (len(axes) - k - 1))
  return out


def _shard_sum(shard: HostShard) -> int:
  """sum(mix(word) * (2 * global flat index + 1)) over the shard, mod 2**32.

  Works through cache-sized chunks of the first axis, in place: one
  temporary for the mixed words and one for the weights.
  """
  words = _words(shard.value)
  extra = words.ndim - len(shard.global_shape)  # 1 for 8-byte elements
  global_shape = shard.global_shape + words.shape[len(shard.global_shape) :]
  start = shard.start + (0,) * extra
  strides = _strides(global_shape)
  if words.ndim == 0:
    words, start, strides = words.reshape(1), (0,), [1]
  # 2 * (index part of the other axes), and 2 * (first-axis part) + 1.
  rest = _index_terms(words.shape, start, strides, range(1, words.ndim)) * np.uint32(2)
  first = _index_terms(words.shape, start, strides, [0]) * np.uint32(2) + np.uint32(1)
  first = first.reshape((-1,) + (1,) * (words.ndim - 1))
  rows = max(1, _CHUNK_WORDS // max(1, rest.size))
  mixed = np.empty((min(rows, words.shape[0]),) + words.shape[1:], np.uint32)
  weight = np.empty_like(mixed)
  total = np.uint32(0)
  for r0 in range(0, words.shape[0], rows):
    w = words[r0 : r0 + rows]
    m, wt = mixed[: w.shape[0]], weight[: w.shape[0]]
    np.right_shift(w, np.uint32(16), out=m)
    np.bitwise_xor(m, w, out=m)
    np.multiply(m, np.uint32(MIX), out=m)
    np.add(first[r0 : r0 + rows], rest, out=wt)
    np.multiply(m, wt, out=m)
    total = total + np.sum(m, dtype=np.uint32)
  return int(total)


def partial_sums(shards: Mapping[str, Iterable[HostShard]]) -> dict[str, int]:
  """{leaf path: uint32 sum over this process's shards} (reads the values)."""
  with np.errstate(over="ignore"):
    return {
      path: sum(_shard_sum(s) for s in members) & _MASK for path, members in sorted(shards.items())
    }


def combine(partials: Iterable[Mapping[str, int]]) -> dict[str, str]:
  """{leaf path: hex fingerprint} from every process's partial sums."""
  total: dict[str, int] = {}
  for part in partials:
    for path, value in part.items():
      total[path] = (total.get(path, 0) + int(value)) & _MASK
  return {path: f"{value:08x}" for path, value in sorted(total.items())}

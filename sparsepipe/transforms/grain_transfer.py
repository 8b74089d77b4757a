"""Grain transforms: pack a batch's arrays into one buffer per dtype for mp_prefetch.

Grain moves every numpy array of an element from a worker to the main
process through its own shared-memory block. A preprocessed batch has about
four COO arrays per stack plus statistics (over a hundred arrays for 26
tables), and creating, mapping and unlinking that many blocks per batch
costs more than the preprocessing saves. `PackArrays` (last step in the
worker) copies all arrays of one dtype into a single contiguous buffer;
`UnpackArrays` (first step after mp_prefetch) gives back the same structure
as zero-copy views of those buffers.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import grain
import jax
import numpy as np


class PackedArrays(NamedTuple):
  """An element with its arrays moved into per-dtype buffers.

  Attributes:
    buffers: {dtype name: 1-D array} holding the arrays back to back.
    layout: per leaf, (dtype name, offset, shape) for an array, or
      (None, value) for any other leaf.
    treedef: the element's pytree structure.
  """

  buffers: dict[str, np.ndarray]
  layout: tuple[tuple[Any, ...], ...]
  treedef: Any


def pack_arrays(element: Any, *, shared_memory: bool = False) -> PackedArrays:
  """Copies the element's arrays into per-dtype buffers (in shared memory if asked)."""
  leaves, treedef = jax.tree_util.tree_flatten(element)
  sizes: dict[str, int] = {}
  layout = []
  for leaf in leaves:
    if isinstance(leaf, np.ndarray) and not leaf.dtype.hasobject:
      name = leaf.dtype.str
      layout.append((name, sizes.get(name, 0), leaf.shape))
      sizes[name] = sizes.get(name, 0) + leaf.size
    else:
      layout.append((None, leaf))
  alloc = grain.multiprocessing.SharedMemoryArray if shared_memory else np.empty
  buffers = {name: alloc((size,), np.dtype(name)) for name, size in sizes.items()}
  for leaf, entry in zip(leaves, layout):
    if entry[0] is not None:
      _, offset, _ = entry
      buffers[entry[0]][offset : offset + leaf.size] = leaf.reshape(-1)
  return PackedArrays(buffers, tuple(layout), treedef)


def unpack_arrays(packed: PackedArrays) -> Any:
  """The element back, its arrays as plain ndarray views of the buffers.

  Views of a shared-memory buffer keep it alive through `.base`; taking them
  from a plain-ndarray view of it skips the subclass's per-view hook (a
  third of this stage's time with ~200 arrays per batch).
  """
  plain = {name: buffer.view(np.ndarray) for name, buffer in packed.buffers.items()}
  leaves = []
  for entry in packed.layout:
    if entry[0] is None:
      leaves.append(entry[1])
    else:
      name, offset, shape = entry
      leaves.append(plain[name][offset : offset + math.prod(shape)].reshape(shape))
  return jax.tree_util.tree_unflatten(packed.treedef, leaves)


class PackArrays(grain.transforms.Map):
  """Worker side: element -> PackedArrays (one buffer per dtype).

  With shared_memory=True the buffers are allocated in shared memory, so
  mp_prefetch passes them on without another copy.
  """

  def __init__(self, shared_memory: bool = False):
    self.shared_memory = shared_memory

  def map(self, element: Any) -> PackedArrays:
    return pack_arrays(element, shared_memory=self.shared_memory)


class UnpackArrays(grain.transforms.Map):
  """Main-process side: PackedArrays -> the original element (views)."""

  def map(self, element: PackedArrays) -> Any:
    return unpack_arrays(element)

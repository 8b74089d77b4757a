"""Grain transforms: move a batch from a worker to the main process in one reused block.

A preprocessed batch is about 14 MB in some 200 arrays (four COO arrays per
stack plus statistics). Grain would give every array its own fresh
shared-memory block; creating, faulting in (the kernel zeroes every page on
first touch, in the worker and again when the main process maps it) and
unlinking them cost a worker more than half the preprocessing time.
`PackArrays` (last step in the worker) copies all arrays of an element into
one block of a per-worker pool and sends only the block's name and the
layout; `UnpackArrays` (first step after mp_prefetch) gives back the same
structure as zero-copy views of the block. A block is reused once every
view of the batch it holds is gone: the main process marks it free in the
block's header when the batch's buffer object is collected, and the worker
takes free blocks before making new ones (the block of an element dropped
unread, a stale one at a set_state, stays in use). The main process maps a
block, flags it claimed and unlinks its name as soon as an element naming
it is received (unpickled from the worker's queue), not when it is
unpacked: Grain reads a worker's queue ahead of the consumer and stops an
exhausted worker as soon as its end is read, while its last elements still
wait to be unpacked. The queue is first in first out, so every element is
claimed before the worker's end is seen. A worker unlinks the blocks never
claimed when it exits (elements still in its queue at a stop or a restore),
so nothing is left in /dev/shm.
"""

from __future__ import annotations

import math
import mmap
import os
import threading
from multiprocessing import resource_tracker
from multiprocessing import shared_memory
from multiprocessing import util as mp_util
from typing import Any, NamedTuple
import weakref

import _posixshmem  # what SharedMemory maps blocks with (the package is POSIX-only)
import grain
import jax
import numpy as np

from sparsepipe.core.rounding import round_up

_HEADER = 64  # bytes before the data: the block's state and its claimed flag
_STATE, _CLAIMED = 0, 1
_FREE, _IN_USE = 0, 1
_ALIGN = 64
_GROWTH = 1 << 20


class PackedArrays(NamedTuple):
  """An element with its arrays moved into one byte buffer.

  Attributes:
    block: name of the shared-memory block holding the bytes, or None.
    data: the bytes as a uint8 array when not in shared memory, else None.
    nbytes: bytes used.
    layout: per leaf, (dtype str, byte offset, shape) for an array, or
      (None, value) for any other leaf.
    treedef: the element's pytree structure.
    claim: in the process that received the element from a worker, the
      block's mapping there (which holds it until the element is unpacked),
      else None.
  """

  block: str | None
  data: np.ndarray | None
  nbytes: int
  layout: tuple[tuple[Any, ...], ...]
  treedef: Any
  claim: Any = None

  def __reduce__(self):
    if self.block is None:
      return PackedArrays, tuple(self)
    # Received: the block is claimed at once (see the module docstring).
    return _receive, (self.block, self.nbytes, self.layout, self.treedef)


def _plan(leaves: list[Any]) -> tuple[tuple[tuple[Any, ...], ...], int]:
  """Byte offsets (64-byte aligned) of the array leaves; the total size."""
  layout, end = [], 0
  for leaf in leaves:
    if _is_array(leaf):
      layout.append((leaf.dtype.str, end, leaf.shape))
      end += round_up(leaf.nbytes, _ALIGN)
    else:
      layout.append((None, leaf))
  return tuple(layout), end


def _is_array(leaf: Any) -> bool:
  return isinstance(leaf, np.ndarray) and not leaf.dtype.hasobject


def _copy_in(dest: np.ndarray, leaves: list[Any], layout: tuple[tuple[Any, ...], ...]) -> None:
  for leaf, entry in zip(leaves, layout):
    if entry[0] is not None:
      offset = entry[1]
      dest[offset : offset + leaf.nbytes] = np.ascontiguousarray(leaf).reshape(-1).view(np.uint8)


def _views(data: np.ndarray, layout: tuple[tuple[Any, ...], ...]) -> list[Any]:
  leaves = []
  for entry in layout:
    if entry[0] is None:
      leaves.append(entry[1])
    else:
      dtype, offset, shape = np.dtype(entry[0]), entry[1], entry[2]
      size = math.prod(shape) * dtype.itemsize
      leaves.append(data[offset : offset + size].view(dtype).reshape(shape))
  return leaves


def pack_arrays(element: Any) -> PackedArrays:
  """Copies the element's arrays into one plain byte buffer (no shared memory)."""
  leaves, treedef = jax.tree_util.tree_flatten(element)
  layout, nbytes = _plan(leaves)
  data = np.empty(nbytes, np.uint8)
  _copy_in(data, leaves, layout)
  return PackedArrays(None, data, nbytes, layout, treedef)


def unpack_arrays(packed: PackedArrays) -> Any:
  """The element of a plain packed buffer back, its arrays as views of it."""
  return jax.tree_util.tree_unflatten(packed.treedef, _views(packed.data, packed.layout))


class SharedBlockPool:
  """Worker side: shared-memory blocks, reused once the main process frees them."""

  def __init__(self):
    self._blocks: list[shared_memory.SharedMemory] = []
    # Runs when the pool goes or its process exits (multiprocessing children
    # skip atexit).
    mp_util.Finalize(self, _unlink_unclaimed, args=(self._blocks,), exitpriority=0)

  def pack(self, element: Any) -> PackedArrays:
    """Copies the element's arrays into a free block (a new one if none fits)."""
    leaves, treedef = jax.tree_util.tree_flatten(element)
    layout, nbytes = _plan(leaves)
    block = self._acquire(nbytes)
    _copy_in(np.frombuffer(block.buf, np.uint8, nbytes, _HEADER), leaves, layout)
    return PackedArrays(block.name, None, nbytes, layout, treedef)

  def _acquire(self, nbytes: int) -> shared_memory.SharedMemory:
    for block in self._blocks:
      if block.buf[_STATE] == _FREE and block.size - _HEADER >= nbytes:
        block.buf[_STATE] = _IN_USE
        return block
    size = round_up(nbytes + _HEADER, _GROWTH)
    block = shared_memory.SharedMemory(create=True, size=size)
    block.buf[_STATE] = _IN_USE
    self._blocks.append(block)
    return block

  def __reduce__(self):  # a pool lives in one process: a copy starts empty
    return SharedBlockPool, ()


def _unlink_unclaimed(blocks: list[shared_memory.SharedMemory]) -> None:
  for block in blocks:
    if not block.buf[_CLAIMED]:
      try:
        block.unlink()
      except FileNotFoundError:
        pass


class _AttachedBlock:
  """A worker's block mapped in the main process, claimed, its name unlinked at once.

  Mapped with shm_open and mmap, not SharedMemory(name=...): that registers
  the block with multiprocessing's resource tracker (which the workers
  share) once more, and when the worker, stopping, unlinked the block first,
  the second registration outlived both unlinks and the tracker warned of a
  leaked block at exit. The worker's creation registers the block once;
  whichever process's unlink succeeds unregisters it. The mapping ends when
  the last view of it is gone (`buf` holds it), its descriptor is closed now.
  """

  def __init__(self, name: str):
    self.name = name
    path = "/" + name
    fd = _posixshmem.shm_open(path, os.O_RDWR, mode=0o600)
    try:
      self.buf = memoryview(mmap.mmap(fd, os.fstat(fd).st_size))
    finally:
      os.close(fd)
    self.buf[_CLAIMED] = 1
    try:
      _posixshmem.shm_unlink(path)
    except FileNotFoundError:  # its worker, stopping, unlinked (and unregistered) it first
      return
    resource_tracker.unregister(path, "shared_memory")


def _release(header: memoryview) -> None:
  header[_STATE] = _FREE


# The blocks this process has mapped, by name, while anything uses them: a
# reused block's name is unlinked after its first mapping, so its next
# elements find the mapping here. Held by the elements received and not yet
# unpacked, and by the AttachedBlocks of the running input (one per Grain
# pipeline: a restart or a restore makes new ones and lets the old go).
_MAPPED: weakref.WeakValueDictionary[str, _AttachedBlock] = weakref.WeakValueDictionary()
_MAPPED_LOCK = threading.Lock()  # Grain receives from each worker in its own thread


def _mapped(name: str) -> _AttachedBlock:
  """The block's mapping in this process, made (claiming the block) the first time."""
  with _MAPPED_LOCK:
    block = _MAPPED.get(name)
    if block is None:
      block = _AttachedBlock(name)
      _MAPPED[name] = block
    return block


def _receive(name: str, nbytes: int, layout: tuple[tuple[Any, ...], ...], treedef: Any):
  """Unpickles a PackedArrays from a worker: maps and claims its block now.

  A block already gone was unlinked by its worker on exit: Grain is stopping
  it and empties its queue, dropping the element (unpacking it would fail).
  """
  try:
    block = _mapped(name)
  except FileNotFoundError:
    block = None
  return PackedArrays(name, None, nbytes, layout, treedef, block)


class AttachedBlocks:
  """Main side: maps each block once (unlinking its name) and frees it per batch."""

  def __init__(self):
    self._blocks: dict[str, _AttachedBlock] = {}

  def unpack(self, packed: PackedArrays) -> Any:
    block = packed.claim if packed.claim is not None else _mapped(packed.block)
    self._blocks[packed.block] = block
    # One array per batch, the .base of all its views: when it is collected,
    # no view of the batch is left and the worker may reuse the block.
    data = np.frombuffer(block.buf, np.uint8, packed.nbytes, _HEADER)
    weakref.finalize(data, _release, block.buf[0:_HEADER])
    return jax.tree_util.tree_unflatten(packed.treedef, _views(data, packed.layout))

  def __reduce__(self):  # mappings belong to one process: a copy starts empty
    return AttachedBlocks, ()


class PackArrays(grain.transforms.Map):
  """Worker side: element -> PackedArrays (one block of a reused pool, or
  with shared_memory=False one plain buffer)."""

  def __init__(self, shared_memory: bool = False):
    self.shared_memory = shared_memory
    self._pool = SharedBlockPool()

  def map(self, element: Any) -> PackedArrays:
    return self._pool.pack(element) if self.shared_memory else pack_arrays(element)


class UnpackArrays(grain.transforms.Map):
  """Main-process side: PackedArrays -> the original element (views)."""

  def __init__(self):
    self._attached = AttachedBlocks()

  def map(self, element: PackedArrays) -> Any:
    if element.block is None:
      return unpack_arrays(element)
    return self._attached.unpack(element)

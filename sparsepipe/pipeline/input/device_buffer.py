"""One host buffer per batch: packed where the batch is made, placed in one
transfer, split into the TrainBatch's arrays inside the train step.

Placing a TrainBatch array by array costs the main process one transfer
per array and device (labels, dense and four COO buffers per stack), each
with its Python and runtime overhead (and on a GPU its own host-to-device
copy). So the batch is packed into one int32 buffer of shape [L, W] (L
local devices, W words per device): row d holds device d's share of every
array (its slice of the leading dimension), each part 64-byte aligned.
`PackForDevices` runs after preprocessing, in the data workers when there
are any (the copy is theirs), and the buffer reaches the main process as
one array of one shared-memory block. `place_packed` puts it on the mesh
as one global array sharded over the data axis (on CPU devices an aligned
buffer is used in place, no copy): a DevicePackedBatch. A trainer built
from `abstract_packed_batch` splits it into its arrays in the step's own
program (`split_on_devices`: slices and bitcasts, the bits unchanged), so
the main process runs no program per batch but the step
(benchmarks/loader.py, table (f)); `DevicePackedBatch.unpacked()` splits
it in a program of its own, for anything else.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import grain
import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from sparsepipe.core.mesh import data_sharding
from sparsepipe.core.rounding import round_up

_WORD = np.dtype(np.int32)
_ALIGN_WORDS = 16  # 64 bytes: each part starts where XLA's CPU runtime can use it in place


@dataclasses.dataclass(frozen=True)
class PackedLayout:
  """Where each array of a batch sits in a device's row of the packed buffer.

  Attributes:
    treedef: the batch's pytree structure (a TrainBatch's).
    parts: per leaf, (word offset in the row, shape on one device, dtype str).
    words: W, words per device (a multiple of 16).
  """

  treedef: Any
  parts: tuple[tuple[int, tuple[int, ...], str], ...]
  words: int

  def arrays(self) -> dict[str, str]:
    """Each array's shape and dtype on one device, by name: e.g.
    {"labels": "(512,) float32", "sparse.lhs_gains.s0": "(8192,) float32", ...}."""
    leaves = jax.tree_util.tree_unflatten(self.treedef, list(range(len(self.parts))))
    paths = jax.tree_util.tree_flatten_with_path(leaves)[0]
    return {
      jax.tree_util.keystr(path, simple=True, separator="."): f"{shape} {np.dtype(dtype).name}"
      for (path, _), (_, shape, dtype) in zip(paths, self.parts)
    }

  def host_leaf(self, packed: np.ndarray, index: int) -> np.ndarray:
    """Leaf `index` as a view [L, *shape on one device] of the packed host buffer."""
    offset, shape, dtype = self.parts[index]
    size = math.prod(shape)
    return packed[:, offset : offset + size].view(dtype).reshape((packed.shape[0], *shape))


class PackedBatch(NamedTuple):
  """A batch packed for its devices: `data` [L, W] int32 laid out as `layout` says."""

  data: np.ndarray
  layout: PackedLayout


def layout_of(batch: Any, local_device_count: int) -> PackedLayout:
  """The packed layout of `batch` (a pytree of arrays of 4-byte dtypes, each
  with a leading dimension that the local devices divide)."""
  leaves, treedef = jax.tree_util.tree_flatten(batch)
  parts, end = [], 0
  for path, leaf in zip(jax.tree_util.tree_flatten_with_path(batch)[0], leaves):
    name = jax.tree_util.keystr(path[0])
    if leaf.dtype.itemsize != _WORD.itemsize:
      raise ValueError(f"batch array {name} has dtype {leaf.dtype}: packing takes 4-byte dtypes")
    if leaf.ndim == 0 or leaf.shape[0] % local_device_count:
      raise ValueError(
        f"batch array {name} has shape {leaf.shape}: its leading dimension must be a"
        f" multiple of the {local_device_count} local devices"
      )
    shape = (leaf.shape[0] // local_device_count, *leaf.shape[1:])
    parts.append((end, shape, leaf.dtype.str))
    end += round_up(math.prod(shape), _ALIGN_WORDS)
  return PackedLayout(treedef, tuple(parts), max(end, _ALIGN_WORDS))


def pack_batch(batch: Any, local_device_count: int) -> PackedBatch:
  """Copies `batch` into one [L, W] int32 buffer, device d's share in row d."""
  layout = layout_of(batch, local_device_count)
  data = np.zeros((local_device_count, layout.words), _WORD)
  for leaf, (offset, shape, _) in zip(jax.tree_util.tree_leaves(batch), layout.parts):
    size = math.prod(shape)
    rows = np.ascontiguousarray(leaf).reshape(local_device_count, size)
    data[:, offset : offset + size] = rows.view(_WORD)
  return PackedBatch(data, layout)


class PackForDevices(grain.transforms.Map):
  """PreprocessedBatch -> the same with its TrainBatch as a PackedBatch."""

  def __init__(self, local_device_count: int):
    self.local_device_count = int(local_device_count)

  def map(self, element: Any) -> Any:
    return element._replace(batch=pack_batch(element.batch, self.local_device_count))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DevicePackedBatch:
  """A packed batch on the mesh: `words` [G*W] int32 sharded over the data
  axis (device d's row of the packed buffer on device d), laid out as
  `layout` says (static: the pytree's aux data).

  A trainer built from one (`abstract_packed_batch`) splits it inside its
  own step (`split_on_devices`), so placing a batch is one transfer and no
  program of its own; `unpacked()` splits it in a program of its own.
  """

  words: Any
  layout: PackedLayout = dataclasses.field(metadata=dict(static=True))

  def unpacked(self) -> Any:
    """The batch's global arrays (e.g. a TrainBatch), split in a compiled program."""
    return _splitter(self.layout, self.words.sharding.mesh)(self.words)


def split_on_devices(batch: DevicePackedBatch, mesh: Mesh) -> Any:
  """The batch's global arrays, each device splitting its own row (slices and
  bitcasts: the bits are unchanged); traceable, e.g. inside a train step."""
  layout = batch.layout

  def split(row: jax.Array) -> Any:
    leaves = []
    for offset, shape, dtype in layout.parts:
      part = jax.lax.slice(row, (offset,), (offset + math.prod(shape),))
      if np.dtype(dtype) != _WORD:
        part = jax.lax.bitcast_convert_type(part, np.dtype(dtype))
      leaves.append(part.reshape(shape))
    return jax.tree_util.tree_unflatten(layout.treedef, leaves)

  spec = PartitionSpec(mesh.axis_names[0])
  return jax.shard_map(split, mesh=mesh, in_specs=spec, out_specs=spec)(batch.words)


@functools.lru_cache(maxsize=16)
def _splitter(layout: PackedLayout, mesh: Mesh):
  """`split_on_devices` of this layout compiled as a program of its own."""
  # out_shardings too: left to the compiler, an empty array (e.g. dense [B, 0] of a
  # dataset without dense columns) came out replicated, a sharding the step refused.
  return jax.jit(
    lambda words: split_on_devices(DevicePackedBatch(words, layout), mesh),
    out_shardings=data_sharding(mesh),
  )


def place_packed(packed: PackedBatch, mesh: Mesh) -> DevicePackedBatch:
  """The packed batch on the mesh, sharded over the data axis: one transfer."""
  flat = packed.data.reshape(-1)
  words = jax.make_array_from_process_local_data(
    data_sharding(mesh), flat, (mesh.size * packed.layout.words,)
  )
  return DevicePackedBatch(words, packed.layout)


def abstract_packed_batch(batch: Any, mesh: Mesh) -> DevicePackedBatch:
  """`batch` (global arrays or ShapeDtypeStructs, sharded over the data axis)
  as the DevicePackedBatch of ShapeDtypeStructs its placement makes: a
  trainer built from it takes the placed batches of `make_train_input`."""
  layout = layout_of(batch, mesh.size)
  words = jax.ShapeDtypeStruct((mesh.size * layout.words,), _WORD, sharding=data_sharding(mesh))
  return DevicePackedBatch(words, layout)


def abstract_arrays(batch: DevicePackedBatch, mesh: Mesh) -> Any:
  """The global arrays of a (abstract) DevicePackedBatch as ShapeDtypeStructs."""
  sharding = data_sharding(mesh)
  leaves = [
    jax.ShapeDtypeStruct((mesh.size * shape[0], *shape[1:]), np.dtype(dtype), sharding=sharding)
    for _, shape, dtype in batch.layout.parts
  ]
  return jax.tree_util.tree_unflatten(batch.layout.treedef, leaves)

"""COO buffers made for some COO limits, re-laid out for other limits on the same mesh.

Inside a device's buffer, SparseCore s owns segment s, and its partitions
sit at offsets that follow from the entries alone (partition p starts at
round8 of the row pointer before it, docs/reference/coo_format.md): the limits only
set the segment's length, C / S, and the exchange's entries per partition
(`StackLayout.capacity`). So a buffer made for one set of limits becomes one
for another by cutting or extending each segment's unwritten tail, with the
row pointers unchanged: the result is what the preprocessing writes for the
new limits from the same entries. Used when a pipeline run hands its
batches in flight to the next run after an FDO retune (pipelining/handover.py).
It runs on the host, shard by shard (each process its own devices' shards):
two batches' buffers are a few MB, and a program on the devices would be
one more compilation at every retune.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from sparsepipe.core.coo_types import SparseDenseMatmulInput
from sparsepipe.core.mesh import DATA_AXIS
from sparsepipe.pipeline.embedding.exchange import COO_FIELDS
from sparsepipe.pipeline.embedding.exchange import check_sparse_input
from sparsepipe.pipeline.embedding.exchange import partition_extents
from sparsepipe.pipeline.embedding.table_layout import stack_layouts
from sparsepipe.pipeline.embedding.variables import num_sparsecores
from sparsepipe.transforms.coo import buffer_sizes

_FILL = {
  "lhs_embedding_ids": buffer_sizes.INT_MAX,
  "lhs_sample_ids": buffer_sizes.INT_MAX,
  "lhs_gains": np.float32(np.nan),
}


class CooRelayoutError(ValueError):
  """A batch's COO entries do not fit the limits it is to be re-laid out for."""


def _needs(row_pointers: np.ndarray, num_sc: int, sparsecores: int) -> tuple[int, int]:
  """(most entries one SC's segment holds, padding included; most of one partition)
  in one device's row pointers."""
  starts, ends = partition_extents(row_pointers, num_sc, sparsecores, np)
  return int(((ends[:, -1] + 7) // 8 * 8).max()), int((ends - starts).max())


def _resized(x: jax.Array, devices: int, num_sc: int, segment: int, fill: Any) -> jax.Array:
  """Each SC's segment in every device's shard of `x` cut or extended (with `fill`) to
  `segment` entries."""
  shards = []
  for shard in x.addressable_shards:
    data = np.asarray(shard.data).reshape(num_sc, -1)
    if segment <= data.shape[1]:
      data = data[:, :segment]
    else:
      tail = np.full((num_sc, segment - data.shape[1]), fill, data.dtype)
      data = np.concatenate([data, tail], 1)
    shards.append(jax.device_put(data.reshape(-1), shard.device))
  shape = (devices * num_sc * segment,)
  return jax.make_array_from_single_device_arrays(shape, x.sharding, shards)


def relayout_coo_buffers(
  sparse_input: SparseDenseMatmulInput,
  feature_specs: Any,
  mesh: Mesh,
  *,
  num_sc_per_device: int,
) -> SparseDenseMatmulInput:
  """`sparse_input`'s buffers re-laid out for `feature_specs`' limits (see the module).

  Args:
    sparse_input: global COO buffers (flattened, sharded on the data axis),
      made for other limits of the same stacks on `mesh`.
    feature_specs: the prepared feature specs of the new limits.
    mesh: the mesh of both.
    num_sc_per_device: S.

  Returns:
    The buffers for `feature_specs`, sharded as `sparse_input`'s.

  Raises:
    CooRelayoutError: a SparseCore's entries or a partition's exceed the new
      limits (naming the stack, the entries and the limit); FDO's limits,
      maxima over every batch read, always hold the batches read.
  """
  g = int(mesh.shape[DATA_AXIS])
  layouts = stack_layouts(feature_specs, num_sparsecores(mesh, num_sc_per_device))
  segments = {
    name: buffer_sizes.compute_coo_buffer_size_per_device(layout.spec, num_sc_per_device, g)
    // num_sc_per_device
    for name, layout in layouts.items()
  }
  pointers = buffer_sizes.compute_row_pointers_size_per_device(g, num_sc_per_device)
  buffers = {name: tuple(getattr(sparse_input, f)[name] for f in COO_FIELDS) for name in layouts}
  for name, (rp, ids, _, _) in buffers.items():
    if rp.shape != (g * pointers,) or ids.shape[0] % (g * num_sc_per_device):
      raise CooRelayoutError(
        f"stack '{name}': COO buffers of shapes {rp.shape} and {ids.shape} were not made for"
        f" {g} devices with {num_sc_per_device} SparseCores each"
      )
  out = {field: {} for field in COO_FIELDS}
  for name in sorted(buffers):
    row_pointers = buffers[name][0]
    needs = [
      _needs(np.asarray(shard.data), num_sc_per_device, layouts[name].num_sparsecores)
      for shard in row_pointers.addressable_shards
    ]
    _check_fits(name, needs, layouts[name], segments[name])
    for field, x in zip(COO_FIELDS, buffers[name]):
      if field != "lhs_row_pointers" and x.shape[0] != g * num_sc_per_device * segments[name]:
        x = _resized(x, g, num_sc_per_device, segments[name], _FILL[field])
      out[field][name] = x
  out = SparseDenseMatmulInput(**out)
  check_sparse_input(out, layouts, g, num_sc_per_device)
  return out


def _check_fits(name: str, needs: list[tuple[int, int]], layout: Any, segment: int) -> None:
  used, most = max(u for u, _ in needs), max(m for _, m in needs)
  if used > segment:
    raise CooRelayoutError(
      f"stack '{name}': a SparseCore's COO segment holds {used} entries (padding included),"
      f" more than the {segment} of the new limits (suggested_coo_buffer_size_per_device)"
    )
  if most > layout.capacity:
    raise CooRelayoutError(
      f"stack '{name}': a partition holds {most} entries, more than the new"
      f" max_ids_per_partition allows ({layout.capacity} after rounding to 8)"
    )

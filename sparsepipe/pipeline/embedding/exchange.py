"""COO buffers -> fixed-size per-partition exchange between devices.

Shared by the lookup and the update; all functions below except
`check_sparse_input` run inside shard_map over the data axis, on one
device's shard.

On device d, SC s owns COO segment s of the device's buffer, where
partition p (the owning global SC) occupies [round8(rp[p-1]), rp[p]). Every
entry goes to slot (s, p, k) of a [S, N, K] send buffer, k its position in
its partition and K = round8(max_ids_per_partition) (the preprocessing
never writes more than max_ids_per_partition entries to one partition).
Unused slots carry the id `rows_per_sc` (out of range), sample id
`samples_per_sc`, gain 0 and valid=False.

Global SC p lives on device p // S as its local SC p % S, so one tiled
all_to_all over the data axis of the buffer viewed as [G, S, S, K]
(destination device, source SC, destination SC, slot) hands every owner the
[G, S, S, K] (source device, source SC, own SC, slot) ids it must serve; the
reverse all_to_all brings rows back in send-buffer order.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from sparsepipe.pipeline.embedding.table_layout import EmbeddingLayoutError
from sparsepipe.pipeline.embedding.table_layout import StackLayout
from sparsepipe.core.mesh import DATA_AXIS
from sparsepipe.transforms.coo import buffer_sizes
from sparsepipe.core.coo_types import SparseDenseMatmulInput

COO_FIELDS = ("lhs_row_pointers", "lhs_embedding_ids", "lhs_sample_ids", "lhs_gains")


def check_sparse_input(
  sparse_input: SparseDenseMatmulInput,
  layouts: dict[str, StackLayout],
  num_devices: int,
  num_sc_per_device: int,
) -> dict[str, tuple[Any, Any, Any, Any]]:
  """Checks shapes against the specs: {stack: (rp, ids, sids, gains)}."""
  out = {}
  pointers = buffer_sizes.compute_row_pointers_size_per_device(num_devices, num_sc_per_device)
  for name, layout in layouts.items():
    arrays = []
    for field in COO_FIELDS:
      mapping = getattr(sparse_input, field)
      if name not in mapping:
        raise EmbeddingLayoutError(f"sparse input {field} has no stack '{name}'")
      arrays.append(mapping[name])
    size = buffer_sizes.compute_coo_buffer_size_per_device(
      layout.spec, num_sc_per_device, num_devices
    )
    for field, array in zip(COO_FIELDS, arrays):
      per_device = pointers if field == "lhs_row_pointers" else size
      expected = (num_devices * per_device,)
      if tuple(array.shape) != expected:
        raise EmbeddingLayoutError(
          f"stack '{name}': {field} has shape {tuple(array.shape)}, expected"
          f" {expected} ({num_devices} devices, flattened; were the buffers"
          " made with these feature specs and has_leading_dimension=False?)"
        )
    out[name] = tuple(arrays)
  return out


def partition_extents(row_pointers: Any, num_sc: int, sparsecores: int, xp: Any = jnp):
  """(starts, ends) [S, N] of every partition in one device's COO segments, relative
  to its SC's segment: partition p ends at its row pointer and starts at round8 of
  the one before (xp: jnp inside the kernels, numpy on the host)."""
  ends = row_pointers.reshape(num_sc, -1)[:, :sparsecores].astype(xp.int32)
  previous = xp.concatenate([xp.zeros((num_sc, 1), xp.int32), ends[:, :-1]], 1)
  return (previous + 7) // 8 * 8, ends


def send_buffers(
  layout: StackLayout,
  num_sc_per_device: int,
  row_pointers: jax.Array,
  embedding_ids: jax.Array,
  sample_ids: jax.Array,
  gains: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """One device's COO segments -> (ids, sample ids, gains, valid) [S, N, K]."""
  s, n, k = num_sc_per_device, layout.num_sparsecores, layout.capacity
  segment = embedding_ids.shape[0] // s
  starts, ends = partition_extents(row_pointers, s, n)
  slot = jnp.arange(k, dtype=jnp.int32)
  valid = slot < (ends - starts)[:, :, None]
  base = jnp.arange(s, dtype=jnp.int32)[:, None, None] * segment
  position = jnp.where(valid, base + starts[:, :, None] + slot, 0)
  ids = jnp.where(valid, embedding_ids[position], layout.rows_per_sc)
  sids = jnp.where(valid, sample_ids[position], layout.samples_per_sc)
  gains = jnp.where(valid, gains[position], 0.0)
  return ids, sids, gains, valid


def to_owners(x: jax.Array, num_sc_per_device: int) -> jax.Array:
  """[S, N, K, ...] by destination -> [G, S, S, K, ...] by source, at owners."""
  s = num_sc_per_device
  g = x.shape[1] // s
  x = x.reshape(s, g, s, *x.shape[2:])
  x = jnp.swapaxes(x, 0, 1)  # [G dst, S src, S dst, K, ...]
  return jax.lax.all_to_all(x, DATA_AXIS, 0, 0, tiled=True)


def from_owners(x: jax.Array, num_sc_per_device: int) -> jax.Array:
  """Inverse of to_owners: [G, S, S, K, ...] at owners -> [S, N, K, ...]."""
  s = num_sc_per_device
  x = jax.lax.all_to_all(x, DATA_AXIS, 0, 0, tiled=True)  # [G own, S, S, K]
  x = jnp.swapaxes(x, 0, 1)  # [S src, G own, S own, K, ...]
  return x.reshape(s, -1, *x.shape[3:])


def local_rows(layout: StackLayout, owner_ids: jax.Array) -> jax.Array:
  """Owner-side ids [G, S, S, K] -> rows of the device's table shard.

  Invalid slots map to S * rows_per_sc, one past the shard's last row.
  """
  s = owner_ids.shape[2]
  own_sc = jnp.arange(s, dtype=jnp.int32)[None, None, :, None]
  rows = own_sc * layout.rows_per_sc + owner_ids
  return jnp.where(owner_ids < layout.rows_per_sc, rows, s * layout.rows_per_sc)

"""The embedding lookup (SparseCore forward) as portable JAX.

shard_map over the data axis: each device routes its COO entries to the
owning devices (embedding_exchange.py), the owners gather rows from their
table shard, the rows come back, are scaled by the gains and summed per
sample id into activations. Runs on CPU, GPU and TPU alike; cost grows with
the number of exchange slots (S * N * round8(max_ids_per_partition) per
device), never with the table size.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from sparsepipe.pipeline.embedding.exchange import check_sparse_input
from sparsepipe.pipeline.embedding.exchange import from_owners
from sparsepipe.pipeline.embedding.exchange import local_rows
from sparsepipe.pipeline.embedding.exchange import send_buffers
from sparsepipe.pipeline.embedding.exchange import to_owners
from sparsepipe.pipeline.embedding.table_layout import EmbeddingLayoutError
from sparsepipe.pipeline.embedding.table_layout import StackLayout
from sparsepipe.pipeline.embedding.table_layout import stack_layouts
from sparsepipe.pipeline.embedding.variables import EmbeddingVariables
from sparsepipe.pipeline.embedding.variables import num_sparsecores
from sparsepipe.core.mesh import DATA_AXIS
from sparsepipe.core.coo_types import SparseDenseMatmulInput


def _stack_activations(
  layout: StackLayout,
  num_sc_per_device: int,
  table: jax.Array,
  buffers: tuple[jax.Array, ...],
) -> jax.Array:
  """One device: its table shard and COO buffers -> [S, samples per SC, D]."""
  s, b = num_sc_per_device, layout.samples_per_sc
  ids, sids, gains, valid = send_buffers(layout, s, *buffers)
  rows = local_rows(layout, to_owners(ids, s))
  gathered = jnp.take(table, rows, axis=0, mode="fill", fill_value=0)
  values = from_owners(gathered, s)  # [S, N, K, D]
  values = jnp.where(valid[..., None], values * gains[..., None], 0.0)
  own_sc = jnp.arange(s, dtype=jnp.int32)[:, None, None]
  segments = jnp.where(valid, own_sc * b + sids, s * b)
  summed = jax.ops.segment_sum(
    values.reshape(-1, layout.dim), segments.reshape(-1), num_segments=s * b
  )
  return summed.reshape(s, b, layout.dim)


def _split_features(layout: StackLayout, activations: jax.Array) -> dict[str, jax.Array]:
  """[S, b, D] -> {feature: [S * n_f, out dim]}, device-local row s*n_f+j."""
  out = {}
  for slot in layout.features:
    start, rows = slot.sample_offset, slot.samples_per_sc
    dim = slot.spec.output_shape[-1]
    out[slot.spec.name] = activations[:, start : start + rows, :dim].reshape(-1, dim)
  return out


def sparse_dense_matmul(
  sparse_input: SparseDenseMatmulInput,
  embedding_variables: Mapping[str, EmbeddingVariables],
  feature_specs: Any,
  mesh: Mesh,
  *,
  num_sc_per_device: int,
) -> Any:
  """Embedding activations for every feature, from the COO buffers.

  Args:
    sparse_input: per-stack COO buffers of all devices, flattened
      (has_leading_dimension=False): row pointers (G*R*S,), ids, sample ids
      and gains (G*C,), sharded on the data axis (numpy arrays are sharded by
      jit).
    embedding_variables: {stack: EmbeddingVariables}; only tables are read.
    feature_specs: the prepared feature specs the buffers were made with
      (static).
    mesh: the mesh whose data axis the tables and buffers are sharded on.
    num_sc_per_device: S, as given to the preprocessing.

  Returns:
    A pytree shaped like feature_specs of float32 [global batch, output dim]
    activations, sharded on the data axis: row (d*S+s)*n_f + j of feature f
    is sample j of SC s on device d.
  """
  g = int(mesh.shape[DATA_AXIS])
  n = num_sparsecores(mesh, num_sc_per_device)
  layouts = stack_layouts(feature_specs, n)
  leaves = jax.tree.leaves(feature_specs)
  buffers = check_sparse_input(sparse_input, layouts, g, num_sc_per_device)
  tables = {}
  for name in layouts:
    if name not in embedding_variables:
      raise EmbeddingLayoutError(f"no embedding variables for stack '{name}'")
    tables[name] = embedding_variables[name].table

  def per_device(tables, buffers):
    out = {}
    for name, layout in layouts.items():
      acts = _stack_activations(layout, num_sc_per_device, tables[name], buffers[name])
      out.update(_split_features(layout, acts))
    return out

  spec = PartitionSpec(DATA_AXIS)
  by_name = jax.shard_map(per_device, mesh=mesh, in_specs=(spec, spec), out_specs=spec)(
    tables, buffers
  )
  return jax.tree.unflatten(jax.tree.structure(feature_specs), [by_name[f.name] for f in leaves])

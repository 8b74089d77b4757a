"""The embedding update (SparseCore backward) as portable JAX.

Per device, in shard_map over the data axis: every COO entry picks up the
activation gradient of its sample times its gain; the same exchange as the
lookup carries these row gradients to the devices owning the rows; there
duplicates are combined by a sort-based unique of static size (the number of
exchange slots) and a segment_sum, and the stack's optimizer updates the
touched rows and their slots in place (`.at[rows].set`). Memory and time
grow with the exchange size, never with the table size; with the state
donated, XLA updates the tables in place.

The row update is the optimizer spec's own (`update_rows`,
sparsepipe.core.optimizer_specs): it takes the touched rows of a table, their
slots and their combined gradient, and returns the new rows and slots. Rows
that no sample touched are never read nor written, so Adam is "lazy": its
moments decay only on the steps a row is used. The scalars that depend on the
step (learning-rate schedules, bias corrections) are computed once per step by
`step_hyperparameters`, outside shard_map.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from sparsepipe.pipeline.embedding.exchange import check_sparse_input
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
from sparsepipe.core.optimizer_specs import OptimizerSpec


class UnsupportedOptimizerError(ValueError):
  """An optimizer spec the embedding update does not implement."""


def _checked(optimizer: Any) -> OptimizerSpec:
  if not isinstance(optimizer, OptimizerSpec):
    raise UnsupportedOptimizerError(
      f"embedding optimizer {type(optimizer).__name__} is not supported:"
      " embedding optimizers derive from sparsepipe.core.OptimizerSpec"
    )
  return optimizer


def step_hyperparameters(optimizer: Any, step: jax.Array) -> tuple[jax.Array, ...]:
  """The optimizer's per-step scalars at `step` (updates applied before)."""
  return tuple(_checked(optimizer).update_hyperparameters(step))


def apply_rows(
  optimizer: Any,
  hyper: tuple[jax.Array, ...],
  rows: jax.Array,
  slots: tuple[jax.Array, ...],
  grads: jax.Array,
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
  """New (rows, slots) for touched rows [n, D] given their gradients [n, D]."""
  rows, slots = _checked(optimizer).update_rows(hyper, rows, slots, grads)
  return rows, tuple(slots)


def _stack_gradients(
  layout: StackLayout, local_grads: Mapping[str, jax.Array], s: int
) -> jax.Array:
  """{feature: [S * n_f, out dim]} -> [S, samples per SC, D] in sample order."""
  pieces = []
  for slot in layout.features:
    grad = local_grads[slot.spec.name].astype(jnp.float32)
    grad = grad.reshape(s, slot.samples_per_sc, -1)
    pad = layout.dim - grad.shape[-1]
    pieces.append(jnp.pad(grad, ((0, 0), (0, 0), (0, pad))))
  return jnp.concatenate(pieces, axis=1)


def _update_stack(
  layout: StackLayout,
  s: int,
  variables: EmbeddingVariables,
  buffers: tuple[jax.Array, ...],
  grads: jax.Array,
  hyper: jax.Array,
  step: jax.Array,
) -> EmbeddingVariables:
  """One device: route row gradients to owners and update touched rows."""
  b, dim = layout.samples_per_sc, layout.dim
  ids, sids, gains, valid = send_buffers(layout, s, *buffers)
  own_sc = jnp.arange(s, dtype=jnp.int32)[:, None, None]
  samples = jnp.where(valid, own_sc * b + sids, s * b)
  row_grads = jnp.take(grads.reshape(s * b, dim), samples, axis=0, mode="fill", fill_value=0)
  row_grads = jnp.where(valid[..., None], row_grads * gains[..., None], 0.0)
  rows = local_rows(layout, to_owners(ids, s)).reshape(-1)
  row_grads = to_owners(row_grads, s).reshape(-1, dim)
  size = rows.shape[0]
  shard_rows = variables.table.shape[0]
  touched, inverse = jnp.unique(rows, size=size, fill_value=shard_rows, return_inverse=True)
  combined = jax.ops.segment_sum(row_grads, inverse.reshape(-1), num_segments=size)
  read = lambda x: jnp.take(x, touched, axis=0, mode="fill", fill_value=0)
  new_rows, new_slots = apply_rows(
    layout.spec.optimizer,
    hyper,
    read(variables.table),
    tuple(read(x) for x in variables.slots),
    combined,
  )
  write = lambda x, v: x.at[touched].set(v, mode="drop")
  updated = variables.updated
  if updated is not None:  # the batch number of this update: `step` updates came before
    updated = updated.at[touched].set((step + 1).astype(jnp.int32), mode="drop")
  return EmbeddingVariables(
    write(variables.table, new_rows),
    tuple(write(x, v) for x, v in zip(variables.slots, new_slots)),
    updated,
  )


def sparse_dense_matmul_grad(
  activation_gradients: Any,
  sparse_input: SparseDenseMatmulInput,
  embedding_variables: Mapping[str, EmbeddingVariables],
  feature_specs: Any,
  mesh: Mesh,
  *,
  num_sc_per_device: int,
  step: Any,
) -> dict[str, EmbeddingVariables]:
  """Applies the embedding optimizer to the rows the batch touched.

  Args:
    activation_gradients: pytree shaped like feature_specs of [global batch,
      output dim] gradients w.r.t. the activations of sparse_dense_matmul,
      sharded on the data axis.
    sparse_input: the COO buffers the activations were computed from.
    embedding_variables: {stack: EmbeddingVariables}; donate them under jit
      for an in-place update.
    feature_specs: the prepared feature specs (static).
    mesh: the mesh of the tables and buffers.
    num_sc_per_device: S, as given to the preprocessing.
    step: number of updates applied before this one (jnp or Python int):
      drives learning-rate schedules and Adam's bias correction.

  Returns:
    The updated {stack: EmbeddingVariables}, same shapes and shardings.
  """
  g = int(mesh.shape[DATA_AXIS])
  s = num_sc_per_device
  layouts = stack_layouts(feature_specs, num_sparsecores(mesh, s))
  buffers = check_sparse_input(sparse_input, layouts, g, s)
  leaves = jax.tree.leaves(feature_specs)
  grad_leaves = jax.tree.structure(feature_specs).flatten_up_to(activation_gradients)
  grads = {}
  for feature, grad in zip(leaves, grad_leaves):
    expected = (feature.global_batch_size, feature.output_shape[-1])
    if tuple(grad.shape) != expected:
      raise EmbeddingLayoutError(
        f"feature '{feature.name}': activation gradient has shape"
        f" {tuple(grad.shape)}, expected {expected}"
      )
    grads[feature.name] = grad
  variables, hyper = {}, {}
  for name, layout in layouts.items():
    if name not in embedding_variables:
      raise EmbeddingLayoutError(f"no embedding variables for stack '{name}'")
    variables[name] = embedding_variables[name]
    slots = len(layout.spec.optimizer.slot_names())
    if len(variables[name].slots) != slots:
      raise EmbeddingLayoutError(
        f"stack '{name}': {len(variables[name].slots)} slots given, the optimizer has {slots}"
      )
    hyper[name] = step_hyperparameters(layout.spec.optimizer, step)

  def per_device(variables, buffers, grads, hyper, step):
    out = {}
    for name, layout in layouts.items():
      stacked = _stack_gradients(layout, grads, s)
      out[name] = _update_stack(
        layout, s, variables[name], buffers[name], stacked, hyper[name], step
      )
    return out

  spec = PartitionSpec(DATA_AXIS)
  return jax.shard_map(
    per_device,
    mesh=mesh,
    in_specs=(spec, spec, spec, PartitionSpec(), PartitionSpec()),
    out_specs=spec,
  )(variables, buffers, grads, hyper, jnp.asarray(step, jnp.int32))

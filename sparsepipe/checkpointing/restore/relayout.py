"""Re-laying out restored arrays when the device count changed.

When a checkpoint written on G_old devices is restored on G_new devices,
every array item is first read in its *saved* shapes onto the current
devices, its fingerprints are checked, and then a `Relayout` turns it into
the current layout:

- `resize_zero_padded` (the default for "train_state"): dense parameters are
  replicated and keep their shapes; ZeRO optimizer shards are flattened and
  zero-padded to a multiple of the device count, so only their trailing
  padding changes. Leaves are truncated or zero-extended, and truncating a
  nonzero value is refused: that would not be padding.
- `embedding_relayout` (must be given for "embeddings"): the MOD layout
  places logical row r on SparseCore r mod N, so the rows move; it calls
  pipeline.relayout_embedding_variables with the saved feature specs.

- `pipeline_state_relayout` (given by the caller for "pipeline_state"):
  of a PipelineState only the COO buffers of the (at most two) batches in
  flight depend on the layout; they are made again from those batches,
  whose global indices the checkpoint records (LoopPosition.in_flight), by a
  function of the caller (e.g. the input iterator's `batch_at`), for the
  current mesh and limits. Activations, activation gradients, dense inputs
  and aux values are per example or scalar: their global shapes do not
  depend on the device count, and they are only resharded.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Protocol

import jax
import jax.numpy as jnp

from sparsepipe import pipeline
from sparsepipe.checkpointing.checkpoint_errors import IncompatibleCheckpointError
from sparsepipe.checkpointing.metadata import CheckpointMetadata
from sparsepipe.checkpointing.metadata import RunInfo
from sparsepipe.checkpointing.leaf_paths import leaf_path


@dataclasses.dataclass(frozen=True)
class RelayoutContext:
  """What a Relayout knows about the save and the current run."""

  item: str
  where: str  # "checkpoint at DIR step N", for messages
  saved: CheckpointMetadata
  current: RunInfo


class Relayout(Protocol):
  """Turns an item read in its saved shapes into the target's layout."""

  def __call__(self, restored: Any, target: Any, context: RelayoutContext) -> Any: ...


@functools.partial(jax.jit, static_argnums=(1, 2))
def _resize(x: jax.Array, shape: tuple[int, ...], sharding: Any):
  keep = tuple(slice(0, min(a, b)) for a, b in zip(x.shape, shape))
  inside = jnp.ones((), bool)
  for axis, size in enumerate(shape):
    index = jax.lax.broadcasted_iota(jnp.int32, x.shape, axis)
    inside = inside & (index < size)
  dropped_nonzero = jnp.any((x != 0) & ~inside)
  pad = [(0, max(0, b - a)) for a, b in zip(x.shape, shape)]
  out = jnp.pad(x[keep], pad)
  return jax.lax.with_sharding_constraint(out, sharding), dropped_nonzero


def resize_zero_padded(restored: Any, target: Any, context: RelayoutContext):
  """Truncates or zero-extends leaves whose padded size changed.

  Exact for leaves whose part beyond the smaller shape is zero padding
  (ZeRO's flatten-and-pad); leaves of equal shape are only resharded.
  """

  def leaf(keypath, x, want):
    path = leaf_path(keypath)
    if tuple(x.shape) == tuple(want.shape):
      return jax.device_put(x, want.sharding)
    if x.ndim != len(want.shape):
      raise IncompatibleCheckpointError(
        f"{context.where}: cannot re-lay out item '{context.item}' leaf"
        f" '{path}' from shape {tuple(x.shape)} to {tuple(want.shape)}: the"
        " rank differs"
      )
    out, dropped_nonzero = _resize(x, tuple(want.shape), want.sharding)
    if bool(dropped_nonzero):
      raise IncompatibleCheckpointError(
        f"{context.where}: cannot re-lay out item '{context.item}' leaf"
        f" '{path}' from shape {tuple(x.shape)} ({context.saved.run.device_count}"
        f" devices) to {tuple(want.shape)} ({context.current.device_count}"
        " devices): the cut part holds nonzero values, so it is not zero"
        " padding"
      )
    return jax.device_put(out, want.sharding)

  return jax.tree_util.tree_map_with_path(leaf, restored, target)


def embedding_relayout(
  feature_specs: Any,
  mesh: jax.sharding.Mesh,
  *,
  num_sc_per_device: int,
  saved_feature_specs: Callable[[int], Any],
) -> Relayout:
  """A Relayout for `{stack: EmbeddingVariables}` between device counts.

  Args:
    feature_specs: the current run's prepared feature specs (for `mesh`).
    mesh: the current mesh.
    num_sc_per_device: SparseCores per device (the same before and after;
      it is part of the config).
    saved_feature_specs: global device count -> feature specs prepared for
      that many devices (the stacking offsets and rotations of the saved
      layout depend on it).

  The re-layout itself is pipeline.relayout_embedding_variables.
  """

  def relayout(restored: Any, target: Any, context: RelayoutContext) -> Any:
    del target  # The current layout follows from feature_specs and mesh.
    old = context.saved.run.device_count
    try:
      return pipeline.relayout_embedding_variables(
        restored,
        from_feature_specs=saved_feature_specs(old),
        from_device_count=old,
        feature_specs=feature_specs,
        mesh=mesh,
        num_sc_per_device=num_sc_per_device,
      )
    except ValueError as e:
      raise IncompatibleCheckpointError(
        f"{context.where}: cannot re-lay out item '{context.item}' from"
        f" {old} to {context.current.device_count} devices: {e}"
      ) from e

  return relayout


def _moved(restored: Any, target: Any, context: RelayoutContext, part: str) -> Any:
  """Leaves of the same global shape, put into the target's shardings."""

  def leaf(keypath, x, want):
    if tuple(x.shape) != tuple(want.shape):
      raise IncompatibleCheckpointError(
        f"{context.where}: item 'pipeline_state' leaf '{part}/{leaf_path(keypath)}' has shape"
        f" {tuple(x.shape)}, {tuple(want.shape)} on {context.current.device_count} devices;"
        " only the buffered COO inputs may change shape"
      )
    return jax.device_put(x, want.sharding)

  return jax.tree_util.tree_map_with_path(leaf, restored, target)


def pipeline_state_relayout(
  batch_inputs: Callable[[int], Any], fresh_state: Callable[[], Any]
) -> Relayout:
  """A Relayout for a PipelineState between device counts (see the module docstring).

  Args:
    batch_inputs: global batch index -> that batch's sparse (COO) inputs,
      made for the current mesh and limits.
    fresh_state: a PipelineState of the current layout at pipeline step 0
      (zeros: what the buffers hold where no batch is in flight).
  """

  def relayout(restored: Any, target: Any, context: RelayoutContext) -> Any:
    in_flight = context.saved.progress.in_flight
    if in_flight is None:
      if not context.saved.progress.pipeline_drained:
        raise IncompatibleCheckpointError(
          f"{context.where} holds a PipelineState with buffered inputs laid out for"
          f" {context.saved.run.device_count} devices, and it does not record which batches"
          f" they are (format {context.saved.format_version}); the current mesh has"
          f" {context.current.device_count} devices: resume on"
          f" {context.saved.run.device_count} devices, or from a drained checkpoint"
        )
      in_flight = (None, None)
    fresh = fresh_state()
    last, before = restored.last_step_inputs, restored.step_before_last_step_inputs
    want_last, want_before = target.last_step_inputs, target.step_before_last_step_inputs

    def sparse(index, fresh_inputs):
      return fresh_inputs if index is None else batch_inputs(int(index))

    return fresh.replace(
      pipeline_step=_moved(restored.pipeline_step, target.pipeline_step, context, "step"),
      last_step_inputs=fresh.last_step_inputs.replace(
        sparse_inputs=sparse(in_flight[0], fresh.last_step_inputs.sparse_inputs),
        dense_inputs=_moved(last.dense_inputs, want_last.dense_inputs, context, "last"),
        embedding_activations=_moved(
          last.embedding_activations, want_last.embedding_activations, context, "last"
        ),
        sc_fwd_aux=_moved(last.sc_fwd_aux, want_last.sc_fwd_aux, context, "last"),
      ),
      step_before_last_step_inputs=fresh.step_before_last_step_inputs.replace(
        sparse_inputs=sparse(in_flight[1], fresh.step_before_last_step_inputs.sparse_inputs),
        embedding_gradients=_moved(
          before.embedding_gradients, want_before.embedding_gradients, context, "before"
        ),
        tc_aux=_moved(before.tc_aux, want_before.tc_aux, context, "before"),
      ),
    )

  return relayout

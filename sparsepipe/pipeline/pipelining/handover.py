"""Handing a pipeline run's batches in flight to the next run, e.g. after an FDO retune.

A run that does not drain (`drains=False`) ends with two batches in its
PipelineState: the last one looked up (its activations wait for the TC
stage) and the one before it (its activation gradients wait for the SC
update). The next run starts `carried_in`: no fill step, its step 0 trains
on from there, so the schedule goes on as if one run had trained both (every
lookup sees every embedding update but the previous batch's), and no step
is spent filling and draining the pipeline.

The next run may have other COO limits (its own step). Of the state only
the sparse inputs depend on them (activations, gradients and dense inputs
are per example): `hand_over` re-lays them out with the new run's
`relayout_sparse` (which also checks that they fit its limits) and restarts
the pipeline step at 0.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from sparsepipe.pipeline.pipelining.pipeline_state import PipelineState


def hand_over(
  pipeline_state: PipelineState,
  abstract_state: PipelineState,
  sharding: PipelineState,
  relayout_sparse: Callable[[Any], Any] | None,
) -> PipelineState:
  """`pipeline_state` (a run's end, not drained) as the next run's, at its pipeline step 0.

  Args:
    pipeline_state: the PipelineState after the last step of a run that did
      not drain.
    abstract_state: the next run's abstract PipelineState (its shapes).
    sharding: the next run's PipelineState shardings.
    relayout_sparse: sparse inputs of the old run -> the next run's layout
      (None: they are kept as they are, and must have its shapes).

  Returns:
    The PipelineState to pass to the next run with `carried_in=True`.

  Raises:
    ValueError: a part of the state has another structure or shape in the
      next run (another batch size or model; or sparse inputs of other shapes
      and no relayout).
  """

  def sparse(inputs: Any) -> Any:
    return inputs if relayout_sparse is None else relayout_sparse(inputs)

  last = pipeline_state.last_step_inputs
  before = pipeline_state.step_before_last_step_inputs
  state = pipeline_state.replace(
    pipeline_step=jnp.zeros_like(pipeline_state.pipeline_step),
    last_step_inputs=last.replace(sparse_inputs=sparse(last.sparse_inputs)),
    step_before_last_step_inputs=before.replace(sparse_inputs=sparse(before.sparse_inputs)),
  )
  if jax.tree.structure(state) != jax.tree.structure(abstract_state):
    raise ValueError(
      "hand_over: the next run's PipelineState has another structure: a run hands its"
      " batches over only to a run of the same model and stages (drain it instead)"
    )
  paths = jax.tree_util.tree_flatten_with_path(state)[0]
  for (path, leaf), want in zip(paths, jax.tree.leaves(abstract_state)):
    if (tuple(leaf.shape), leaf.dtype) != (tuple(want.shape), want.dtype):
      raise ValueError(
        f"hand_over: the PipelineState's {jax.tree_util.keystr(path)} is"
        f" {leaf.dtype}{list(leaf.shape)}, the next run's {want.dtype}{list(want.shape)}:"
        " a run hands its batches over only to a run of the same model and batch"
        " shapes (drain it instead)"
      )
  return jax.device_put(state, sharding)

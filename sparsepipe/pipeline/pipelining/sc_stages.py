"""The default SC stages: the portable lookup and update kernels.

Types they exchange with the rest of the pipeline:
- sparse inputs: `SparseDenseMatmulInput` (the COO buffers of the batch);
- activations and their gradients: a pytree shaped like the feature specs
  of float32 [global batch, dim] arrays sharded on the data axis;
- SC fwd aux: None;
- TC aux (`DefaultTcAux`): an int32 scalar, the number of embedding updates
  applied before this batch's (the TC stage's train step before its own
  update, e.g. `TrainState.step`). The update kernel needs it for
  learning-rate schedules and Adam's bias correction, and only the TC stage
  knows it: the pipeline step restarts at 0 in every pipeline run;
- SC bwd aux: None.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from sparsepipe.pipeline.embedding.lookup import sparse_dense_matmul
from sparsepipe.pipeline.embedding.update import sparse_dense_matmul_grad
from sparsepipe.pipeline.pipelining.pipeline_state import ScBwdStageFun
from sparsepipe.pipeline.pipelining.pipeline_state import ScFwdStageFun
from sparsepipe.core.coo_types import SparseDenseMatmulInput

DefaultSparseInputs = SparseDenseMatmulInput
DefaultEmbeddingActivations = Any  # pytree like the feature specs
DefaultEmbeddingGradients = Any  # pytree like the feature specs
DefaultScFwdAux = type(None)
DefaultTcAux = jax.Array  # int32 scalar: embedding updates applied before
DefaultScBwdAux = type(None)


def get_default_sc_fwd_function(
  feature_specs: Any, mesh: Mesh, *, num_sc_per_device: int
) -> ScFwdStageFun:
  """SC fwd stage: `sparse_dense_matmul` over the mesh; aux None.

  Args:
    feature_specs: the prepared feature specs (static).
    mesh: the mesh the tables and buffers are sharded on.
    num_sc_per_device: S, as given to the preprocessing.

  Returns:
    `(sparse_inputs, embedding_variables) -> (activations, None)`.
  """

  def sc_fwd(sparse_inputs, embedding_variables):
    activations = sparse_dense_matmul(
      sparse_inputs,
      embedding_variables,
      feature_specs,
      mesh,
      num_sc_per_device=num_sc_per_device,
    )
    return activations, None

  return sc_fwd


def get_default_sc_bwd_function(
  feature_specs: Any, mesh: Mesh, *, num_sc_per_device: int
) -> ScBwdStageFun:
  """SC bwd stage: `sparse_dense_matmul_grad` with step = tc_aux; aux None.

  Args:
    feature_specs: the prepared feature specs (static).
    mesh: the mesh the tables and buffers are sharded on.
    num_sc_per_device: S, as given to the preprocessing.

  Returns:
    `(sparse_inputs, gradients, embedding_variables, tc_aux) ->
    (embedding_variables, None)`.
  """

  def sc_bwd(sparse_inputs, embedding_gradients, embedding_variables, tc_aux):
    step = jnp.asarray(tc_aux) if tc_aux is not None else None
    if step is None or step.shape != () or not jnp.issubdtype(step.dtype, jnp.integer):
      got = None if step is None else f"{step.dtype}{list(step.shape)}"
      raise ValueError(
        "default SC bwd stage: tc_aux must be the int32 scalar count of"
        f" embedding updates applied before this batch, got {got}; return"
        " the train step (before its update) as tc_aux from the TC stage"
      )
    variables = sparse_dense_matmul_grad(
      embedding_gradients,
      sparse_inputs,
      embedding_variables,
      feature_specs,
      mesh,
      num_sc_per_device=num_sc_per_device,
      step=step,
    )
    return variables, None

  return sc_bwd

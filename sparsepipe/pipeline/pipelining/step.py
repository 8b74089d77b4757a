"""One pipeline step: SC bwd(i-2) -> SC fwd(i), alongside TC(i-1).

    step | SC bwd | SC fwd | TC        fake_tc_step
    0    | -      | 0      | -         True   (fill)
    1    | -      | 1      | 0         False
    i    | i-2    | i      | i-1       False  (steady state)
    n    | n-2    | dummy  | n-1       False
    n+1  | n-1    | dummy  | -         True   (drain)

`step` is a pure function meant to be called inside the user's jitted train
step with `fake_tc_step` static: the fill and drain steps share one
compiled program, every other step shares another, so nothing retraces
after pipeline step 1. The SC stages of the steps where they have no batch
see zeros (the initial state's buffers, the dummy drain inputs), which for
COO buffers means "no ids": the tables stay untouched.

Gradient-multiplier mode (`num_steps` given): one program for every step,
no host-side branching. The TC stage always runs; on device, masks made
from `pipeline_state.pipeline_step` and `num_steps` keep the TC train state
unchanged and zero the embedding gradients, TC aux and output outside steps
1..num_steps. The masks are selects, not products, so NaNs computed on the
zero inputs of the fill and drain steps cannot leak.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from sparsepipe.pipeline.pipelining.pipeline_state import CurrentStepInput
from sparsepipe.pipeline.pipelining.pipeline_state import LastStepInput
from sparsepipe.pipeline.pipelining.pipeline_state import PipelineState
from sparsepipe.pipeline.pipelining.pipeline_state import ScBwdStageFun
from sparsepipe.pipeline.pipelining.pipeline_state import ScFwdStageFun
from sparsepipe.pipeline.pipelining.pipeline_state import StepBeforeLastStepInput
from sparsepipe.pipeline.pipelining.pipeline_state import TcStageFun


def _aval(x: Any) -> tuple[tuple[int, ...], Any, bool]:
  t = jax.typeof(x)
  return tuple(t.shape), t.dtype, bool(getattr(t, "weak_type", False))


def _conform(new: Any, old: Any, what: str) -> Any:
  """Checks a carried pytree keeps its structure, shapes and dtypes.

  Anything carried from one step to the next (pipeline state, train state,
  embedding variables) must keep one type, or the jitted step would retrace
  every step. Weak types are dropped so that step 0 (fed by the user) and
  the later steps (fed by this function) see identical avals.
  """
  new_def, old_def = jax.tree.structure(new), jax.tree.structure(old)
  if new_def != old_def:
    raise ValueError(
      f"pipeline step: {what} came out with structure {new_def}, but went"
      f" in with structure {old_def}; every stage must return the same"
      " structure at every step"
    )

  def fix(path, n, o):
    n = jnp.asarray(n)
    n_shape, n_dtype, n_weak = _aval(n)
    o_shape, o_dtype, _ = _aval(o)
    if n_shape != o_shape or n_dtype != o_dtype:
      raise ValueError(
        f"pipeline step: {what}{jax.tree_util.keystr(path)} came out as"
        f" {n_dtype}{list(n_shape)} but went in as {o_dtype}{list(o_shape)}"
      )
    return jax.lax.convert_element_type(n, n_dtype) if n_weak else n

  return jax.tree_util.tree_map_with_path(fix, new, old)


def _zeros_like(tree: Any) -> Any:
  return jax.tree.map(lambda x: jnp.zeros(jnp.shape(x), jnp.result_type(x)), tree)


def _select(valid: jax.Array, on_true: Any, on_false: Any) -> Any:
  return jax.tree.map(lambda a, b: jnp.where(valid, a, b), on_true, on_false)


def step(
  pipeline_input: CurrentStepInput,
  tc_train_state: Any,
  embedding_variables: Any,
  pipeline_state: PipelineState,
  sc_fwd_function: ScFwdStageFun,
  tc_function: TcStageFun,
  sc_bwd_function: ScBwdStageFun,
  *,
  fake_tc_step: bool,
  num_steps: jax.Array | None = None,
) -> tuple[Any, Any, Any, Any, PipelineState]:
  """Runs pipeline step i: SC bwd(i-2) -> SC fwd(i), and TC(i-1).

  Args:
    pipeline_input: the batch of step i (dummy zeros for the two drain steps).
    tc_train_state: the TC train state (dense params, optimizer state, ...).
    embedding_variables: the embedding variables (tables and slots).
    pipeline_state: the buffers left by steps i-1 and i-2.
    sc_fwd_function: SC forward stage.
    tc_function: TC forward/backward stage.
    sc_bwd_function: SC backward stage.
    fake_tc_step: static; True for the fill (0) and drain (num_steps+1)
      steps, where TC has no batch and is skipped.
    num_steps: int32 array; given, selects the gradient-multiplier mode
      (one program, on-device masks; `fake_tc_step` must then be False).

  Returns:
    (pipeline_output of batch i-1, sc_bwd_aux of batch i-2, new TC train
    state, new embedding variables, new pipeline state). The output is zeros
    where `is_output_valid(i, num_steps)` is False.
  """
  if num_steps is not None and fake_tc_step:
    raise ValueError(
      "fake_tc_step=True cannot be combined with the gradient-multiplier"
      " mode (num_steps given): that mode runs one program for every step"
    )
  last = pipeline_state.last_step_inputs
  before = pipeline_state.step_before_last_step_inputs
  old_embedding_variables = embedding_variables

  with jax.named_scope("pipelined_sc_bwd"):
    embedding_variables, sc_bwd_aux = sc_bwd_function(
      before.sparse_inputs,
      before.embedding_gradients,
      embedding_variables,
      before.tc_aux,
    )

  with jax.named_scope("pipelined_sc_fwd"):
    activations, sc_fwd_aux = sc_fwd_function(pipeline_input.sparse_inputs, embedding_variables)

  with jax.named_scope("pipelined_tc"):
    if fake_tc_step:
      output_shapes = jax.eval_shape(
        tc_function,
        last.embedding_activations,
        last.dense_inputs,
        tc_train_state,
        last.sc_fwd_aux,
      )[1]
      gradients = _zeros_like(before.embedding_gradients)
      output = _zeros_like(output_shapes)
      tc_aux = _zeros_like(before.tc_aux)
      new_tc_train_state = tc_train_state
    else:
      gradients, output, new_tc_train_state, tc_aux = tc_function(
        last.embedding_activations,
        last.dense_inputs,
        tc_train_state,
        last.sc_fwd_aux,
      )
      if num_steps is not None:
        i = pipeline_state.pipeline_step
        valid = jnp.logical_and(i >= 1, i <= num_steps)
        new_tc_train_state = _select(valid, new_tc_train_state, tc_train_state)
        gradients = _select(valid, gradients, _zeros_like(gradients))
        tc_aux = _select(valid, tc_aux, _zeros_like(tc_aux))
        output = _select(valid, output, _zeros_like(output))

  next_state = PipelineState(
    pipeline_step=pipeline_state.pipeline_step + 1,
    last_step_inputs=LastStepInput(
      sparse_inputs=pipeline_input.sparse_inputs,
      dense_inputs=pipeline_input.dense_inputs,
      embedding_activations=activations,
      sc_fwd_aux=sc_fwd_aux,
    ),
    step_before_last_step_inputs=StepBeforeLastStepInput(
      sparse_inputs=last.sparse_inputs,
      embedding_gradients=gradients,
      tc_aux=tc_aux,
    ),
  )
  next_state = _conform(next_state, pipeline_state, "the pipeline state")
  new_tc_train_state = _conform(new_tc_train_state, tc_train_state, "the TC train state")
  embedding_variables = _conform(
    embedding_variables, old_embedding_variables, "the embedding variables"
  )
  return output, sc_bwd_aux, new_tc_train_state, embedding_variables, next_state

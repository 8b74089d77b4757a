"""The forward-only eval step and the eval pass.

    eval batch -> SC fwd stage (the train step's lookup, same COO limits)
               -> predict_fn(params, dense, activations) -> [B] scores

The step reads the TrainState's params and embedding tables and writes
nothing: no donation, no optimizer state, no PipelineState, so evaluating
between training steps cannot change training. It is one jitted program
per set of feature specs (COO limits): every eval batch has the same static
shapes, padding included. Note that inside a pipelined run the embedding
updates of the last two batches are still in flight; evaluate a TrainState
from a drained pipeline to score the model after exactly its `step`
batches.

`evaluate` runs the pass: it keeps the scores, labels and masks of this
host's examples and merges them across hosts once at the end
(metrics.gather_examples_across_processes), so AUC is exact over the whole eval set.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from sparsepipe.core.batch import EvalBatch
from sparsepipe.core.mesh import data_sharding
from sparsepipe.pipeline.evaluation.metrics import EvalMetrics
from sparsepipe.pipeline.evaluation.metrics import compute_metrics
from sparsepipe.pipeline.evaluation.metrics import gather_examples_across_processes
from sparsepipe.pipeline.pipelining.sc_stages import get_default_sc_fwd_function
from sparsepipe.pipeline.pipelining.pipeline_state import ScFwdStageFun
from sparsepipe.pipeline.training.train_state import TrainState

# (params, dense [B, num_dense], activations pytree) -> [B] probabilities.
PredictFn = Callable[[Any, jax.Array, Any], jax.Array]
# (TrainState, EvalBatch) -> [B] float32 scores sharded over the data axis.
EvalStep = Callable[[TrainState, EvalBatch], jax.Array]


def make_eval_step(
  mesh: Mesh,
  feature_specs: Any,
  num_sc_per_device: int,
  predict_fn: PredictFn,
  *,
  sc_fwd_fn: ScFwdStageFun | None = None,
) -> EvalStep:
  """A jitted forward-only step: `(train_state, eval_batch) -> scores`.

  Args:
    mesh: the mesh the tables and batches are sharded on.
    feature_specs: the prepared feature specs of the train step (static).
    num_sc_per_device: S, as given to the preprocessing.
    predict_fn: the dense forward, e.g. `make_predict_fn(model, feature_specs)`.
    sc_fwd_fn: the SC fwd stage; default `get_default_sc_fwd_function`.

  Returns:
    A function of (TrainState, EvalBatch) giving [global batch] float32
    probabilities sharded over the data axis (padding included; the mask
    says which count). Only params and embedding tables are read.
  """
  if sc_fwd_fn is None:
    sc_fwd_fn = get_default_sc_fwd_function(
      feature_specs, mesh, num_sc_per_device=num_sc_per_device
    )

  def forward(params, embedding_variables, batch):
    activations, _ = sc_fwd_fn(batch.sparse, embedding_variables)
    return jnp.asarray(predict_fn(params, batch.dense, activations), jnp.float32)

  forward = jax.jit(forward, out_shardings=data_sharding(mesh))

  def eval_step(train_state: TrainState, eval_batch: EvalBatch) -> jax.Array:
    return forward(train_state.params, train_state.embedding_variables, eval_batch.batch)

  return eval_step


def _host_local(x: Any) -> np.ndarray:
  """This process's rows of a data-sharded array (numpy passes through)."""
  if not isinstance(x, jax.Array):
    return np.asarray(x)
  shards = {}
  for shard in x.addressable_shards:
    start = (shard.index[0].start or 0) if shard.index else 0
    shards.setdefault(start, shard)
  return np.concatenate([np.asarray(shards[k].data).reshape(-1) for k in sorted(shards)])


def evaluate(
  eval_step: EvalStep,
  train_state: TrainState,
  eval_batches: Iterable[EvalBatch],
  *,
  stop: Callable[[], bool] | None = None,
) -> EvalMetrics | None:
  """One eval pass: metrics over every real example of every host.

  Args:
    eval_step: from `make_eval_step`.
    train_state: the model to score (read only).
    eval_batches: EvalBatch of global arrays, e.g. one iteration of
      `make_eval_input(...)`; every host must give the same number.
    stop: optional, asked before every batch: True abandons the pass (e.g.
      a stop signal: the eval would outlast a preemption's grace period).
      Every process must answer alike (the passes' steps are collectives).

  Returns:
    EvalMetrics over the whole eval set (the same on every process), or
    None if `stop` abandoned the pass.
  """
  labels, scores, masks = [], [], []

  def collect(out, batch):
    scores.append(_host_local(out))
    labels.append(_host_local(batch.batch.labels))
    masks.append(_host_local(batch.mask))

  pending = None
  for batch in eval_batches:
    if stop is not None and stop():
      return None
    out = eval_step(train_state, batch)
    if pending is not None:  # fetch the previous scores while this step runs
      collect(*pending)
    pending = (out, batch)
  if pending is not None:
    collect(*pending)
  merged_labels, merged_scores = gather_examples_across_processes(
    *(np.concatenate(xs) if xs else np.zeros(0, np.float32) for xs in (labels, scores, masks))
  )
  return compute_metrics(merged_labels, merged_scores)

"""The training loop: one pipeline run of `num_batches` batches, with hooks.

A pipeline run trains `num_batches` batches in `num_batches + 2` pipeline
steps (`trainer.pipeline_steps`; without pipelining, `num_batches`); exactly
one batch is read per pipeline step i < num_batches, none during the drain.
After every step the loop calls its hooks with a `StepResult`; a hook
returning True stops the loop at that boundary. Checkpoints, preemption,
metrics and evaluation are hooks (the job in sparsepipe.launch plugs in its
own); FDO retuning happens between runs.

Stopping and resuming. Every pipeline step boundary is a valid stopping
point. After pipeline step i has run, the iterator has yielded batches
0..min(i, num_batches-1) and `pipeline_state.pipeline_step == i + 1`. Save
(TrainState, PipelineState, iterator state) there; to resume, restore them
and call `train` again with the restored `pipeline_state` and iterator and
the same `num_batches`: the loop starts at the saved pipeline step, so the
resumed run is bit-identical to an uninterrupted one. Hooks must not keep
references to the device arrays after returning (the next step donates
them): take host copies or let Orbax copy them (it does, even for async
saves).

New COO limits (FDO) mean new programs: build a new trainer from the new
specs and start the next run. Either finish the current run (its drain
steps apply every pending embedding update) and start the next with
`pipeline_state=None`, or end it without a drain (`drain=False`: its last
two batches stay in flight), hand its PipelineState over
(`trainer.hand_over`, which re-lays out their COO buffers for the new
limits) and start the next with `carried_in=True`: no step is spent
filling and draining, and the two runs train as one would. Runs chain
exactly: TrainState.step, which drives the embedding update's step, keeps
counting. Other shapes (batch size, model) need the drain.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

import jax
import numpy as np

from sparsepipe.pipeline.pipelining import pipeline_state as ps
from sparsepipe.pipeline.training.train_state import TrainState
from sparsepipe.pipeline.training.trainer import Trainer


@dataclasses.dataclass(frozen=True)
class StepResult:
  """What the hooks see after a pipeline step.

  Attributes:
    next_pipeline_step: the pipeline step a resumed run would start at.
    pipeline_steps: pipeline steps of this run.
    batch_index: the batch (within this run) whose TC output this step
      produced, or None (fill and drain steps).
    output: the TC output of that batch (device arrays), or None.
    data_wait_seconds: time spent waiting for this step's batch.
    train_state: the state after the step (donated by the next step).
    pipeline_state: the PipelineState after the step (likewise).
  """

  next_pipeline_step: int
  pipeline_steps: int
  batch_index: int | None
  output: Any
  data_wait_seconds: float
  train_state: TrainState
  pipeline_state: ps.PipelineState

  @property
  def finished(self) -> bool:
    """True after the last step of the run (its drain, if it drains)."""
    return self.next_pipeline_step == self.pipeline_steps


StepHook = Callable[[StepResult], Any]


@dataclasses.dataclass(frozen=True)
class TrainMetrics:
  """What one `train` call measured (JSON-able with dataclasses.asdict).

  Attributes:
    batch_indices: index (within the pipeline run) of each batch whose TC
      output this call produced, i.e. pipeline step - 1.
    losses: its loss (output["loss"]), same order; empty if no loss.
    first_pipeline_step: the pipeline step this call started at.
    next_pipeline_step: the pipeline step a resumed call would start at.
    finished: True when the pipeline run is complete (its drain steps run, if any).
    examples: examples trained by this call (valid TC steps * global batch).
    seconds: wall time of this call's steps, to the last result.
    examples_per_second: examples / seconds.
  """

  batch_indices: tuple[int, ...]
  losses: tuple[float, ...]
  first_pipeline_step: int
  next_pipeline_step: int
  finished: bool
  examples: int
  seconds: float
  examples_per_second: float


def loss_of(output: Any) -> Any:
  """output["loss"] or output.loss, else None."""
  if isinstance(output, Mapping):
    return output.get("loss")
  return getattr(output, "loss", None)


def _start_step(pipeline_state: ps.PipelineState, num_batches: int, total: int) -> int:
  start = int(jax.device_get(pipeline_state.pipeline_step))
  if not 0 <= start <= total:
    raise ValueError(
      f"pipeline_state is at pipeline step {start}, outside 0..{total} for"
      f" num_batches={num_batches}"
    )
  return start


def _next_batch(data_iterator: Iterator[Any], i: int, num_batches: int) -> tuple[Any, float]:
  """(batch of pipeline step i or None during the drain, seconds waited)."""
  if i >= num_batches:
    return None, 0.0
  t0 = time.perf_counter()
  try:
    batch = next(data_iterator)
  except StopIteration:
    raise ValueError(f"data iterator ended at batch {i}; num_batches={num_batches}") from None
  return batch, time.perf_counter() - t0


def train(
  trainer: Trainer,
  train_state: TrainState,
  data_iterator: Iterator[Any],
  num_batches: int,
  *,
  pipeline_state: ps.PipelineState | None = None,
  max_pipeline_steps: int | None = None,
  hooks: Sequence[StepHook] = (),
  carried_in: bool = False,
  drain: bool = True,
) -> tuple[TrainState, ps.PipelineState, TrainMetrics]:
  """Runs (part of) a pipeline run of `num_batches` batches.

  Args:
    trainer: from `make_trainer`.
    train_state: the TrainState (donated: use the returned one).
    data_iterator: yields the batches.
    num_batches: batches of the whole pipeline run (not of this call).
    pipeline_state: None to start a fresh run at pipeline step 0, or a saved
      PipelineState to continue at its `pipeline_step`.
    max_pipeline_steps: run at most this many pipeline steps in this call.
    hooks: called in order after every pipeline step with its StepResult;
      a truthy return stops the loop at that boundary (the remaining hooks
      of that step still run).
    carried_in: the run starts with the previous run's last two batches in
      flight (`pipeline_state` from `trainer.hand_over`): no fill step, and
      step 0 trains the previous run's last batch (batch index -1).
    drain: False ends the run after its last batch's lookup, with its last
      two batches in flight, for a run `carried_in` (pipelined mode only).

  Returns:
    (train_state, pipeline_state, metrics). The pipeline_state can be saved
    and passed back to continue.
  """
  if (carried_in or not drain) and not trainer.fills_and_drains:
    raise ValueError(
      "carried_in and drain=False need the pipelined step with fill and drain programs;"
      f" this trainer has pipelining={trainer.pipelining},"
      f" gradient_multiplier={trainer.gradient_multiplier}"
    )
  if pipeline_state is None:
    if carried_in:
      raise ValueError("carried_in needs the pipeline_state handed over by trainer.hand_over")
    pipeline_state = trainer.initial_pipeline_state()
  total = trainer.pipeline_steps(num_batches, drains=drain)
  start = i = _start_step(pipeline_state, num_batches, total)
  end = total
  if max_pipeline_steps is not None:
    end = min(end, start + max_pipeline_steps)
  outputs: list[tuple[int, Any]] = []
  t0 = time.perf_counter()
  while i < end:
    batch, waited = _next_batch(data_iterator, i, num_batches)
    train_state, pipeline_state, output = trainer.run_pipeline_step(
      train_state,
      pipeline_state,
      batch,
      trainer.fake_tc_step(i, num_batches, carried_in=carried_in),
      num_batches=num_batches,
    )
    batch_index = trainer.output_batch(i, num_batches, carried_in=carried_in)
    if batch_index is not None:
      outputs.append((batch_index, loss_of(output)))
    i += 1
    result = StepResult(
      next_pipeline_step=i,
      pipeline_steps=total,
      batch_index=batch_index,
      output=None if batch_index is None else output,
      data_wait_seconds=waited,
      train_state=train_state,
      pipeline_state=pipeline_state,
    )
    if any([bool(hook(result)) for hook in hooks]):
      break
  jax.block_until_ready((train_state, pipeline_state))
  seconds = time.perf_counter() - t0
  losses = jax.device_get([loss for _, loss in outputs])
  examples = len(outputs) * trainer.global_batch_size
  metrics = TrainMetrics(
    batch_indices=tuple(b for b, _ in outputs),
    losses=tuple(float(np.asarray(loss)) for loss in losses if loss is not None),
    first_pipeline_step=start,
    next_pipeline_step=i,
    finished=i == total,
    examples=examples,
    seconds=seconds,
    examples_per_second=examples / max(seconds, 1e-9),
  )
  return train_state, pipeline_state, metrics

"""The pipelined trainer: stages, shardings and the jitted, donating step.

`make_trainer` builds a `Trainer` from a TrainState, an
example batch and the stage functions; `train` (loop.py) drives it. A
pipeline run of n batches takes n + 2 pipeline steps: step i feeds batch i
(i < n) or zero dummies (the two drain steps), and its TC output belongs
to batch i-1 (pipelining/step.py has the schedule).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sparsepipe.pipeline.embedding import coo_relayout
from sparsepipe.pipeline.input import device_buffer
from sparsepipe.pipeline.pipelining import handover
from sparsepipe.pipeline.pipelining import pipeline_state as ps
from sparsepipe.pipeline.training.tc_stage import DenseInputs
from sparsepipe.pipeline.pipelining.step import step as pipeline_step_fn
from sparsepipe.pipeline.pipelining.sc_stages import get_default_sc_bwd_function
from sparsepipe.pipeline.pipelining.sc_stages import get_default_sc_fwd_function
from sparsepipe.pipeline.training.train_state import TrainState
from sparsepipe.core.batch import TrainBatch
from sparsepipe.core.mesh import check_mesh, data_sharding


def batch_to_pipeline_input(batch: TrainBatch) -> ps.CurrentStepInput:
  """TrainBatch -> CurrentStepInput(sparse COO buffers, DenseInputs)."""
  return ps.CurrentStepInput(
    sparse_inputs=batch.sparse,
    dense_inputs=DenseInputs(labels=batch.labels, dense=batch.dense),
  )


def _sharding_of(tree: Any, what: str) -> Any:
  def get(path, x):
    sharding = getattr(x, "sharding", None)
    if sharding is None:
      raise ValueError(
        f"{what}{jax.tree_util.keystr(path)} has no sharding; pass jax.Arrays"
        " or ShapeDtypeStructs with shardings"
      )
    return sharding

  return jax.tree_util.tree_map_with_path(get, tree)


def _order(
  pipeline_input: Any,
  train_state: Any,
  pipeline_state: ps.PipelineState,
  *,
  packed: bool = False,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
  """Splits the step's arguments into (donated, kept), ordered for aliasing.

  jax pairs each output with the first donated input of the same per-device
  shape and dtype, in argument order. This order makes every new buffer
  reuse the old one that XLA can overwrite without a copy: the train state
  its own buffers; the new batch's buffers become the step i-1 inputs in
  place; the step i-1 sparse inputs become the step i-2 ones in place; the
  new activations (written by SC fwd, after SC bwd has read the step i-2
  gradients) take the old gradients' buffers, and the new gradients
  (written by TC after it has read the step i-1 activations) the old
  activations'. With the default order the activations and gradients
  overwrote their own old buffers, which the other stage still reads, and
  the train state could take the batch's buffers: XLA copied both ways.
  The step i-2 sparse inputs and the step i-1 dense inputs have no output
  to go to, so they are kept (not donated) rather than donated unusably;
  so is the step i-2 TC aux (its new value is a copy of the train step,
  and overwriting the old one in place made XLA copy it first). A packed
  input (`packed`: one buffer the step splits) has no output of its shape
  either: it is kept, and the split writes the step i-1 inputs anew.
  """
  last = pipeline_state.last_step_inputs
  before = pipeline_state.step_before_last_step_inputs
  donated = (
    train_state,
    pipeline_state.pipeline_step,
    None if packed else pipeline_input,
    before.embedding_gradients,
    last.sparse_inputs,
    last.embedding_activations,
    last.sc_fwd_aux,
  )
  kept = (
    before.sparse_inputs,
    last.dense_inputs,
    before.tc_aux,
    pipeline_input if packed else None,
  )
  return donated, kept


def _unorder(donated: tuple[Any, ...], kept: tuple[Any, ...]) -> tuple[Any, Any, ps.PipelineState]:
  """Inverse of `_order`: (pipeline_input, train_state, pipeline_state)."""
  (
    train_state,
    pipeline_step,
    pipeline_input,
    before_gradients,
    last_sparse,
    last_activations,
    last_sc_fwd_aux,
  ) = donated
  before_sparse, last_dense, before_tc_aux, packed_input = kept
  if pipeline_input is None:
    pipeline_input = packed_input
  pipeline_state = ps.PipelineState(
    pipeline_step=pipeline_step,
    last_step_inputs=ps.LastStepInput(
      sparse_inputs=last_sparse,
      dense_inputs=last_dense,
      embedding_activations=last_activations,
      sc_fwd_aux=last_sc_fwd_aux,
    ),
    step_before_last_step_inputs=ps.StepBeforeLastStepInput(
      sparse_inputs=before_sparse,
      embedding_gradients=before_gradients,
      tc_aux=before_tc_aux,
    ),
  )
  return pipeline_input, train_state, pipeline_state


@dataclasses.dataclass(frozen=True)
class Trainer:
  """The stages, shardings and jitted step of one pipelined training setup.

  Build it with `make_trainer`. The jitted step donates the train
  state, the input and every pipeline state buffer an output can reuse
  (see `_order`) and has explicit in/out shardings, so no step copies the
  state; `fake_tc_step` is static (two programs), or, with
  `gradient_multiplier=True`, one program serves all steps.

  With `pipelining=False` (sequential mode: the faster one where the stages
  cannot overlap, see `pipelining_pays_off`; also to measure what
  pipelining costs in model quality) one step runs the lookup, the
  dense step and the embedding update of the same batch: a run of n batches
  takes n steps, and the PipelineState's buffers stay unused (zeros), so
  checkpoints have the same layout in both modes.

  With `packed_input` (built from `abstract_packed_batch`) the step takes
  the DevicePackedBatch that `make_train_input` places and splits it in its
  own program; otherwise it takes TrainBatches (a DevicePackedBatch is
  split first, in a program of its own).
  """

  mesh: Mesh
  sc_fwd_function: ps.ScFwdStageFun
  tc_function: ps.TcStageFun
  sc_bwd_function: ps.ScBwdStageFun
  input_fn: Callable[[Any], ps.CurrentStepInput]
  train_state_sharding: TrainState
  pipeline_state_sharding: ps.PipelineState
  input_sharding: ps.CurrentStepInput
  abstract_input: ps.CurrentStepInput
  abstract_pipeline_state: ps.PipelineState
  global_batch_size: int
  gradient_multiplier: bool
  jitted_step: Any = dataclasses.field(repr=False)
  pipelining: bool = True
  packed_input: bool = False
  feature_specs: Any = dataclasses.field(default=None, repr=False)  # the COO buffers' (hand_over)
  num_sc_per_device: int | None = None
  trace_log: list[bool] = dataclasses.field(default_factory=list, repr=False)
  num_batches_arrays: dict[int, jax.Array] = dataclasses.field(
    default_factory=dict, repr=False, compare=False
  )

  @property
  def traced_programs(self) -> tuple[bool, ...]:
    """`fake_tc_step` of every trace of the jitted step so far (one per program).

    (True, False) after any number of steps of a run: fill and drain share
    one program, all other steps another; (False,) in gradient-multiplier
    mode. A longer tuple means something retraced (e.g. new shapes).
    """
    return tuple(self.trace_log)

  def _num_batches_array(self, num_batches: int) -> jax.Array:
    """`num_batches` as a replicated int32 array, made once per value.

    A fresh jnp.asarray per step would cost a host transfer and a reshard
    to every device at each step (~0.2 ms on CPU).
    """
    num = self.num_batches_arrays.get(num_batches)
    if num is None:
      num = jax.device_put(np.int32(num_batches), NamedSharding(self.mesh, PartitionSpec()))
      self.num_batches_arrays[num_batches] = num
    return num

  @property
  def fills_and_drains(self) -> bool:
    """Whether a run has fill and drain steps (the pipelined step with two programs,
    not gradient-multiplier mode): only such runs hand their batches in flight over."""
    return self.pipelining and not self.gradient_multiplier

  def pipeline_steps(self, num_batches: int, *, drains: bool = True) -> int:
    """Pipeline steps of a run of `num_batches` batches (a drain adds 2)."""
    if not self.pipelining:
      return num_batches
    return ps.get_pipeline_train_steps(num_batches, drains=drains)

  def fake_tc_step(self, pipeline_step: int, num_batches: int, *, carried_in: bool = False) -> bool:
    """The static `fake_tc_step` of pipeline step `pipeline_step`."""
    if not self.fills_and_drains:
      return False
    return ps.is_fake_tc_step(pipeline_step, num_batches, carried_in=carried_in)

  def output_batch(
    self, pipeline_step: int, num_batches: int, *, carried_in: bool = False
  ) -> int | None:
    """The batch (index in the run; -1: the previous run's last, when `carried_in`)
    whose TC output pipeline step `pipeline_step` produces, or None."""
    if not self.pipelining:
      return pipeline_step
    valid = ps.is_output_valid(pipeline_step, num_batches, carried_in=carried_in)
    return pipeline_step - 1 if valid else None

  def hand_over(self, pipeline_state: ps.PipelineState) -> ps.PipelineState:
    """A run's PipelineState (ended without a drain) for a `carried_in` run of this
    trainer, its COO buffers re-laid out for this trainer's limits (pipelining/handover.py)."""
    if not self.fills_and_drains:
      raise ValueError(
        "hand_over needs the pipelined step with fill and drain programs"
        f" (pipelining={self.pipelining}, gradient_multiplier={self.gradient_multiplier})"
      )
    relayout = None
    if self.feature_specs is not None:
      relayout = functools.partial(
        coo_relayout.relayout_coo_buffers,
        feature_specs=self.feature_specs,
        mesh=self.mesh,
        num_sc_per_device=self.num_sc_per_device,
      )
    return handover.hand_over(
      pipeline_state, self.abstract_pipeline_state, self.pipeline_state_sharding, relayout
    )

  def initial_pipeline_state(self) -> ps.PipelineState:
    """The PipelineState of a fresh pipeline run (pipeline step 0, zeros)."""
    return ps.zeros_from_abstract(self.abstract_pipeline_state, self.pipeline_state_sharding)

  def lower_step(self, train_state: TrainState, fake_tc_step: bool = False) -> jax.stages.Lowered:
    """The jitted step lowered for `train_state`'s shapes (concrete or abstract).

    `.compile().memory_analysis()` tells what a step holds per device:
    `alias_size_in_bytes`, the outputs written into donated buffers, is the
    train and pipeline states' bytes but the TC aux scalar (a table or slot
    not donated would be held twice) and, for a packed input, the step i-1
    inputs (the split writes them anew), and `temp_size_in_bytes` the
    step's scratch (benchmarks/memory.py).
    """
    return self.jitted_step.lower(*self._abstract_args(train_state, fake_tc_step))

  def _abstract_args(self, train_state: TrainState, fake_tc_step: bool) -> tuple[Any, ...]:
    abstract = _with_shardings(
      jax.tree.map(ps.abstract_leaf, train_state), self.train_state_sharding
    )
    num = jax.ShapeDtypeStruct((), np.int32, sharding=NamedSharding(self.mesh, PartitionSpec()))
    return self.abstract_input, abstract, self.abstract_pipeline_state, num, bool(fake_tc_step)

  def compile_ahead(self, train_state: TrainState, *, fill_and_drain: bool = True) -> None:
    """Compiles every program a run of this step uses, for `train_state`'s shapes
    (concrete or abstract), so that no step of the run compiles: e.g. in a
    background thread while the step of other COO limits trains (FDO).
    `fill_and_drain=False`: only the steady program (a run carried in that
    hands its batches over in turn has no fill or drain step)."""
    programs = (True, False) if self.fills_and_drains and fill_and_drain else (False,)
    for fake_tc_step in programs:
      self.jitted_step.compile_ahead(*self._abstract_args(train_state, fake_tc_step))

  def run_pipeline_step(
    self,
    train_state: TrainState,
    pipeline_state: ps.PipelineState,
    batch: Any | None,
    fake_tc_step: bool,
    *,
    num_batches: int | None = None,
  ) -> tuple[TrainState, ps.PipelineState, Any]:
    """Runs one pipeline step; donates `train_state` and `pipeline_state`.

    Args:
      train_state: the TrainState (donated).
      pipeline_state: the PipelineState (donated; use the returned one).
      batch: the batch of this step (a DevicePackedBatch for a trainer built
        from one; else a TrainBatch for the default input_fn, or a
        DevicePackedBatch, split first), or None for a drain step (zero
        dummies shaped by the state).
      fake_tc_step: `is_fake_tc_step(pipeline step, num_batches)`; must be
        False in gradient-multiplier mode.
      num_batches: batches of this pipeline run; required in
        gradient-multiplier mode (the on-device masks need it).

    Returns:
      (new TrainState, new PipelineState, TC output of batch i-1; zeros when
      the step has no valid output).
    """
    if self.gradient_multiplier:
      if fake_tc_step:
        raise ValueError(
          "gradient-multiplier mode runs one program for every step: fake_tc_step must be False"
        )
      if num_batches is None:
        raise ValueError("gradient-multiplier mode needs num_batches")
    num = self._num_batches_array(-1 if num_batches is None else num_batches)
    train_state, pipeline_state, output = self.jitted_step(
      self._step_input(batch), train_state, pipeline_state, num, bool(fake_tc_step)
    )
    return train_state, pipeline_state, output

  def _step_input(self, batch: Any | None) -> Any:
    """What the jitted step takes for `batch` (None: a drain step's zeros)."""
    if batch is None:
      return ps.get_dummy_input(self.abstract_input, self.input_sharding)
    packed = isinstance(batch, device_buffer.DevicePackedBatch)
    if self.packed_input:
      if not packed:
        raise TypeError(
          "this trainer was built for packed batches (make_train_input's),"
          f" got a {type(batch).__name__}: pass make_train_input's batches, or build"
          " the trainer from a TrainBatch (e.g. abstract_train_batch) to take TrainBatches"
        )
      if batch.layout != self.abstract_input.layout:
        raise ValueError(_other_arrays(batch.layout.arrays(), self.abstract_input.layout.arrays()))
      return batch
    return self.input_fn(batch.unpacked() if packed else batch)


def _other_arrays(got: dict[str, str], want: dict[str, str]) -> str:
  """The error for a packed batch whose arrays are not the trainer's."""
  other = [
    f"{name} {got.get(name, 'missing')} where the trainer has {want.get(name, 'none')}"
    for name in sorted(got.keys() | want.keys())
    if got.get(name) != want.get(name)
  ]
  return (
    f"a batch of other arrays than this trainer's (per device: {'; '.join(other)}):"
    " were its COO buffers made for other limits than the trainer's feature specs?"
  )


def _default_sc_stages(
  mesh: Mesh,
  feature_specs: Any,
  num_sc_per_device: int | None,
  sc_fwd_function: ps.ScFwdStageFun | None,
  sc_bwd_function: ps.ScBwdStageFun | None,
) -> tuple[ps.ScFwdStageFun, ps.ScBwdStageFun]:
  if sc_fwd_function is None or sc_bwd_function is None:
    if feature_specs is None or num_sc_per_device is None:
      raise ValueError("the default SC stages need feature_specs and num_sc_per_device")
  if sc_fwd_function is None:
    sc_fwd_function = get_default_sc_fwd_function(
      feature_specs, mesh, num_sc_per_device=num_sc_per_device
    )
  if sc_bwd_function is None:
    sc_bwd_function = get_default_sc_bwd_function(
      feature_specs, mesh, num_sc_per_device=num_sc_per_device
    )
  return sc_fwd_function, sc_bwd_function


def _with_shardings(tree: Any, shardings: Any) -> Any:
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
  )


@dataclasses.dataclass(frozen=True)
class _Layout:
  """Abstract values and shardings of the step's arguments and output."""

  train_state_sharding: Any
  abstract_input: Any
  abstract_state: Any
  state_sharding: Any
  input_sharding: Any
  output_sharding: Any
  unpack: Callable[[Any], ps.CurrentStepInput]  # in the step: its input -> CurrentStepInput

  @property
  def packed(self) -> bool:
    return isinstance(self.abstract_input, device_buffer.DevicePackedBatch)


def _layout(
  mesh, train_state, example_batch, input_fn, sc_fwd_function, tc_function, output_sharding
) -> _Layout:
  ts_sharding = _sharding_of(train_state, "train_state")
  abstract_ts = _with_shardings(train_state, ts_sharding)
  packed = isinstance(example_batch, device_buffer.DevicePackedBatch)
  arrays = device_buffer.abstract_arrays(example_batch, mesh) if packed else example_batch
  abstract_input = jax.tree.map(ps.abstract_leaf, input_fn(arrays))
  tc_state = abstract_ts.replace(embedding_variables=None)
  abstract_state = ps.get_abstract_pipeline_state(
    abstract_input,
    tc_state,
    abstract_ts.embedding_variables,
    sc_fwd_function,
    tc_function,
  )
  state_sharding = ps.get_pipeline_state_sharding(abstract_state, mesh)
  abstract_state = _with_shardings(abstract_state, state_sharding)
  last = abstract_state.last_step_inputs
  output_shapes = jax.eval_shape(
    tc_function, last.embedding_activations, last.dense_inputs, tc_state, last.sc_fwd_aux
  )[1]
  if output_sharding is None:
    output_sharding = NamedSharding(mesh, PartitionSpec())
  if isinstance(output_sharding, jax.sharding.Sharding):
    output_sharding = jax.tree.map(lambda _: output_sharding, output_shapes)
  input_sharding = ps.pipeline_input_sharding(state_sharding)
  unpack = lambda pipeline_input: pipeline_input  # noqa: E731
  if packed:
    abstract_input = jax.tree.map(ps.abstract_leaf, example_batch)
    input_sharding = jax.tree.map(lambda _: data_sharding(mesh), example_batch)

    def unpack(pipeline_input):
      return input_fn(device_buffer.split_on_devices(pipeline_input, mesh))

  return _Layout(
    train_state_sharding=ts_sharding,
    abstract_input=abstract_input,
    abstract_state=abstract_state,
    state_sharding=state_sharding,
    input_sharding=input_sharding,
    output_sharding=output_sharding,
    unpack=unpack,
  )


class _Step:
  """A step jitted with `jit_kwargs` that also runs programs compiled ahead of time.

  Called as `(pipeline_input, train_state, pipeline_state, num_batches,
  fake_tc_step)`; `order` turns the first three into the jitted function's
  leading arguments (the pipelined step orders them by donation).
  `compile_ahead` (same arguments, abstract ones will do) compiles the
  program of that `fake_tc_step` now, e.g. in a background thread while
  another step trains; a later call runs it directly. JAX's own dispatch
  would trace and lower the step again and may miss the program when the
  arguments' commitment differs from the abstract ones'.
  """

  def __init__(
    self, fun: Callable[..., Any], *, order: Callable[..., tuple] | None = None, **jit_kwargs
  ):
    self._jitted = jax.jit(fun, **jit_kwargs)
    self._order = order or (lambda *args: args)
    self._compiled: dict[bool, Any] = {}

  def __call__(self, pipeline_input, train_state, pipeline_state, num_batches, fake_tc_step):
    args = self._order(pipeline_input, train_state, pipeline_state)
    compiled = self._compiled.get(bool(fake_tc_step))
    if compiled is not None:
      return compiled(*args, num_batches)
    return self._jitted(*args, num_batches, fake_tc_step)

  def lower(self, pipeline_input, train_state, pipeline_state, num_batches, fake_tc_step):
    args = self._order(pipeline_input, train_state, pipeline_state)
    return self._jitted.lower(*args, num_batches, fake_tc_step)

  def compile_ahead(self, *args) -> None:
    """Compiles the program of these arguments (see the class docstring)."""
    self._compiled[bool(args[4])] = self.lower(*args).compile()


def _jit_pipelined_step(
  layout: _Layout, mesh: Mesh, stages: tuple, gradient_multiplier: bool, trace_log: list[bool]
) -> Callable[..., Any]:
  """The pipelined step (pipelining/step.py), jitted with donation ordered by `_order`."""
  sc_fwd_function, tc_function, sc_bwd_function = stages

  def ordered_step(donated, kept, num_batches, fake_tc_step):
    trace_log.append(fake_tc_step)
    pipeline_input, train_state, pipeline_state = _unorder(donated, kept)
    pipeline_input = layout.unpack(pipeline_input)
    output, _, tc_state, embedding_variables, pipeline_state = pipeline_step_fn(
      pipeline_input,
      train_state.replace(embedding_variables=None),
      train_state.embedding_variables,
      pipeline_state,
      sc_fwd_function,
      tc_function,
      sc_bwd_function,
      fake_tc_step=fake_tc_step,
      num_steps=num_batches if gradient_multiplier else None,
    )
    train_state = tc_state.replace(embedding_variables=embedding_variables)
    return train_state, pipeline_state, output

  order = functools.partial(_order, packed=layout.packed)
  donated_sharding, kept_sharding = order(
    layout.input_sharding, layout.train_state_sharding, layout.state_sharding
  )
  ordered = _Step(
    ordered_step,
    static_argnums=(3,),
    donate_argnums=(0,),
    in_shardings=(donated_sharding, kept_sharding, NamedSharding(mesh, PartitionSpec())),
    out_shardings=(layout.train_state_sharding, layout.state_sharding, layout.output_sharding),
    order=order,
  )
  return ordered


def _jit_sequential_step(
  layout: _Layout, mesh: Mesh, stages: tuple, trace_log: list[bool]
) -> Callable[..., Any]:
  """Lookup, dense step and embedding update of the same batch in one program."""
  sc_fwd_function, tc_function, sc_bwd_function = stages

  def step(pipeline_input, train_state, pipeline_state, num_batches, fake_tc_step):
    del num_batches
    trace_log.append(fake_tc_step)
    pipeline_input = layout.unpack(pipeline_input)
    sparse, embeddings = pipeline_input.sparse_inputs, train_state.embedding_variables
    activations, sc_fwd_aux = sc_fwd_function(sparse, embeddings)
    gradients, output, tc_state, tc_aux = tc_function(
      activations,
      pipeline_input.dense_inputs,
      train_state.replace(embedding_variables=None),
      sc_fwd_aux,
    )
    embeddings, _ = sc_bwd_function(sparse, gradients, embeddings, tc_aux)
    pipeline_state = dataclasses.replace(
      pipeline_state, pipeline_step=pipeline_state.pipeline_step + 1
    )
    return tc_state.replace(embedding_variables=embeddings), pipeline_state, output

  return _Step(
    step,
    static_argnums=(4,),
    donate_argnums=(1, 2),
    in_shardings=(
      layout.input_sharding,
      layout.train_state_sharding,
      layout.state_sharding,
      NamedSharding(mesh, PartitionSpec()),
    ),
    out_shardings=(layout.train_state_sharding, layout.state_sharding, layout.output_sharding),
  )


def make_trainer(
  mesh: Mesh,
  train_state: TrainState,
  example_batch: Any,
  tc_function: ps.TcStageFun,
  *,
  feature_specs: Any = None,
  num_sc_per_device: int | None = None,
  sc_fwd_function: ps.ScFwdStageFun | None = None,
  sc_bwd_function: ps.ScBwdStageFun | None = None,
  input_fn: Callable[[Any], ps.CurrentStepInput] = batch_to_pipeline_input,
  gradient_multiplier: bool = False,
  output_sharding: Any = None,
  pipelining: bool = True,
) -> Trainer:
  """Builds the stages, shardings and the jitted step.

  Args:
    mesh: the device mesh (data axis).
    train_state: the TrainState, concrete or abstract with shardings (its
      shardings become the step's in/out shardings).
    example_batch: one batch, concrete or ShapeDtypeStructs, giving shapes;
      a DevicePackedBatch (`abstract_packed_batch`) makes a trainer of the
      placed batches of `make_train_input`, split inside the step.
    tc_function: the TC stage (e.g. `make_tc_stage(model, optimizer, mesh, specs)`).
    feature_specs: prepared feature specs; needed for the default SC stages.
    num_sc_per_device: S; needed for the default SC stages.
    sc_fwd_function: SC fwd stage; default `get_default_sc_fwd_function`.
    sc_bwd_function: SC bwd stage; default `get_default_sc_bwd_function`.
    input_fn: batch -> CurrentStepInput.
    gradient_multiplier: one program for all steps with on-device masks.
    output_sharding: sharding of the TC output (one Sharding or a tree);
      default replicated.
    pipelining: False runs each batch's lookup, dense step and embedding
      update in one step (sequential mode, no one-step delay).

  Returns:
    A Trainer.
  """
  check_mesh(mesh)
  if gradient_multiplier and not pipelining:
    raise ValueError("gradient_multiplier is a pipelining mode: it needs pipelining=True")
  sc_fwd_function, sc_bwd_function = _default_sc_stages(
    mesh, feature_specs, num_sc_per_device, sc_fwd_function, sc_bwd_function
  )
  layout = _layout(
    mesh, train_state, example_batch, input_fn, sc_fwd_function, tc_function, output_sharding
  )
  stages = (sc_fwd_function, tc_function, sc_bwd_function)
  trace_log: list[bool] = []
  if pipelining:
    jitted = _jit_pipelined_step(layout, mesh, stages, gradient_multiplier, trace_log)
  else:
    jitted = _jit_sequential_step(layout, mesh, stages, trace_log)
  labels = jax.tree.leaves(layout.abstract_state.last_step_inputs.dense_inputs)
  return Trainer(
    mesh=mesh,
    sc_fwd_function=sc_fwd_function,
    tc_function=tc_function,
    sc_bwd_function=sc_bwd_function,
    input_fn=input_fn,
    train_state_sharding=layout.train_state_sharding,
    pipeline_state_sharding=layout.state_sharding,
    input_sharding=layout.input_sharding,
    abstract_input=layout.abstract_input,
    abstract_pipeline_state=layout.abstract_state,
    global_batch_size=int(labels[0].shape[0]) if labels and labels[0].shape else 0,
    gradient_multiplier=gradient_multiplier,
    jitted_step=jitted,
    trace_log=trace_log,
    pipelining=pipelining,
    packed_input=layout.packed,
    feature_specs=feature_specs if num_sc_per_device is not None else None,
    num_sc_per_device=num_sc_per_device,
  )

"""Pipelining types: stage protocols, buffered inputs and the PipelineState.

At pipeline step i the SC backward stage of batch i-2 updates the tables,
then the SC forward stage of batch i looks up with the fresh tables, while
the TC stage trains on batch i-1 from the activations buffered at step i-1.
`PipelineState` carries what crosses a step boundary: the inputs, the
activations and the SC forward aux of step i-1, the sparse inputs, the
embedding gradients and the TC aux of step i-2, and the pipeline step.

Every container is a frozen dataclass registered with `jax.tree_util`, so
it is a pytree (jit, donation, Orbax) without flax. The user's own types
for inputs, activations, gradients, outputs and aux flow through unchanged:
the stage protocols are generic over them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Generic, Protocol, TypeVar

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from sparsepipe.core.mesh import DATA_AXIS

# User types (pytrees) flowing through the stages.
SparseInputT = TypeVar("SparseInputT")
DenseInputT = TypeVar("DenseInputT")
ActivationsT = TypeVar("ActivationsT")
GradientsT = TypeVar("GradientsT")
PipelineOutputT = TypeVar("PipelineOutputT")
TcTrainStateT = TypeVar("TcTrainStateT")
EmbeddingVariablesT = TypeVar("EmbeddingVariablesT")
ScFwdAuxT = TypeVar("ScFwdAuxT")
TcAuxT = TypeVar("TcAuxT")
ScBwdAuxT = TypeVar("ScBwdAuxT")


class ScFwdStageFun(Protocol[SparseInputT, ActivationsT, EmbeddingVariablesT, ScFwdAuxT]):
  """SC forward: look up the batch's sparse inputs in the tables."""

  def __call__(
    self, sparse_inputs: SparseInputT, embedding_variables: EmbeddingVariablesT
  ) -> tuple[ActivationsT, ScFwdAuxT]:
    """Returns the activations and an aux pytree for the next step's TC."""
    ...


class TcStageFun(
  Protocol[
    ActivationsT,
    DenseInputT,
    GradientsT,
    PipelineOutputT,
    TcTrainStateT,
    ScFwdAuxT,
    TcAuxT,
  ]
):
  """TC forward/backward: dense model, loss, dense update, activation grads."""

  def __call__(
    self,
    embedding_activations: ActivationsT,
    dense_inputs: DenseInputT,
    train_state: TcTrainStateT,
    sc_fwd_aux: ScFwdAuxT,
  ) -> tuple[GradientsT, PipelineOutputT, TcTrainStateT, TcAuxT]:
    """Returns activation gradients, output, new train state, aux for SC bwd."""
    ...


class ScBwdStageFun(Protocol[SparseInputT, GradientsT, EmbeddingVariablesT, TcAuxT, ScBwdAuxT]):
  """SC backward: apply the embedding optimizer to the touched rows."""

  def __call__(
    self,
    sparse_inputs: SparseInputT,
    embedding_gradients: GradientsT,
    embedding_variables: EmbeddingVariablesT,
    tc_aux: TcAuxT,
  ) -> tuple[EmbeddingVariablesT, ScBwdAuxT]:
    """Returns the updated embedding variables and an aux pytree (output)."""
    ...


def _pytree_dataclass(cls):
  """A frozen dataclass whose fields are all pytree children."""
  cls = dataclasses.dataclass(frozen=True)(cls)
  cls.replace = lambda self, **changes: dataclasses.replace(self, **changes)
  return jax.tree_util.register_dataclass(cls)


@_pytree_dataclass
class CurrentStepInput(Generic[SparseInputT, DenseInputT]):
  """The batch fed at pipeline step i."""

  sparse_inputs: SparseInputT  # SC fwd now, SC bwd two steps later
  dense_inputs: DenseInputT  # TC at the next step


@_pytree_dataclass
class LastStepInput(Generic[SparseInputT, DenseInputT, ActivationsT, ScFwdAuxT]):
  """What step i-1 left for the TC stage of step i."""

  sparse_inputs: SparseInputT
  dense_inputs: DenseInputT
  embedding_activations: ActivationsT
  sc_fwd_aux: ScFwdAuxT


@_pytree_dataclass
class StepBeforeLastStepInput(Generic[SparseInputT, GradientsT, TcAuxT]):
  """What step i-2 left for the SC backward stage of step i."""

  sparse_inputs: SparseInputT
  embedding_gradients: GradientsT
  tc_aux: TcAuxT


@_pytree_dataclass
class PipelineState(
  Generic[SparseInputT, DenseInputT, ActivationsT, GradientsT, ScFwdAuxT, TcAuxT]
):
  """Everything the pipeline buffers between two pipeline steps.

  Attributes:
    pipeline_step: int32 scalar, the index of the next pipeline step (0 for a
      fresh pipeline). Saved with the state, so a resumed loop knows where
      it is.
    last_step_inputs: inputs and SC fwd results of step i-1.
    step_before_last_step_inputs: sparse inputs and TC results of step i-2.
  """

  pipeline_step: Any
  last_step_inputs: LastStepInput[SparseInputT, DenseInputT, ActivationsT, ScFwdAuxT]
  step_before_last_step_inputs: StepBeforeLastStepInput[SparseInputT, GradientsT, TcAuxT]


def get_pipeline_train_steps(num_steps: int, *, drains: bool = True) -> int:
  """Pipeline steps needed for `num_steps` batches (the drain adds 2).

  A run that does not drain (`drains=False`) leaves its last two batches in
  the PipelineState for the next run (`carried_in`, see `is_output_valid`).
  """
  if num_steps < 0:
    raise ValueError(f"num_steps={num_steps} must be >= 0")
  return num_steps + (2 if drains else 0)


def is_output_valid(pipeline_step: int, num_steps: int, *, carried_in: bool = False) -> bool:
  """True where the TC stage runs on a real batch (steps 1..num_steps).

  The output of pipeline step i belongs to batch i-1. Steps 0 and
  num_steps+1 run with `fake_tc_step=True`. A run `carried_in` starts with
  the previous run's last two batches in flight (no fill step): its step 0
  trains the previous run's last batch (index -1).
  """
  return (0 if carried_in else 1) <= pipeline_step <= num_steps


def is_fake_tc_step(pipeline_step: int, num_steps: int, *, carried_in: bool = False) -> bool:
  """The static `fake_tc_step` argument for pipeline step `pipeline_step`."""
  return not is_output_valid(pipeline_step, num_steps, carried_in=carried_in)


def abstract_leaf(x: Any) -> jax.ShapeDtypeStruct:
  """A strongly typed ShapeDtypeStruct (weak types would cause retraces)."""
  if not (hasattr(x, "shape") and hasattr(x, "dtype")):
    x = jnp.asarray(x)
  return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)


def get_abstract_pipeline_state(
  pipeline_input: CurrentStepInput,
  tc_train_state: Any,
  embedding_variables: Any,
  sc_fwd_function: ScFwdStageFun,
  tc_function: TcStageFun,
  *,
  sharding: PipelineState | None = None,
) -> PipelineState:
  """The PipelineState as ShapeDtypeStructs (Orbax restore target).

  Args:
    pipeline_input: one batch (concrete or ShapeDtypeStructs).
    tc_train_state: the TC train state (concrete or abstract).
    embedding_variables: the embedding variables (concrete or abstract).
    sc_fwd_function: the SC forward stage.
    tc_function: the TC stage.
    sharding: optional PipelineState of shardings
      (`get_pipeline_state_sharding`) attached to every leaf.

  Returns:
    A PipelineState of jax.ShapeDtypeStruct.
  """
  sparse = jax.tree.map(abstract_leaf, pipeline_input.sparse_inputs)
  dense = jax.tree.map(abstract_leaf, pipeline_input.dense_inputs)
  activations, sc_fwd_aux = jax.eval_shape(sc_fwd_function, sparse, embedding_variables)
  gradients, _, _, tc_aux = jax.eval_shape(
    tc_function, activations, dense, tc_train_state, sc_fwd_aux
  )
  state = PipelineState(
    pipeline_step=jax.ShapeDtypeStruct((), jnp.int32),
    last_step_inputs=LastStepInput(
      sparse_inputs=sparse,
      dense_inputs=dense,
      embedding_activations=activations,
      sc_fwd_aux=sc_fwd_aux,
    ),
    step_before_last_step_inputs=StepBeforeLastStepInput(
      sparse_inputs=sparse, embedding_gradients=gradients, tc_aux=tc_aux
    ),
  )
  state = jax.tree.map(abstract_leaf, state)
  if sharding is not None:
    state = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      state,
      sharding,
    )
  return state


def _part_sharding(part: Any, given: Any, default: Any, mesh: Mesh, what: str) -> Any:
  """Shardings for one part of the state: default rule, one Sharding, or a tree."""
  if given is None:
    return jax.tree_util.tree_map_with_path(lambda path, x: default(path, x, mesh, what), part)
  if isinstance(given, Sharding):
    return jax.tree.map(lambda _: given, part)
  if jax.tree.structure(given) != jax.tree.structure(part):
    raise ValueError(
      f"pipeline state {what}: sharding tree {jax.tree.structure(given)} does"
      f" not match the state's tree {jax.tree.structure(part)}"
    )
  return given


def _batch_sharding(path, x, mesh: Mesh, what: str) -> NamedSharding:
  """Default for batch-like buffers: leading dimension over the data axis."""
  if len(x.shape) == 0:
    return NamedSharding(mesh, PartitionSpec())
  size = mesh.shape[DATA_AXIS]
  if x.shape[0] % size:
    raise ValueError(
      f"pipeline state {what}{jax.tree_util.keystr(path)}: leading dimension"
      f" {x.shape[0]} is not divisible by the {size} devices of mesh axis"
      f" '{DATA_AXIS}'; pass an explicit sharding"
    )
  return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def _replicated(path, x, mesh: Mesh, what: str) -> NamedSharding:
  del path, x, what
  return NamedSharding(mesh, PartitionSpec())


def get_pipeline_state_sharding(
  abstract_state: PipelineState,
  mesh: Mesh,
  *,
  sparse_input_sharding: Any = None,
  dense_input_sharding: Any = None,
  embedding_activation_sharding: Any = None,
  embedding_gradient_sharding: Any = None,
  sc_fwd_aux_sharding: Any = None,
  tc_aux_sharding: Any = None,
) -> PipelineState:
  """A PipelineState of shardings, one per leaf (jit in/out_shardings).

  Each argument is None (default rule), one Sharding for every leaf of that
  part, or a tree of shardings with the part's structure. Default rule:
  sparse and dense inputs, activations and gradients are split over the
  data axis on their leading dimension (scalars replicated); aux pytrees
  and the pipeline step are replicated.

  Args:
    abstract_state: the state's structure (`get_abstract_pipeline_state`, or
      a concrete state).
    mesh: the device mesh (must have the 'data' axis).
    sparse_input_sharding: sharding of the buffered sparse inputs.
    dense_input_sharding: sharding of the buffered dense inputs.
    embedding_activation_sharding: sharding of the buffered activations.
    embedding_gradient_sharding: sharding of the buffered gradients.
    sc_fwd_aux_sharding: sharding of the SC fwd aux.
    tc_aux_sharding: sharding of the TC aux.

  Returns:
    A PipelineState whose leaves are shardings.
  """
  if DATA_AXIS not in mesh.shape:
    raise ValueError(f"mesh axes {tuple(mesh.axis_names)} lack the '{DATA_AXIS}' axis")
  last = abstract_state.last_step_inputs
  before = abstract_state.step_before_last_step_inputs
  sparse = _part_sharding(
    last.sparse_inputs,
    sparse_input_sharding,
    _batch_sharding,
    mesh,
    "sparse_inputs",
  )
  return PipelineState(
    pipeline_step=NamedSharding(mesh, PartitionSpec()),
    last_step_inputs=LastStepInput(
      sparse_inputs=sparse,
      dense_inputs=_part_sharding(
        last.dense_inputs,
        dense_input_sharding,
        _batch_sharding,
        mesh,
        "dense_inputs",
      ),
      embedding_activations=_part_sharding(
        last.embedding_activations,
        embedding_activation_sharding,
        _batch_sharding,
        mesh,
        "embedding_activations",
      ),
      sc_fwd_aux=_part_sharding(
        last.sc_fwd_aux,
        sc_fwd_aux_sharding,
        _replicated,
        mesh,
        "sc_fwd_aux",
      ),
    ),
    step_before_last_step_inputs=StepBeforeLastStepInput(
      sparse_inputs=sparse,
      embedding_gradients=_part_sharding(
        before.embedding_gradients,
        embedding_gradient_sharding,
        _batch_sharding,
        mesh,
        "embedding_gradients",
      ),
      tc_aux=_part_sharding(before.tc_aux, tc_aux_sharding, _replicated, mesh, "tc_aux"),
    ),
  )


def pipeline_input_sharding(state_sharding: PipelineState) -> CurrentStepInput:
  """The CurrentStepInput shardings that match a state sharding."""
  last = state_sharding.last_step_inputs
  return CurrentStepInput(sparse_inputs=last.sparse_inputs, dense_inputs=last.dense_inputs)


def zeros_from_abstract(abstract: Any, sharding: Any = None) -> Any:
  """Zero arrays created in place on their devices (multi-host safe, cached)."""
  if sharding is None:
    return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), abstract)
  return jax.tree.map(lambda x, s: jnp.zeros(x.shape, x.dtype, device=s), abstract, sharding)


def get_initial_state(
  pipeline_input: CurrentStepInput,
  tc_train_state: Any,
  embedding_variables: Any,
  sc_fwd_function: ScFwdStageFun,
  tc_function: TcStageFun,
  *,
  sharding: PipelineState | None = None,
) -> PipelineState:
  """The state before pipeline step 0: step 0 and zero-filled buffers.

  The zeros stand for the batches -1 and -2 that do not exist: the SC
  backward stages of steps 0 and 1 see zero gradients and zero (empty) COO
  buffers, which leave the tables untouched.

  Args:
    pipeline_input: one batch (concrete or abstract) giving the shapes.
    tc_train_state: the TC train state (concrete or abstract).
    embedding_variables: the embedding variables (concrete or abstract).
    sc_fwd_function: the SC forward stage.
    tc_function: the TC stage.
    sharding: optional PipelineState of shardings to create the arrays with.

  Returns:
    The initial PipelineState.
  """
  abstract = get_abstract_pipeline_state(
    pipeline_input,
    tc_train_state,
    embedding_variables,
    sc_fwd_function,
    tc_function,
  )
  return zeros_from_abstract(abstract, sharding)


def get_dummy_input(
  template: CurrentStepInput | PipelineState, sharding: Any = None
) -> CurrentStepInput:
  """Zero-like inputs for the two drain steps (fresh arrays, donatable).

  Args:
    template: a batch, or a PipelineState (its buffered step i-1 inputs give
      the shapes, so a resumed loop needs no batch).
    sharding: optional CurrentStepInput of shardings.

  Returns:
    A CurrentStepInput of zeros.
  """
  if isinstance(template, PipelineState):
    last = template.last_step_inputs
    template = CurrentStepInput(sparse_inputs=last.sparse_inputs, dense_inputs=last.dense_inputs)
  leaves = jax.tree.leaves(template)
  if sharding is None and all(isinstance(x, jax.Array) for x in leaves):
    sharding = jax.tree.map(lambda x: x.sharding, template)
  return zeros_from_abstract(jax.tree.map(abstract_leaf, template), sharding)

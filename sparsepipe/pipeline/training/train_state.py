"""TrainState: the dense step, params, optimizer state and embedding variables.

`step` counts the batches trained (dense updates applied); it is also the
`step` of the embedding update of the same batch (passed as the TC aux), so
schedules and Adam's bias correction continue across pipeline runs.

The TC stage sees the TrainState with `embedding_variables=None` (it never
touches the tables); the SC stages see only the embedding variables.

The dense optimizer is any optax GradientTransformation; its state has the
shardings its `init` gives it under jit (replicated for a plain optax
optimizer on replicated params, partitioned for `zero_sharded`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sparsepipe.core.mesh import check_mesh


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
  """The whole model state (a pytree).

  Attributes:
    step: int32 scalar, replicated: batches trained so far.
    params: dense parameters, replicated.
    opt_state: dense optimizer state (ZeRO-sharded or replicated).
    embedding_variables: {stack: EmbeddingVariables}, rows sharded over the
      data axis; None inside the TC stage.
  """

  step: Any
  params: Any
  opt_state: Any
  embedding_variables: Any

  def replace(self, **changes: Any) -> "TrainState":
    return dataclasses.replace(self, **changes)


def _replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def opt_state_sharding(optimizer: optax.GradientTransformation, params: Any, mesh: Mesh) -> Any:
  """Shardings of the dense optimizer state: what `optimizer.init` gives under jit.

  Params may be abstract; they are taken as replicated on `mesh`.
  """
  replicated = _replicated(mesh)
  abstract = jax.tree.map(
    lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=replicated), params
  )
  shardings = jax.jit(optimizer.init).lower(abstract).compile().output_shardings
  # A leaf init makes from constants (Adam's count) comes out on one device:
  # it belongs replicated on the mesh like the params.
  return jax.tree.map(lambda s: s if isinstance(s, NamedSharding) else replicated, shardings)


def train_state_sharding(
  optimizer: optax.GradientTransformation,
  params: Any,
  mesh: Mesh,
  embedding_variables_sharding: Any,
) -> TrainState:
  """A TrainState of shardings (jit in/out_shardings, Orbax targets).

  Args:
    optimizer: the dense optimizer.
    params: dense params (concrete or abstract).
    mesh: the device mesh.
    embedding_variables_sharding: e.g. `embedding_variables_sharding(
      feature_specs, mesh)`.

  Returns:
    A TrainState whose leaves are NamedShardings.
  """
  return TrainState(
    step=_replicated(mesh),
    params=jax.tree.map(lambda _: _replicated(mesh), params),
    opt_state=opt_state_sharding(optimizer, params, mesh),
    embedding_variables=embedding_variables_sharding,
  )


def abstract_train_state(
  optimizer: optax.GradientTransformation,
  params: Any,
  mesh: Mesh,
  abstract_embedding_variables: Any,
) -> TrainState:
  """The TrainState as ShapeDtypeStructs with shardings (restore target).

  Args:
    optimizer: the dense optimizer.
    params: dense params (concrete or abstract, e.g. `jax.eval_shape(
      model.init, key, dense_dim, feature_dims)`).
    mesh: the device mesh.
    abstract_embedding_variables: e.g. `abstract_embedding_variables(
      feature_specs, mesh, num_sc_per_device=S)`.

  Returns:
    A TrainState of jax.ShapeDtypeStruct.
  """
  replicated = _replicated(mesh)
  as_struct = lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
  opt_state = jax.tree.map(
    as_struct,
    jax.eval_shape(optimizer.init, params),
    opt_state_sharding(optimizer, params, mesh),
  )
  return TrainState(
    step=jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
    params=jax.tree.map(lambda x: as_struct(x, replicated), params),
    opt_state=opt_state,
    embedding_variables=abstract_embedding_variables,
  )


def create_train_state(
  optimizer: optax.GradientTransformation,
  params: Any,
  mesh: Mesh,
  embedding_variables: Any,
  *,
  step: int = 0,
) -> TrainState:
  """A fresh TrainState on the mesh: params replicated, optimizer initialised.

  Every array is strongly typed (a weakly typed leaf would make the first
  pipeline step compile a program the later steps cannot reuse).

  Args:
    optimizer: the dense optimizer.
    params: dense params (host or device arrays).
    mesh: the device mesh.
    embedding_variables: e.g. from `init_embedding_variables`.
    step: the initial step.

  Returns:
    The TrainState.
  """
  check_mesh(mesh)
  replicated = _replicated(mesh)
  strong = lambda tree: jax.tree.map(lambda x: x.astype(x.dtype), tree)
  params = jax.jit(strong, out_shardings=replicated)(params)
  opt_state = jax.jit(optimizer.init, out_shardings=opt_state_sharding(optimizer, params, mesh))(
    params
  )
  return TrainState(
    step=jax.device_put(jnp.asarray(step, jnp.int32), replicated),
    params=params,
    opt_state=opt_state,
    embedding_variables=embedding_variables,
  )

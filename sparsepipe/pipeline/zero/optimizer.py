"""ZeRO: replicated dense parameters, optimizer state split over the data axis.

Layout. Every parameter leaf of n elements is seen by the optimizer as a
flat vector of roundup(n, D) elements (zero padded), D = size of the mesh's
'data' axis. The optax state is created from those flat vectors, so its
parameter-like leaves are [roundup(n, D)] arrays sharded over 'data': each
device holds exactly 1/D of them. Scalar leaves (Adam's count, schedules)
stay replicated.

Update. Gradients are reduce-scattered onto the flat shards (explicitly,
`psum_scatter` inside `shard_map`, when the TC stage hands over per-device
partial gradients; by slicing when it hands over summed ones), the optax
update runs on the shards in the global (jit) view, and the updated flat
parameters are all-gathered back into replicated parameters. All leaves of
one dtype share a single reduce-scatter and a single all-gather (packed
[D, sum n_i/D] buffers), not one collective per leaf. Everything is
jax.Array + NamedSharding under jit, so it runs across hosts.

The optimizer sees flat zero-padded vectors: element-wise optimizers (SGD,
momentum, Adam, Adagrad, RMSProp, weight decay) and global or per-leaf
norms (clipping, LAMB trust ratios: padding is zero and stays zero) are
exact; transforms that depend on a parameter's shape (Adafactor's factored
moments, masks computed from `ndim`) see vectors instead.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sparsepipe.core.mesh import DATA_AXIS
from sparsepipe.core.rounding import round_up

Params = Any
Updates = Any


def padded_size(size: int, num_shards: int) -> int:
  """`size` rounded up to a multiple of `num_shards`."""
  return round_up(size, num_shards)


def _flatten(x: jax.Array, num_shards: int) -> jax.Array:
  flat = jnp.ravel(x)
  return jnp.pad(flat, (0, padded_size(flat.shape[0], num_shards) - flat.shape[0]))


def _unflatten(flat: jax.Array, like: Any) -> jax.Array:
  return flat[: math.prod(like.shape)].reshape(like.shape)


def _constrain(tree: Any, sharding: NamedSharding) -> Any:
  """Every leaf of `tree` constrained to the one `sharding` (under jit)."""
  return jax.tree.map(
      lambda x: jax.lax.with_sharding_constraint(x, sharding), tree
  )


def _packed(tree: Any, collective: Any, split_axis: int = 0) -> Any:
  """Runs one collective per dtype on the leaves concatenated on their last axis.

  Leaves are [..., n_i] (same leading shape); `collective` maps the
  concatenation [..., sum n_i] to [..., sum n_i] (reduce-scatter: [D, n] ->
  [n]) or adds an axis (all-gather: [n] -> [D, n]); the result is split
  back into the leaves along `split_axis` of the collective's output.
  """
  leaves, treedef = jax.tree.flatten(tree)
  out = [None] * len(leaves)
  by_dtype: dict[Any, list[int]] = {}
  for i, leaf in enumerate(leaves):
    by_dtype.setdefault(jnp.dtype(leaf.dtype), []).append(i)
  for indices in by_dtype.values():
    joined = jnp.concatenate([leaves[i] for i in indices], axis=-1)
    result = collective(joined)
    sizes = [leaves[i].shape[-1] for i in indices]
    pieces = jnp.split(result, np.cumsum(sizes)[:-1].tolist(), axis=split_axis)
    for i, piece in zip(indices, pieces):
      out[i] = piece
  return jax.tree.unflatten(treedef, out)


@dataclasses.dataclass(frozen=True)
class ZeroOptimizer:
  """An optax optimizer whose state is partitioned over the 'data' axis.

  Attributes:
    optimizer: any optax GradientTransformation (see the module docstring for
      what the flat layout means for it).
    mesh: the device mesh; its 'data' axis partitions the state.
  """

  optimizer: optax.GradientTransformation
  mesh: Mesh

  def __post_init__(self):
    if DATA_AXIS not in self.mesh.shape:
      raise ValueError(
          f"ZeRO: mesh axes {tuple(self.mesh.axis_names)} lack the"
          f" '{DATA_AXIS}' axis"
      )

  @property
  def num_shards(self) -> int:
    return self.mesh.shape[DATA_AXIS]

  @property
  def flat_sharding(self) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec(DATA_AXIS))

  @property
  def replicated_sharding(self) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec())

  def _abstract_flat_params(self, params: Params) -> Any:
    return jax.tree.map(
        lambda p: jax.ShapeDtypeStruct(
            (padded_size(math.prod(p.shape), self.num_shards),), p.dtype
        ),
        params,
    )

  def _leaf_sharding(self, x: Any) -> NamedSharding:
    shape = tuple(x.shape)
    if shape and shape[0] > 0 and shape[0] % self.num_shards == 0:
      return self.flat_sharding
    return self.replicated_sharding

  def state_sharding(self, params: Params) -> Any:
    """Shardings of the optimizer state (params may be abstract)."""
    shapes = jax.eval_shape(self.optimizer.init, self._abstract_flat_params(params))
    return jax.tree.map(self._leaf_sharding, shapes)

  def abstract_state(self, params: Params) -> Any:
    """The optimizer state as ShapeDtypeStructs with shardings (restore target)."""
    shapes = jax.eval_shape(self.optimizer.init, self._abstract_flat_params(params))
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=self._leaf_sharding(x)
        ),
        shapes,
    )

  def flatten_params(self, params: Params) -> Params:
    """Flat padded views of replicated params, sharded (a local slice each)."""
    return jax.tree.map(
        lambda p: jax.lax.with_sharding_constraint(
            _flatten(p, self.num_shards), self.flat_sharding
        ),
        params,
    )

  def init(self, params: Params) -> Any:
    """The sharded optimizer state, created in place on the devices."""

    def init_fn(params):
      return self.optimizer.init(
          jax.tree.map(lambda p: _flatten(p, self.num_shards), params)
      )

    return jax.jit(init_fn, out_shardings=self.state_sharding(params))(params)

  def scatter_gradients(self, partial_grads: Updates) -> Updates:
    """Reduce-scatters per-device partial gradients onto the flat shards.

    Call inside `jax.shard_map` over the 'data' axis. Each device passes its
    partial gradient (parameter shapes); each gets back its 1/D slice of the
    summed flat gradient. Return it with out_specs P('data') to obtain the
    global flat gradients `update_scattered` takes. All leaves of one dtype
    travel in a single reduce-scatter.

    Args:
      partial_grads: this device's partial gradients, shaped like the params.

    Returns:
      This device's [roundup(n, D) / D] slice of each summed gradient.
    """
    d = self.num_shards

    def reduce_scatter(rows):  # [D, total] -> this device's [total]
      summed = jax.lax.psum_scatter(
          rows, DATA_AXIS, scatter_dimension=0, tiled=True
      )
      return summed[0]

    rows = jax.tree.map(lambda g: _flatten(g, d).reshape(d, -1), partial_grads)
    return _packed(rows, reduce_scatter)

  def _all_gather(self, flat_params: Params) -> Params:
    """Flat [roundup(n, D)] arrays sharded over 'data' -> replicated.

    One all-gather per dtype for all leaves together.
    """

    def gather(tree):
      def all_gather(local):  # [total] -> [D, total]
        return jax.lax.all_gather(local, DATA_AXIS, tiled=False)

      rows = _packed(tree, all_gather, split_axis=1)
      return jax.tree.map(lambda r: r.reshape(-1), rows)

    return jax.shard_map(
        gather,
        mesh=self.mesh,
        in_specs=PartitionSpec(DATA_AXIS),
        out_specs=PartitionSpec(),
        check_vma=False,
    )(flat_params)

  def update_scattered(
      self, flat_grads: Updates, opt_state: Any, params: Params
  ) -> tuple[Params, Any]:
    """One optimizer step from flat gradients sharded over 'data'.

    Args:
      flat_grads: summed gradients in the flat padded layout (global arrays
        sharded over 'data', e.g. from `scatter_gradients`).
      opt_state: the sharded optimizer state.
      params: the replicated parameters.

    Returns:
      (new replicated params, new sharded optimizer state).
    """
    flat_grads = _constrain(flat_grads, self.flat_sharding)
    flat_params = self.flatten_params(params)
    updates, new_state = self.optimizer.update(flat_grads, opt_state, flat_params)
    new_flat = optax.apply_updates(flat_params, updates)
    new_flat = _constrain(new_flat, self.flat_sharding)
    new_state = jax.lax.with_sharding_constraint(
        new_state, jax.tree.map(self._leaf_sharding, new_state)
    )
    gathered = self._all_gather(new_flat)
    new_params = jax.tree.map(_unflatten, gathered, params)
    return new_params, new_state

  def update(
      self, grads: Updates, opt_state: Any, params: Params
  ) -> tuple[Params, Any]:
    """One optimizer step from summed gradients shaped like the params.

    The gradients are made replicated (the all-reduce a plain jax.grad over a
    sharded batch implies) and each device keeps its own slice. Prefer
    `scatter_gradients` + `update_scattered`, which reduce-scatter instead.

    Args:
      grads: gradients shaped like the params (any sharding).
      opt_state: the sharded optimizer state.
      params: the replicated parameters.

    Returns:
      (new replicated params, new sharded optimizer state).
    """
    grads = _constrain(grads, self.replicated_sharding)
    return self.update_scattered(self.flatten_params(grads), opt_state, params)


def zero_init(
    optimizer: optax.GradientTransformation, params: Params, mesh: Mesh
) -> Any:
  """`ZeroOptimizer(optimizer, mesh).init(params)`."""
  return ZeroOptimizer(optimizer, mesh).init(params)


def zero_update(
    optimizer: optax.GradientTransformation,
    grads: Updates,
    opt_state: Any,
    params: Params,
    mesh: Mesh,
) -> tuple[Params, Any]:
  """`ZeroOptimizer(optimizer, mesh).update(grads, opt_state, params)`."""
  return ZeroOptimizer(optimizer, mesh).update(grads, opt_state, params)


def zero_state_sharding(
    optimizer: optax.GradientTransformation, params: Params, mesh: Mesh
) -> Any:
  """`ZeroOptimizer(optimizer, mesh).state_sharding(params)`."""
  return ZeroOptimizer(optimizer, mesh).state_sharding(params)


def abstract_zero_state(
    optimizer: optax.GradientTransformation, params: Params, mesh: Mesh
) -> Any:
  """`ZeroOptimizer(optimizer, mesh).abstract_state(params)`."""
  return ZeroOptimizer(optimizer, mesh).abstract_state(params)


def bytes_per_device(tree: Any) -> dict[Any, int]:
  """Bytes each device holds for the arrays of `tree` (addressable shards)."""
  totals: dict[Any, int] = {}
  for leaf in jax.tree.leaves(tree):
    for shard in leaf.addressable_shards:
      totals[shard.device] = totals.get(shard.device, 0) + shard.data.nbytes
  return totals

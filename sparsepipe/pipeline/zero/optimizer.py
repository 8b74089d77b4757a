"""ZeRO: replicated dense parameters, optimizer state split over the data axis.

`zero_sharded(optimizer, mesh)` is an optax GradientTransformation: `init`
returns the sharded state, `update` returns updates shaped like the params
(replicated), so it chains with optax and wraps any optax optimizer.

Layout. Every parameter leaf of n elements is seen by the inner optimizer as
a flat vector of roundup(n, D) elements (zero padded), D = size of the
mesh's 'data' axis. The optax state is created from those flat vectors, so
its parameter-like leaves are [roundup(n, D)] arrays sharded over 'data':
each device holds exactly 1/D of them. Scalar leaves (Adam's count,
schedules) stay replicated.

Update. Gradients shaped like the params are sliced onto the flat shards.
A TC stage that computes per-device partial gradients can do better: it
reduce-scatters them (`scatter_gradients` inside `shard_map`) and offers
the shards for the duration of its `optimizer.update` call
(`offer_scattered_gradients`); ZeRO then uses the shards instead of the
all-reduced gradients, turning the all-reduce into a reduce-scatter. It
does so only if the updates it receives are the stage's own gradients
(ZeRO alone, first in an optax.chain, or around a chain): updates changed
before ZeRO (a transformation before it in a chain, a wrapper like
MultiSteps) are refused with one line, since ZeRO would otherwise silently
fall back to the all-reduce. The inner update runs on the shards in the
global (jit) view and the flat updates are all-gathered back into
replicated updates. All leaves of one dtype share a single reduce-scatter
and a single all-gather (packed [D, sum n_i/D] buffers), not one
collective per leaf. Everything is jax.Array + NamedSharding under jit, so
it runs across hosts.

The optimizer sees flat zero-padded vectors: element-wise optimizers (SGD,
momentum, Adam, Adagrad, RMSProp, weight decay) and global or per-leaf
norms (clipping, LAMB trust ratios: padding is zero and stays zero) are
exact; transforms that depend on a parameter's shape (Adafactor's factored
moments, masks computed from `ndim`) see vectors instead.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Any, Iterator, NamedTuple

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


class ScatteredGradients(NamedTuple):
  """Summed gradients already on the ZeRO shards: flat [roundup(n, D)] per leaf,
  sharded over 'data' (from `scatter_gradients`); `update` skips the slicing."""

  flat: Updates


class _Offer(NamedTuple):
  gradients: Updates  # the stage's gradients shaped like the params (tracers)
  flat: Updates  # the same, reduce-scattered onto the shards


_OFFERED: contextvars.ContextVar[_Offer | None] = contextvars.ContextVar(
  "sparsepipe_zero_offer", default=None
)


@contextlib.contextmanager
def offer_scattered_gradients(gradients: Updates, flat: Updates) -> Iterator[None]:
  """Offers reduce-scattered `flat` shards of `gradients` to ZeRO updates inside.

  For a TC stage: wrap its `optimizer.update(gradients, ...)` call (at trace
  time). A `zero_sharded` update inside uses `flat` when the updates it gets
  are `gradients` themselves, and refuses updates changed before it.
  """
  token = _OFFERED.set(_Offer(gradients, flat))
  try:
    yield
  finally:
    _OFFERED.reset(token)


def _same_leaves(a: Any, b: Any) -> bool:
  """Whether two pytrees hold the very same leaf objects (tracers), in the same structure."""
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  return ta == tb and all(x is y for x, y in zip(la, lb))


def _constrain(tree: Any, sharding: NamedSharding) -> Any:
  """Every leaf of `tree` constrained to the one `sharding` (under jit)."""
  return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, sharding), tree)


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


def _check_mesh(mesh: Mesh) -> None:
  if DATA_AXIS not in mesh.shape:
    raise ValueError(f"ZeRO: mesh axes {tuple(mesh.axis_names)} lack the '{DATA_AXIS}' axis")


def scatter_gradients(partial_grads: Updates) -> Updates:
  """Reduce-scatters per-device partial gradients onto the flat shards.

  Call inside `jax.shard_map` over the 'data' axis. Each device passes its
  partial gradient (parameter shapes); each gets back its 1/D slice of the
  summed flat gradient. Return it with out_specs P('data') and wrap the
  global result in `ScatteredGradients` for `update`. All leaves of one
  dtype travel in a single reduce-scatter.
  """
  d = jax.lax.axis_size(DATA_AXIS)

  def reduce_scatter(rows):  # [D, total] -> this device's [total]
    return jax.lax.psum_scatter(rows, DATA_AXIS, scatter_dimension=0, tiled=True)[0]

  rows = jax.tree.map(lambda g: _flatten(g, d).reshape(d, -1), partial_grads)
  return _packed(rows, reduce_scatter)


def zero_sharded(
  optimizer: optax.GradientTransformation, mesh: Mesh
) -> optax.GradientTransformation:
  """`optimizer` with its state partitioned over the mesh's 'data' axis.

  Args:
    optimizer: any optax GradientTransformation (see the module docstring for
      what the flat layout means for it).
    mesh: the device mesh; its 'data' axis partitions the state.

  Returns:
    A GradientTransformation: `init(params)` -> sharded state;
    `update(grads or ScatteredGradients, state, params)` -> (replicated
    updates shaped like params, new sharded state); inside
    `offer_scattered_gradients` it takes the offered shards (see the
    module docstring).
  """
  _check_mesh(mesh)
  num_shards = mesh.shape[DATA_AXIS]
  flat_sharding = NamedSharding(mesh, PartitionSpec(DATA_AXIS))
  replicated = NamedSharding(mesh, PartitionSpec())

  def leaf_sharding(x: Any) -> NamedSharding:
    shape = tuple(x.shape)
    if shape and shape[0] > 0 and shape[0] % num_shards == 0:
      return flat_sharding
    return replicated

  def constrain_state(state: Any) -> Any:
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, leaf_sharding(x)), state)

  def flatten(tree: Any) -> Any:
    return _constrain(jax.tree.map(lambda p: _flatten(p, num_shards), tree), flat_sharding)

  def all_gather(flat: Any) -> Any:
    """Flat arrays sharded over 'data' -> replicated; one all-gather per dtype."""

    def gather(tree):
      rows = _packed(tree, lambda local: jax.lax.all_gather(local, DATA_AXIS), split_axis=1)
      return jax.tree.map(lambda r: r.reshape(-1), rows)

    return jax.shard_map(
      gather,
      mesh=mesh,
      in_specs=PartitionSpec(DATA_AXIS),
      out_specs=PartitionSpec(),
      check_vma=False,
    )(flat)

  def init_fn(params: Params) -> Any:
    return constrain_state(optimizer.init(flatten(params)))

  def flat_gradients(grads: Updates) -> Updates:
    """The summed gradients on the flat shards: given, offered, or sliced."""
    if isinstance(grads, ScatteredGradients):
      return _constrain(grads.flat, flat_sharding)
    offer = _OFFERED.get()
    if offer is not None:
      if not _same_leaves(grads, offer.gradients):
        raise ValueError(
          "zero_sharded: the updates it received were changed after the gradients were"
          " computed (a transformation before it in optax.chain, or a wrapper such as"
          " MultiSteps), so it cannot use the reduce-scattered gradients: make zero_sharded"
          " the outermost transformation, e.g. zero_sharded(optax.chain(clip, adam), mesh)"
        )
      return _constrain(offer.flat, flat_sharding)
    return flatten(_constrain(grads, replicated))

  def update_fn(grads: Updates, state: Any, params: Params | None = None) -> tuple[Updates, Any]:
    if params is None:
      raise ValueError("ZeRO: update needs params (the flat shards are views of them)")
    flat_updates, state = optimizer.update(flat_gradients(grads), state, flatten(params))
    updates = all_gather(_constrain(flat_updates, flat_sharding))
    return jax.tree.map(_unflatten, updates, params), constrain_state(state)

  return optax.GradientTransformation(init_fn, update_fn)


def bytes_per_device(tree: Any) -> dict[Any, int]:
  """Bytes each device holds for the arrays of `tree` (addressable shards)."""
  totals: dict[Any, int] = {}
  for leaf in jax.tree.leaves(tree):
    for shard in leaf.addressable_shards:
      totals[shard.device] = totals.get(shard.device, 0) + shard.data.nbytes
  return totals

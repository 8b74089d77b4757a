"""ZeRO: sharded optimizer state equals the plain optax update, at 1/D memory."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sparsepipe import core
from sparsepipe import pipeline
from sparsepipe.pipeline.zero import optimizer as zero
from sparsepipe.core import DATA_AXIS, make_mesh

OPTIMIZERS = {
  "adam": optax.adam(0.05),
  "sgd_momentum": optax.sgd(0.1, momentum=0.9),
}


@pytest.fixture(scope="module")
def mesh():
  return make_mesh()


def make_params(mesh):
  # 15 and 3 elements need padding to a multiple of 8; 16 does not.
  params = {
    "a": jnp.arange(15, dtype=jnp.float32).reshape(3, 5) / 10,
    "b": jnp.linspace(-1, 1, 16, dtype=jnp.float32).reshape(2, 8),
    "c": jnp.asarray([0.5, -0.25, 2.0], jnp.float32),
  }
  return jax.device_put(params, NamedSharding(mesh, PartitionSpec()))


def grads_at(params, i):
  return jax.tree.map(lambda p: jnp.sin(p * (i + 1)) + 0.1 * i, params)


def reference(optimizer, params, steps):
  state = optimizer.init(params)
  for i in range(steps):
    updates, state = optimizer.update(grads_at(params, i), state, params)
    params = optax.apply_updates(params, updates)
  return params


def assert_close(actual, expected):
  for a, b in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_update_matches_optax(mesh, name):
  optimizer = OPTIMIZERS[name]
  z = pipeline.zero_sharded(optimizer, mesh)
  params = make_params(mesh)
  state = jax.jit(z.init)(params)

  @jax.jit
  def update(grads, state, params):
    updates, state = z.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for i in range(4):
    params, state = update(grads_at(params, i), state, params)
  assert_close(params, reference(optimizer, make_params(mesh), 4))
  for leaf in jax.tree.leaves(params):
    assert leaf.sharding.is_fully_replicated


def dyadic_part(x, d):
  """Device d's share of gradient x: multiples of 2**-10, so sums are exact."""
  return jnp.round(x * 1024.0 * (d + 1) / 36.0) / 1024.0


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_reduce_scatter_path_matches_optax(mesh, name):
  """Per-device partial gradients, reduce-scattered, then the update."""
  optimizer = OPTIMIZERS[name]
  z = pipeline.zero_sharded(optimizer, mesh)
  data = PartitionSpec(DATA_AXIS)
  base = make_params(mesh)

  @jax.jit
  def step(params, state, i):
    def local(base):
      d = jax.lax.axis_index(DATA_AXIS).astype(jnp.float32)
      return pipeline.scatter_gradients(
        jax.tree.map(lambda g: dyadic_part(g, d), grads_at(base, i))
      )

    flat = jax.shard_map(
      local,
      mesh=mesh,
      in_specs=PartitionSpec(),
      out_specs=data,
      check_vma=False,
    )(base)
    updates, state = z.update(pipeline.ScatteredGradients(flat), state, params)
    return optax.apply_updates(params, updates), state

  params = make_params(mesh)
  state = jax.jit(z.init)(params)
  ref_params = make_params(mesh)
  ref_state = optimizer.init(ref_params)
  for i in range(4):
    params, state = step(params, state, i)
    summed = jax.tree.map(
      lambda g: sum(dyadic_part(g, float(d)) for d in range(8)),
      grads_at(base, i),
    )
    updates, ref_state = optimizer.update(summed, ref_state, ref_params)
    ref_params = optax.apply_updates(ref_params, updates)
  assert_close(params, ref_params)
  hlo = step.lower(params, state, 0).compile().as_text()
  assert "reduce-scatter" in hlo and "all-gather" in hlo


def test_memory_is_exactly_one_over_d(mesh):
  params = make_params(mesh)
  d = mesh.shape[DATA_AXIS]
  state = jax.jit(pipeline.zero_sharded(optax.adam(0.1), mesh).init)(params)
  rep = NamedSharding(mesh, PartitionSpec())
  replicated = jax.jit(optax.adam(0.1).init, out_shardings=rep)(params)
  # Adam: mu and nu per param (sharded) plus the int32 count (replicated).
  padded = sum(zero.padded_size(p.size, d) for p in jax.tree.leaves(params))
  assert padded == 16 + 16 + 8
  moments = 2 * padded * 4
  per_device = zero.bytes_per_device(state)
  assert len(per_device) == d
  assert set(per_device.values()) == {moments // d + 4}
  unpadded = 2 * sum(p.size for p in jax.tree.leaves(params)) * 4
  assert set(zero.bytes_per_device(replicated).values()) == {unpadded + 4}
  # The padding is the only difference: 2 moments * (1 + 5) padded elements.
  assert moments - unpadded == 2 * 6 * 4
  for leaf in jax.tree.leaves(state[0].mu):
    assert leaf.sharding.spec == PartitionSpec(DATA_AXIS)
    assert {s.data.shape for s in leaf.addressable_shards} == {(leaf.shape[0] // d,)}


def test_no_padding_case_is_exactly_one_over_d(mesh):
  params = {"w": jnp.ones((8, 4), jnp.float32)}
  state = jax.jit(pipeline.zero_sharded(optax.sgd(0.1, momentum=0.9), mesh).init)(params)
  replicated = jax.jit(
    optax.sgd(0.1, momentum=0.9).init,
    out_shardings=NamedSharding(mesh, PartitionSpec()),
  )(params)
  (full,) = set(zero.bytes_per_device(replicated).values())
  assert set(zero.bytes_per_device(state).values()) == {full // 8}


def test_sharding_and_abstract_state(mesh):
  params = make_params(mesh)
  abstract_params = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
  z = pipeline.zero_sharded(optax.adam(0.1), mesh)
  abstract = pipeline.abstract_train_state(z, abstract_params, mesh, None).opt_state
  state = jax.jit(z.init)(params)
  as_tuple = lambda x: (x.shape, x.dtype, x.sharding)
  assert jax.tree.map(as_tuple, abstract) == jax.tree.map(as_tuple, state)
  sharding = pipeline.train_state_sharding(z, abstract_params, mesh, None).opt_state
  assert jax.tree.map(lambda x: x.sharding, state) == sharding
  assert abstract[0].count.sharding.spec == PartitionSpec()
  assert abstract[0].mu["a"].shape == (16,)
  assert abstract[0].mu["a"].sharding.spec == PartitionSpec(DATA_AXIS)


def test_chains_with_optax_like_any_gradient_transformation(mesh):
  """Clipping before ZeRO, and ZeRO around a chain, equal plain optax."""
  inner = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(0.05))
  for z in (
    optax.chain(optax.clip_by_global_norm(0.5), pipeline.zero_sharded(optax.adam(0.05), mesh)),
    pipeline.zero_sharded(inner, mesh),
  ):
    params = make_params(mesh)
    state = jax.jit(z.init)(params)
    for i in range(3):
      updates, state = jax.jit(z.update)(grads_at(params, i), state, params)
      params = optax.apply_updates(params, updates)
    assert_close(params, reference(inner, make_params(mesh), 3))


def test_single_device_mesh():
  mesh = core.make_mesh(jax.devices()[:1])
  opt = optax.adam(0.05)
  z = pipeline.zero_sharded(opt, mesh)
  params = make_params(mesh)
  state = jax.jit(z.init)(params)
  updates, _ = jax.jit(z.update)(grads_at(params, 0), state, params)
  assert_close(optax.apply_updates(params, updates), reference(opt, make_params(mesh), 1))


def test_mesh_without_data_axis_is_an_error():
  mesh = Mesh(np.asarray(jax.devices()), ("model",))
  with pytest.raises(ValueError, match=r"ZeRO: mesh axes \('model',\) lack the 'data' axis"):
    pipeline.zero_sharded(optax.adam(0.1), mesh)


@pytest.mark.parametrize("zero", [False, True])
def test_train_state_of_any_optimizer_has_its_shardings_on_the_whole_mesh(mesh, zero):
  """A plain optax Adam's count (made from a constant in init) was left on one
  device, and a jitted step with the state's shardings refused it."""
  optimizer = optax.adam(0.1)
  if zero:
    optimizer = pipeline.zero_sharded(optimizer, mesh)
  params = make_params(mesh)
  state = pipeline.create_train_state(optimizer, params, mesh, None)
  expected = pipeline.train_state_sharding(optimizer, params, mesh, None)
  assert jax.tree.map(lambda x: x.sharding, state) == expected
  for leaf in jax.tree.leaves(state.opt_state):
    assert leaf.sharding.device_set == set(mesh.devices.flat)

"""Stacks of tables with different embedding dims, as jax-tpu-embedding allows.

Every table of such a stack is padded to the largest padded dim (a warning,
or an error with fail_on_excess_padding=True); preprocessing, lookups (each
feature gets its own dim), updates with slots, unstacking and re-layout to
another device count must all work on it. The COO buffers of such stacks
are compared with the reference by the golden fixture coo_mixed_dims.npz
and the randomized oracle cases.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import logging

from sparsepipe import core
from sparsepipe import transforms as T
from sparsepipe.core import data_sharding
from sparsepipe.core import make_mesh
from sparsepipe.pipeline import init_embedding_variables
from sparsepipe.pipeline import sparse_dense_matmul
from sparsepipe.pipeline import sparse_dense_matmul_grad
from sparsepipe.pipeline import stack_embedding_variables
from sparsepipe.pipeline import unstack_embedding_variables

OPT = core.AdagradOptimizerSpec(0.1, initial_accumulator_value=0.5)
BATCH = 16


def _specs(g, s, **kw):
  init = core.UniformInitializer(0.5)
  table = lambda name, vocab, dim: core.TableSpec(
    name, vocab, dim, "mean", initializer=init, optimizer=OPT
  )
  tables = [table("a", 50, 4), table("b", 30, 16), table("c", 20, 10)]
  specs = {
    f"f{t.name}": core.FeatureSpec(f"f{t.name}", t, (BATCH, 3), (BATCH, t.embedding_dim))
    for t in tables
  }
  # A feature may read fewer columns than its table has.
  specs["fb2"] = core.FeatureSpec("fb2", tables[1], (BATCH, 2), (BATCH, 5))
  return T.stack_tables(
    specs,
    ["a", "b", "c"],
    g,
    s,
    rotation=1,
    stack_name="abc",
    stack_to_max_ids_per_partition=lambda n, c: 64,
    stack_to_max_unique_ids_per_partition=lambda n, c: 64,
    **kw,
  )


def test_stack_pads_to_the_largest_dim_and_warns(monkeypatch):
  warnings = []
  monkeypatch.setattr(logging, "warning", lambda fmt, *a: warnings.append(fmt % a))
  specs = _specs(2, 2)
  stacked = specs["fa"].table_spec.stacked_table_spec
  assert stacked.stack_embedding_dim == 16
  for name in ("fa", "fb", "fc"):
    assert specs[name].table_spec.setting_in_stack.padded_embedding_dim == 16
  # a: 64 padded rows * 8 more columns; b and c are padded to 16 anyway.
  assert warnings == [
    "stack 'abc': tables ['a', 'b', 'c'] have padded embedding dims"
    " [8, 16, 16]; padding them to 16 adds 512 values. Stack tables of"
    " equal padded dims to save memory"
  ]
  with pytest.raises(
    T.StackingError,
    match=re.escape(
      "stack 'abc': tables ['a', 'b', 'c'] have padded embedding dims"
      " [8, 16, 16]; padding them to 16 adds 512 values."
    ),
  ):
    _specs(2, 2, fail_on_excess_padding=True)


def test_auto_stack_groups_by_padded_dim():
  tables = [core.TableSpec(n, 40, d) for n, d in (("a", 8), ("b", 16), ("c", 5), ("d", 12))]
  specs = {t.name: core.FeatureSpec(t.name, t, (8, 2), (8, t.embedding_dim)) for t in tables}
  out = T.auto_stack_tables(specs, 1, 2)
  assert T.get_table_stacks(out) == {"a_c": ["a", "c"], "b_d": ["b", "d"]}


@functools.lru_cache(maxsize=None)
def _setup(g, s):
  specs = _specs(g, s)
  mesh = make_mesh(jax.devices()[:g])
  kw = dict(feature_specs=specs, mesh=mesh, num_sc_per_device=s)
  return (
    specs,
    mesh,
    jax.jit(functools.partial(sparse_dense_matmul, **kw)),
    jax.jit(functools.partial(sparse_dense_matmul_grad, **kw)),
  )


def _batch(rng, spec):
  valency = spec.input_shape[1]
  return rng.integers(0, spec.table_spec.vocabulary_size, (BATCH, valency))


@pytest.mark.parametrize("g,s", [(2, 2), (4, 1)])
def test_lookup_update_and_unstack(g, s):
  specs, mesh, lookup, update = _setup(g, s)
  state = init_embedding_variables(jax.random.key(3), specs, mesh, num_sc_per_device=s)
  assert state["abc"].table.shape == (64 + 32 + 32, 16)
  logical = unstack_embedding_variables(state, specs, num_sc_per_device=s)
  assert {k: v.table.shape for k, v in logical.items()} == {
    "a": (50, 4),
    "b": (30, 16),
    "c": (20, 10),
  }
  rng = np.random.default_rng(g)
  batches = {k: _batch(rng, f).astype(np.int32) for k, f in specs.items()}
  pre, _ = T.preprocess_sparse_dense_matmul_input(batches, None, specs, g, g, num_sc_per_device=s)
  sparse = jax.device_put(pre.sparse_dense_matmul_input, data_sharding(mesh))
  acts = lookup(sparse, state)
  grads = {}
  dense = {k: np.zeros(v.table.shape) for k, v in logical.items()}
  for key, spec in specs.items():
    table = logical[spec.table_spec.name].table.astype(np.float64)
    dim = spec.output_shape[1]
    want = table[batches[key], :dim].mean(axis=1)
    assert acts[key].shape == (BATCH, dim)
    np.testing.assert_allclose(np.asarray(acts[key]), want, rtol=2e-6, atol=2e-7)
    grads[key] = rng.normal(size=(BATCH, dim)).astype(np.float32)
    valency = batches[key].shape[1]
    np.add.at(
      dense[spec.table_spec.name][:, :dim],
      batches[key].reshape(-1),
      np.repeat(grads[key] / valency, valency, axis=0),
    )
  state = update(jax.tree.map(jnp.asarray, grads), sparse, state, step=0)
  after = unstack_embedding_variables(state, specs, num_sc_per_device=s)
  for name, old in logical.items():
    accumulator = old.slots[0] + dense[name] ** 2
    table = old.table - 0.1 * dense[name] / np.sqrt(accumulator)
    np.testing.assert_allclose(after[name].table, table, rtol=2e-6, atol=2e-7)
    np.testing.assert_allclose(after[name].slots[0], accumulator, rtol=2e-6)
  # Padding columns of the narrow table stay zero in the physical table.
  physical = np.asarray(state["abc"].table)
  ids = np.arange(50)
  rows = T.compute_physical_row_ids(g * s, physical.shape[0], 0, 0, ids)
  np.testing.assert_array_equal(physical[rows, 4:], 0.0)
  np.testing.assert_array_equal(physical[rows, :4], after["a"].table)
  # Re-layout onto another device count gives the same logical tables.
  other_g = 8 // g
  other_specs, other_mesh, _, _ = _setup(other_g, s)
  moved = stack_embedding_variables(after, other_specs, other_mesh, num_sc_per_device=s)
  back = unstack_embedding_variables(moved, other_specs, num_sc_per_device=s)
  for name, v in after.items():
    np.testing.assert_array_equal(back[name].table, v.table)
    np.testing.assert_array_equal(back[name].slots[0], v.slots[0])

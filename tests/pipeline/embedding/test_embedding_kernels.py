"""Exactness of the portable embedding lookup and update kernels.

Buffers come from sparsepipe's own preprocessing; references are dense
numpy computations on the logical tables. One set of specs covers every
combiner, optimizer, table stacking with rotation, feature stacking, padded
embedding dims and a partition filled exactly to max_ids_per_partition; it
runs on 1, 2 and 8 of the CPU devices for two steps (the second reuses the
compiled functions: same shapes).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparsepipe.data.ragged import RaggedBatch
from sparsepipe.pipeline import EmbeddingLayoutError
from sparsepipe.pipeline import abstract_embedding_variables
from sparsepipe.core import data_sharding
from sparsepipe.pipeline import dense_lookup_baseline
from sparsepipe.pipeline import dense_sgd_update_baseline
from sparsepipe.pipeline import init_embedding_variables
from sparsepipe.core import make_mesh
from sparsepipe.pipeline import sparse_dense_matmul
from sparsepipe.pipeline import sparse_dense_matmul_grad
from sparsepipe.pipeline import unstack_embedding_variables
from sparsepipe.core import AdagradOptimizerSpec
from sparsepipe.core import AdamOptimizerSpec
from sparsepipe.core import FeatureSpec
from sparsepipe.core import SGDOptimizerSpec
from sparsepipe.core import SparseDenseMatmulInput
from sparsepipe.core import TableSpec
from sparsepipe.core import UniformInitializer
from sparsepipe.transforms import prepare_feature_specs_for_training
from sparsepipe.transforms import preprocess_sparse_dense_matmul_input
from sparsepipe.transforms import stack_tables


def _sgd_schedule(step):
  return 0.5 / (1.0 + step)


ADAM = AdamOptimizerSpec(learning_rate=0.05)
ADAGRAD = AdagradOptimizerSpec(learning_rate=0.1, initial_accumulator_value=0.2)
SGD = SGDOptimizerSpec(learning_rate=_sgd_schedule)
BATCH = 16
# (devices, SparseCores per device): N = 4, 4 and 16 global SparseCores.
CONFIGS = [(1, 4), (2, 2), (8, 2)]


@functools.lru_cache(maxsize=None)
def _setup(g, s):
  """Specs, mesh and jitted kernels of one config (cached: compile once)."""
  init = UniformInitializer(0.5)  # compiles faster than a truncated normal
  t0 = TableSpec("t0", 50, 8, "mean", initializer=init, optimizer=ADAM)
  t1 = TableSpec("t1", 30, 6, "mean", initializer=init, optimizer=ADAM)
  t2 = TableSpec("t2", 20, 16, "sum", initializer=init, optimizer=ADAGRAD, max_ids_per_partition=64)
  # t3: every SC fills partition 0 to exactly max_ids_per_partition, with a
  # COO buffer smaller than the theoretical maximum.
  t3 = TableSpec(
    "t3",
    130,
    4,
    "sqrtn",
    initializer=init,
    optimizer=SGD,
    max_ids_per_partition=8,
    max_unique_ids_per_partition=8,
    suggested_coo_buffer_size_per_device=16 * s,
  )
  feature = lambda name, table, batch: FeatureSpec(
    name, table, (batch, 4), (batch, table.embedding_dim)
  )
  specs = {
    "f0": feature("f0", t0, BATCH),
    "f1": feature("f1", t1, BATCH),
    "f2a": feature("f2a", t2, BATCH),
    "f2b": feature("f2b", t2, 2 * BATCH),
    "f3": feature("f3", t3, BATCH),
  }
  specs = stack_tables(
    specs,
    ["t0", "t1"],
    g,
    s,
    rotation=3,
    stack_to_max_ids_per_partition=lambda name, batch: 64,
    stack_to_max_unique_ids_per_partition=lambda name, batch: 64,
  )
  specs = prepare_feature_specs_for_training(specs, g, s)
  mesh = make_mesh(jax.devices()[:g])
  kw = dict(feature_specs=specs, mesh=mesh, num_sc_per_device=s)
  lookup = jax.jit(functools.partial(sparse_dense_matmul, **kw))
  update = jax.jit(functools.partial(sparse_dense_matmul_grad, **kw), donate_argnums=(2,))
  return specs, mesh, lookup, update


def _ragged(rng, spec, n, weighted):
  """Random rows with duplicates inside and across samples, empty rows."""
  vocab = spec.table_spec.vocabulary_size
  batch = spec.global_batch_size
  if spec.name == "f3":
    # Sample j of SC c holds M / n_f distinct multiples of N: partition 0 of
    # every SC gets exactly M = 8 entries.
    per_sample = 8 // (batch // n)
    rows = [n * (np.arange(per_sample) + per_sample * (j % (batch // n))) for j in range(batch)]
  else:
    rows = [rng.integers(0, vocab, rng.integers(0, 6)) for _ in range(batch)]
    rows[0] = np.array([1, 1, 2])
    rows[1] = np.array([2, 2])
    rows[2] = np.array([], np.int64)
  lengths = np.array([len(r) for r in rows], np.int32)
  values = np.concatenate(rows).astype(np.int32)
  weights = None
  if weighted:
    weights = rng.uniform(0.5, 2.0, values.shape).astype(np.float32)
  return RaggedBatch(values, lengths, weights)


def _gains(weights, combiner):
  if combiner == "sum":
    return weights
  if combiner == "mean":
    return weights / weights.sum()
  return weights / np.sqrt((weights * weights).sum())


def _samples(spec, batch):
  """(row index, ids, gains) per non-empty sample, in float64."""
  splits = batch.row_splits()
  weights = (np.ones(batch.values.shape) if batch.weights is None else batch.weights).astype(
    np.float64
  )
  for i in range(batch.batch_size):
    ids = batch.values[splits[i] : splits[i + 1]]
    if ids.size:
      w = weights[splits[i] : splits[i + 1]]
      yield i, ids, _gains(w, spec.table_spec.combiner)


def _reference_activations(spec, batch, logical):
  out = np.zeros(spec.output_shape, np.float64)
  table = logical[spec.table_spec.name].table.astype(np.float64)
  for i, ids, gains in _samples(spec, batch):
    out[i] = gains @ table[ids, : spec.output_shape[-1]]
  return out


def _reference_update(specs, batches, grads, logical, step):
  """Dense gradients, then each optimizer on the touched rows only."""
  dense = {name: np.zeros(v.table.shape) for name, v in logical.items()}
  touched = {name: set() for name in logical}
  for key, spec in specs.items():
    name = spec.table_spec.name
    grad = np.asarray(grads[key], np.float64)
    for i, ids, gains in _samples(spec, batches[key]):
      for row, gain in zip(ids, gains):
        dense[name][row, : grad.shape[1]] += gain * grad[i]
        touched[name].add(int(row))
  optimizers = {s.table_spec.name: s.table_spec.optimizer for s in specs.values()}
  new = {}
  for name, old in logical.items():
    rows = np.array(sorted(touched[name]), np.int64)
    g = dense[name][rows]
    table = old.table.astype(np.float64).copy()
    slots = [x.astype(np.float64).copy() for x in old.slots]
    opt = optimizers[name]
    lr = opt.learning_rate
    lr = lr(step) if callable(lr) else lr
    if isinstance(opt, SGDOptimizerSpec):
      table[rows] -= lr * g
    elif isinstance(opt, AdagradOptimizerSpec):
      slots[0][rows] += g * g
      table[rows] -= lr * g / np.sqrt(slots[0][rows])
    else:
      m, v = slots
      m[rows] = opt.beta_1 * m[rows] + (1 - opt.beta_1) * g
      v[rows] = opt.beta_2 * v[rows] + (1 - opt.beta_2) * g * g
      m_hat = m[rows] / (1 - opt.beta_1 ** (step + 1))
      v_hat = v[rows] / (1 - opt.beta_2 ** (step + 1))
      table[rows] -= lr * m_hat / (np.sqrt(v_hat) + opt.epsilon)
    new[name] = (table, slots)
  return new


def _preprocess(specs, batches, g, s, mesh):
  pre, _ = preprocess_sparse_dense_matmul_input(batches, None, specs, g, g, num_sc_per_device=s)
  put = lambda x: jax.device_put(x, data_sharding(mesh))
  return jax.tree.map(put, pre.sparse_dense_matmul_input)


def _assert_close(actual, expected):
  np.testing.assert_allclose(actual, expected, rtol=2e-6, atol=2e-7)


def _touched(specs, batches):
  """{table: the rows some sample's ids name}: what an update writes."""
  rows = {}
  for key, spec in specs.items():
    for _, ids, _ in _samples(spec, batches[key]):
      rows.setdefault(spec.table_spec.name, set()).update(int(i) for i in ids)
  return rows


@pytest.mark.parametrize("g,s", CONFIGS)
def test_lookup_and_update_match_dense_references(g, s):
  specs, mesh, lookup, update = _setup(g, s)
  n = g * s
  state = init_embedding_variables(
    jax.random.key(1), specs, mesh, num_sc_per_device=s, track_updates=True
  )
  logical = unstack_embedding_variables(state, specs, num_sc_per_device=s)
  updated = {name: np.zeros(v.table.shape[0], np.int32) for name, v in logical.items()}
  rng = np.random.default_rng(g * 10 + s)
  for step in range(2):
    batches = {k: _ragged(rng, f, n, weighted=step == 0) for k, f in specs.items()}
    sparse = _preprocess(specs, batches, g, s, mesh)
    acts = lookup(sparse, state)
    assert set(acts) == set(specs)
    for key, spec in specs.items():
      assert acts[key].shape == spec.output_shape
      assert acts[key].dtype == jnp.float32
      _assert_close(np.asarray(acts[key]), _reference_activations(spec, batches[key], logical))
    grads = {k: jnp.asarray(rng.normal(size=a.shape), jnp.float32) for k, a in acts.items()}
    expected = _reference_update(specs, batches, grads, logical, step)
    for name, rows in _touched(specs, batches).items():
      updated[name][sorted(rows)] = step + 1  # the batch number of this update
    old_tables = [v.table for v in state.values()]
    state = update(grads, sparse, state, step=jnp.int32(step))
    assert all(t.is_deleted() for t in old_tables)  # donated: in place
    logical = unstack_embedding_variables(state, specs, num_sc_per_device=s)
    for name, (table, slots) in expected.items():
      _assert_close(logical[name].table, table)
      assert len(logical[name].slots) == len(slots)
      for got, want in zip(logical[name].slots, slots):
        _assert_close(got, want)
      np.testing.assert_array_equal(logical[name].updated, updated[name], err_msg=name)
  # Padding rows and columns are never written, nor marked updated.
  for name, v in state.items():
    table = np.asarray(v.table)
    assert table.shape[0] % (8 * n) == 0
  padded_t3 = np.asarray(state["t3"].table)
  np.testing.assert_array_equal(padded_t3[:, 4:], 0.0)
  marked = sum(int(np.count_nonzero(np.asarray(v.updated))) for v in state.values())
  assert marked == sum(int(np.count_nonzero(u)) for u in updated.values())


@pytest.mark.parametrize("g,s", [(2, 2)])
def test_all_zero_buffers_change_nothing(g, s):
  """The pipeline's dummy inputs (all zeros) select no entry at all."""
  specs, mesh, lookup, update = _setup(g, s)
  state = init_embedding_variables(
    jax.random.key(2), specs, mesh, num_sc_per_device=s, track_updates=True
  )
  batches = {k: _ragged(np.random.default_rng(0), f, g * s, True) for k, f in specs.items()}
  sparse = _preprocess(specs, batches, g, s, mesh)
  zeros = jax.tree.map(jnp.zeros_like, sparse)
  before = jax.tree.map(np.asarray, state)
  for act in lookup(zeros, state).values():
    np.testing.assert_array_equal(np.asarray(act), 0.0)
  grads = {k: jnp.ones(f.output_shape, jnp.float32) for k, f in specs.items()}
  state = update(grads, zeros, state, step=jnp.int32(5))
  after = jax.tree.map(np.asarray, state)
  jax.tree.map(np.testing.assert_array_equal, after, before)


def test_buffers_with_leading_dimension_are_rejected():
  specs, mesh, lookup, _ = _setup(2, 2)
  batches = {k: _ragged(np.random.default_rng(0), f, 4, True) for k, f in specs.items()}
  pre, _ = preprocess_sparse_dense_matmul_input(
    batches, None, specs, 2, 2, num_sc_per_device=2, has_leading_dimension=True
  )
  state = init_embedding_variables(jax.random.key(0), specs, mesh, num_sc_per_device=2)
  with pytest.raises(
    EmbeddingLayoutError,
    match=r"stack 't0_t1': lhs_row_pointers has shape \(2, 16\), expected"
    r" \(32,\) \(2 devices, flattened",
  ):
    lookup(pre.sparse_dense_matmul_input, state)
  missing = SparseDenseMatmulInput({}, {}, {}, {})
  with pytest.raises(
    EmbeddingLayoutError,
    match="sparse input lhs_row_pointers has no stack 't0_t1'",
  ):
    lookup(missing, state)


def test_gradient_shape_is_checked():
  specs, mesh, _, update = _setup(2, 2)
  state = init_embedding_variables(jax.random.key(0), specs, mesh, num_sc_per_device=2)
  batches = {k: _ragged(np.random.default_rng(0), f, 4, True) for k, f in specs.items()}
  sparse = _preprocess(specs, batches, 2, 2, mesh)
  grads = {k: jnp.zeros(f.output_shape, jnp.float32) for k, f in specs.items()}
  grads["f1"] = jnp.zeros((16, 8), jnp.float32)
  with pytest.raises(
    EmbeddingLayoutError,
    match=r"feature 'f1': activation gradient has shape \(16, 8\), expected"
    r" \(16, 6\)",
  ):
    update(grads, sparse, state, step=0)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_dense_baseline_matches_reference(combiner):
  rng = np.random.default_rng(3)
  table = rng.normal(size=(10, 4)).astype(np.float32)
  ids = np.array([[1, 1, 3], [0, -1, -1], [-1, -1, -1]], np.int32)
  weights = rng.uniform(0.5, 2.0, ids.shape).astype(np.float32)
  grads = rng.normal(size=(3, 4)).astype(np.float32)
  expected_acts = np.zeros((3, 4))
  expected_table = table.astype(np.float64).copy()
  for i in range(3):
    keep = ids[i] >= 0
    if keep.any():
      gains = _gains(weights[i][keep].astype(np.float64), combiner)
      expected_acts[i] = gains @ table[ids[i][keep]]
      for row, gain in zip(ids[i][keep], gains):
        expected_table[row] -= 0.1 * gain * grads[i]
  acts = dense_lookup_baseline(table, ids, weights, combiner)
  _assert_close(np.asarray(acts), expected_acts)
  new = dense_sgd_update_baseline(table, ids, weights, combiner, grads, 0.1)
  _assert_close(np.asarray(new), expected_table)


def test_memory_grows_with_the_batch_not_the_table():
  """Compiled (never run) on a 64 MiB table: temporaries stay tiny."""
  g, s = 2, 2
  table = TableSpec("big", 1 << 21, 8, optimizer=ADAM, max_ids_per_partition=16)
  specs = prepare_feature_specs_for_training({"f": FeatureSpec("f", table, (16, 2), (16, 8))}, g, s)
  mesh = make_mesh(jax.devices()[:g])
  batches = {"f": _ragged(np.random.default_rng(0), specs["f"], g * s, True)}
  sparse = _preprocess(specs, batches, g, s, mesh)
  state = abstract_embedding_variables(specs, mesh, num_sc_per_device=s)
  grads = {"f": jax.ShapeDtypeStruct((16, 8), jnp.float32)}
  kw = dict(feature_specs=specs, mesh=mesh, num_sc_per_device=s)
  update = jax.jit(functools.partial(sparse_dense_matmul_grad, **kw), donate_argnums=(2,))
  memory = update.lower(grads, sparse, state, step=0).compile()
  memory = memory.memory_analysis()
  shard_bytes = (1 << 21) * 8 * 4 // g
  assert memory.temp_size_in_bytes < shard_bytes // 50
  # Table and both Adam slots are updated in place (donated, aliased).
  assert memory.alias_size_in_bytes >= 3 * shard_bytes

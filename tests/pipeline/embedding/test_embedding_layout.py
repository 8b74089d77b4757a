"""The MOD layout of stacked tables: placement, init, shardings, re-layout."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from initial_values import assert_same_draws  # pylint: disable=g-bad-import-order

from sparsepipe.core import DATA_AXIS
from sparsepipe.pipeline import EmbeddingLayoutError
from sparsepipe.pipeline import EmbeddingVariables
from sparsepipe.pipeline import abstract_embedding_variables
from sparsepipe.pipeline import embedding_variables_sharding
from sparsepipe.pipeline import init_embedding_variables
from sparsepipe.pipeline import logical_to_physical
from sparsepipe.core import make_mesh
from sparsepipe.pipeline import physical_to_logical
from sparsepipe.pipeline import stack_embedding_tables
from sparsepipe.pipeline import stack_embedding_variables
from sparsepipe.pipeline import stack_layouts
from sparsepipe.pipeline import unstack_embedding_tables
from sparsepipe.pipeline import unstack_embedding_variables
from sparsepipe.pipeline.embedding import variables as embedding_variables
from sparsepipe.pipeline.embedding.variables import table_key
from sparsepipe.core import AdagradOptimizerSpec
from sparsepipe.core import FeatureSpec
from sparsepipe.core import TableSpec
from sparsepipe.pipeline.embedding.exchange import send_buffers
from sparsepipe.transforms import apply_stack_limits
from sparsepipe.transforms import compute_coo_buffer_size_per_device
from sparsepipe.transforms import get_stack_limits
from sparsepipe.transforms import prepare_feature_specs_for_training
from sparsepipe.transforms import stack_tables

S = 2
ADAGRAD = AdagradOptimizerSpec(learning_rate=0.1, initial_accumulator_value=0.25)


def _raw_specs():
  tables = [
    TableSpec("t0", 50, 8, optimizer=ADAGRAD),
    TableSpec("t1", 30, 6, optimizer=ADAGRAD),
    TableSpec("t2", 70, 16, optimizer=ADAGRAD),
  ]
  return {
    f"f{i}": FeatureSpec(f"f{i}", t, (16, 4), (16, t.embedding_dim)) for i, t in enumerate(tables)
  }


def _specs(g, stacked=True):
  specs = _raw_specs()
  if stacked:
    specs = stack_tables(specs, ["t0", "t1"], g, S)
  return prepare_feature_specs_for_training(specs, g, S)


def _mesh(g):
  return make_mesh(jax.devices()[:g])


def _random_logical(specs, seed, *, updated=False):
  rng = np.random.default_rng(seed)
  out = {}
  for f in specs.values():
    t = f.table_spec
    shape = (t.vocabulary_size, t.embedding_dim)
    out[t.name] = EmbeddingVariables(
      rng.normal(size=shape).astype(np.float32),
      (rng.uniform(0.1, 1.0, shape).astype(np.float32),),
      rng.integers(0, 1000, t.vocabulary_size).astype(np.int32) if updated else None,
    )
  return out


@pytest.mark.parametrize("g", [1, 2, 8])
def test_physical_rows_follow_the_coo_mod_formula(g):
  specs = _specs(g)
  n = g * S
  layouts = stack_layouts(specs, n)
  assert sorted(layouts) == ["t0_t1", "t2"]
  for f in specs.values():
    layout = layouts[f.stack_name]
    ids = np.arange(f.table_spec.vocabulary_size)
    t = f.id_transformation
    col = ((ids + t.col_shift) & (n - 1)) + (ids & ~(n - 1)) + t.col_offset
    expected = (col % n) * (layout.vocab_size // n) + col // n
    np.testing.assert_array_equal(layout.physical_rows(f.table_spec.name, ids), expected)
  # The second table of the stack is rotated once N > 2.
  assert specs["f1"].id_transformation.col_shift == (S if n > S else 0)


def test_physical_rows_agree_with_jax_tpu_embedding():
  table_stacking = pytest.importorskip("jax_tpu_embedding.sparsecore.lib.nn.table_stacking")
  specs = _specs(8)
  layouts = stack_layouts(specs, 16)
  for f in specs.values():
    layout, setting = layouts[f.stack_name], f.table_spec.setting_in_stack
    ids = np.arange(f.table_spec.vocabulary_size)
    expected = table_stacking.compute_physical_row_ids(
      16, layout.vocab_size, setting.shard_rotation, setting.row_offset_in_shard, ids
    )
    np.testing.assert_array_equal(layout.physical_rows(f.table_spec.name, ids), expected)


def test_logical_physical_round_trip_on_host():
  specs = _specs(2)
  layout = stack_layouts(specs, 4)["t0_t1"]
  logical = {k: v.table for k, v in _random_logical(specs, 0).items()}
  stacked = {k: logical[k] for k in ("t0", "t1")}
  physical = logical_to_physical(layout, stacked)
  assert physical.shape == (layout.vocab_size, 8)
  written = np.zeros(physical.shape, bool)
  for name, values in stacked.items():
    rows = layout.physical_rows(name, np.arange(values.shape[0]))
    np.testing.assert_array_equal(physical[rows, : values.shape[1]], values)
    written[rows, : values.shape[1]] = True
  np.testing.assert_array_equal(physical[~written], 0.0)
  filled = logical_to_physical(layout, stacked, np.full(physical.shape, 7.0))
  np.testing.assert_array_equal(filled[~written], 7.0)
  np.testing.assert_array_equal(filled[written], physical[written])
  back = physical_to_logical(layout, physical)
  for name, values in stacked.items():
    np.testing.assert_array_equal(back[name], values)


def test_init_is_sharded_nonzero_and_independent_of_devices_and_stacking():
  key = jax.random.key(7)
  specs8, mesh8 = _specs(8), _mesh(8)
  state = init_embedding_variables(key, specs8, mesh8, num_sc_per_device=S)
  assert sorted(state) == ["t0_t1", "t2"]
  layouts = stack_layouts(specs8, 16)
  for name, v in state.items():
    layout = layouts[name]
    assert v.table.shape == (layout.vocab_size, layout.dim)
    assert v.table.dtype == jnp.float32
    assert v.table.sharding == NamedSharding(mesh8, PartitionSpec(DATA_AXIS, None))
    assert {s.data.shape for s in v.table.addressable_shards} == {
      (layout.vocab_size // 8, layout.dim)
    }
    assert len(v.slots) == 1
    np.testing.assert_array_equal(np.asarray(v.slots[0]), 0.25)
    # Padding rows and columns are zero; every real row is initialised.
    written = np.zeros(v.table.shape, bool)
    for t in layout.tables:
      rows = layout.physical_rows(t.name, np.arange(t.vocabulary_size))
      written[rows, : t.embedding_dim] = True
    table = np.asarray(v.table)
    np.testing.assert_array_equal(table[~written], 0.0)
    assert np.all(table[written] != 0.0)
  logical8 = unstack_embedding_tables(state, specs8, num_sc_per_device=S)
  for f in specs8.values():
    t = f.table_spec
    expected = t.initializer(
      table_key(key, t.name), (t.vocabulary_size, t.embedding_dim), jnp.float32
    )
    assert_same_draws(logical8[t.name], expected)
  for g, stacked in ((4, True), (2, False)):
    specs = _specs(g, stacked)
    other = init_embedding_variables(key, specs, _mesh(g), num_sc_per_device=S)
    logical = unstack_embedding_tables(other, specs, num_sc_per_device=S)
    assert logical.keys() == logical8.keys()
    for name, values in logical.items():
      assert_same_draws(values, logical8[name])


def test_relayout_from_8_to_4_devices_keeps_every_row():
  logical = _random_logical(_specs(8), 1, updated=True)
  specs8, mesh8 = _specs(8), _mesh(8)
  specs4, mesh4 = _specs(4), _mesh(4)
  state8 = stack_embedding_variables(logical, specs8, mesh8, num_sc_per_device=S)
  back8 = unstack_embedding_variables(state8, specs8, num_sc_per_device=S)
  state4 = stack_embedding_variables(back8, specs4, mesh4, num_sc_per_device=S)
  back4 = unstack_embedding_variables(state4, specs4, num_sc_per_device=S, global_device_count=4)
  for back in (back8, back4):
    assert back.keys() == logical.keys()
    for name, v in logical.items():
      np.testing.assert_array_equal(back[name].table, v.table)
      np.testing.assert_array_equal(back[name].slots[0], v.slots[0])
      # The last update of each row moves with the row.
      np.testing.assert_array_equal(back[name].updated, v.updated)
  # Padding is to multiples of 8*N rows: the physical arrays differ.
  assert state8["t0_t1"].table.shape == (256, 8)
  assert state4["t0_t1"].table.shape == (128, 8)
  assert state4["t2"].table.sharding.mesh == mesh4
  # Slot padding holds the slot's initial value, table padding zero.
  layout = stack_layouts(specs4, 8)["t2"]
  rows = layout.physical_rows("t2", np.arange(70))
  pad = np.setdiff1d(np.arange(layout.vocab_size), rows)
  np.testing.assert_array_equal(np.asarray(state4["t2"].slots[0])[pad], 0.25)
  np.testing.assert_array_equal(np.asarray(state4["t2"].table)[pad], 0.0)
  np.testing.assert_array_equal(np.asarray(state4["t2"].updated)[pad], 0)
  assert state4["t2"].updated.sharding == NamedSharding(mesh4, PartitionSpec(DATA_AXIS))


def test_stack_embedding_tables_from_host_and_device_arrays():
  specs, mesh = _specs(2), _mesh(2)
  logical = {k: v.table for k, v in _random_logical(specs, 2).items()}
  logical["t2"] = jnp.asarray(logical["t2"])
  tables = stack_embedding_tables(logical, specs, mesh, S)
  assert tables["t2"].sharding == NamedSharding(mesh, PartitionSpec(DATA_AXIS, None))
  back = unstack_embedding_tables(tables, specs, num_sc_per_device=S)
  for name, values in logical.items():
    np.testing.assert_array_equal(back[name], np.asarray(values))


def test_abstract_variables_and_shardings_match_init():
  specs, mesh = _specs(2), _mesh(2)
  abstract = abstract_embedding_variables(specs, mesh, num_sc_per_device=S)
  shardings = embedding_variables_sharding(specs, mesh)
  sharding = NamedSharding(mesh, PartitionSpec(DATA_AXIS, None))
  assert shardings == {
    "t0_t1": EmbeddingVariables(sharding, (sharding,)),
    "t2": EmbeddingVariables(sharding, (sharding,)),
  }
  assert abstract["t0_t1"] == EmbeddingVariables(
    jax.ShapeDtypeStruct((96, 8), jnp.float32, sharding=sharding),
    (jax.ShapeDtypeStruct((96, 8), jnp.float32, sharding=sharding),),
  )
  assert abstract["t2"].table.shape == (96, 16)


def test_layout_errors_name_the_problem():
  raw = _raw_specs()
  with pytest.raises(
    EmbeddingLayoutError,
    match=r"feature 'f0' \(table 't0'\): table_spec.stacked_table_spec is None;"
    " pass feature specs returned by prepare_feature_specs_for_training",
  ):
    stack_layouts(raw, 4)
  with pytest.raises(
    EmbeddingLayoutError,
    match="the number of global SparseCores must be a power of two, got 6",
  ):
    stack_layouts(_specs(2), 6)
  with pytest.raises(
    EmbeddingLayoutError,
    match=r"stack 't0_t1', table 't1': row_offset_in_shard=8, expected 16 for"
    r" 8 SparseCores \(tables must tile the shard; specs prepared for another"
    r" device count\?\)",
  ):
    stack_layouts(_specs(8), 8)
  specs = _specs(2)
  twice = {"a": specs["f0"], "b": dataclasses.replace(specs["f1"], name="f0")}
  with pytest.raises(EmbeddingLayoutError, match=r"feature names are not unique: \['f0'\]"):
    stack_layouts(twice, 4)
  odd = dict(specs, f2=dataclasses.replace(specs["f2"], input_shape=(10, 4), output_shape=(10, 16)))
  with pytest.raises(
    EmbeddingLayoutError,
    match="stack 't2', feature 'f2': global batch size 10 is not a multiple"
    " of the 4 global SparseCores",
  ):
    stack_layouts(odd, 4)
  logical = {k: v.table for k, v in _random_logical(specs, 3).items()}
  logical["t1"] = logical["t1"][:, :4]
  with pytest.raises(
    EmbeddingLayoutError,
    match=r"stack 't0_t1', table 't1': logical array has shape \(30, 4\),"
    r" expected \(30, 6\)",
  ):
    stack_embedding_tables(logical, specs, _mesh(2), S)
  with pytest.raises(EmbeddingLayoutError, match="no embedding table for stack 't2'"):
    unstack_embedding_tables(
      {"t0_t1": np.zeros((96, 8), np.float32)}, specs, num_sc_per_device=S, global_device_count=2
    )
  with pytest.raises(EmbeddingLayoutError, match="global_device_count is needed"):
    unstack_embedding_tables({"t0_t1": np.zeros((96, 8), np.float32)}, specs, num_sc_per_device=S)


def test_init_never_holds_a_whole_table_on_one_device():
  """Compiled (never run) for a 64 MiB table on 8 devices."""
  table = TableSpec("big", 1 << 20, 16, optimizer=ADAGRAD)
  specs = prepare_feature_specs_for_training(
    {"f": FeatureSpec("f", table, (16, 2), (16, 16))}, 8, S
  )
  mesh = _mesh(8)
  layouts = stack_layouts(specs, 16)
  (program,) = embedding_variables._init_programs(tuple(layouts.items()), mesh, False).values()
  (write,), key = program.writers, jax.random.key(0)
  physical = jax.ShapeDtypeStruct(
    (layouts["big"].vocab_size, 16), jnp.float32, sharding=embedding_variables.table_sharding(mesh)
  )
  memory = write.lower(physical, key).compile().memory_analysis()
  rest = program.rest.lower(key).compile().memory_analysis()
  table_bytes = (1 << 20) * 16 * 4
  shard_bytes = table_bytes // 8
  # Per device: the table written in place into its donated shard, with
  # about four shard-sized temporaries (random bits, padding, transpose); a
  # whole table would be 8 shards (unconstrained, XLA needs 32). The slot
  # is made apart, without temporaries.
  assert shard_bytes <= memory.output_size_in_bytes < shard_bytes + 1024
  assert memory.alias_size_in_bytes == memory.output_size_in_bytes
  assert memory.temp_size_in_bytes < 6 * shard_bytes
  assert shard_bytes <= rest.output_size_in_bytes < shard_bytes + 1024
  assert rest.temp_size_in_bytes < 1024


def test_exchange_buffers_hold_what_a_batch_can_fill():
  # batch 16, 4 ids per sample; 2 devices x 2 SCs: 4 samples per SC, so one SC's
  # samples hold at most 16 ids per feature (t0_t1: 2 features, t2: 1), below the
  # starting max_ids_per_partition of 256 (issue 28, item 1)
  specs = _specs(2)
  layouts = stack_layouts(specs, 4)
  assert {n: (l.spec.max_ids_per_partition, l.capacity) for n, l in layouts.items()} == {
    "t0_t1": (256, 32),
    "t2": (256, 16),
  }
  layout = layouts["t0_t1"]
  coo = compute_coo_buffer_size_per_device(layout.spec, S, 2)
  ints = jax.ShapeDtypeStruct((coo,), jnp.int32)
  shapes = jax.eval_shape(
    lambda *a: send_buffers(layout, S, *a),
    jax.ShapeDtypeStruct((16,), jnp.int32),
    ints,
    ints,
    jax.ShapeDtypeStruct((coo,), jnp.float32),
  )
  assert [x.shape for x in shapes] == [(2, 4, 32)] * 4
  # a limit below what the batch can fill bounds the exchange, rounded up to 8
  limits = get_stack_limits(specs)
  limits["t0_t1"]["max_ids_per_partition"] = 20
  limits["t2"]["max_ids_per_partition"] = 9
  tuned = stack_layouts(apply_stack_limits(specs, limits), 4)
  assert {n: l.capacity for n, l in tuned.items()} == {"t0_t1": 24, "t2": 16}

"""A fresh state in few compiled programs, with each table's and layer's own values."""

import jax
import jax.numpy as jnp
import numpy as np

from initial_values import assert_same_draws
import launch_testing
from sparsepipe import core
from sparsepipe import data
from sparsepipe import pipeline
from sparsepipe.core import AdagradOptimizerSpec
from sparsepipe.core import FeatureSpec
from sparsepipe.core import TableSpec
from sparsepipe.core import TruncatedNormalInitializer
from sparsepipe.core import UniformInitializer
from sparsepipe.launch.job import training_data
from sparsepipe.launch.job.model import JobModel
from sparsepipe.launch.job.startup import CompileCounter
from sparsepipe.pipeline.embedding import variables
from sparsepipe.transforms import prepare_feature_specs_for_training
from sparsepipe.transforms import stack_tables

ADAGRAD = AdagradOptimizerSpec(learning_rate=0.1, initial_accumulator_value=0.25)
S = 2
# Rows padded to multiples of 8 * 16 SCs = 128 on 8 devices: 1024, 384 (x2),
# 256, 128 (x3) in stack 'a' (dims 8 and 6 -> 8); 'b' alone.
_TABLES = {
  "a": [
    ("big", 1000, 8, TruncatedNormalInitializer(0.05)),
    ("mid1", 300, 8, UniformInitializer(0.1)),
    ("mid2", 300, 8, UniformInitializer(0.1)),
    ("small1", 200, 6, TruncatedNormalInitializer(0.2)),
    ("tiny1", 3, 8, TruncatedNormalInitializer(0.05)),
    ("tiny2", 100, 8, TruncatedNormalInitializer(0.05)),
    ("tiny3", 100, 8, TruncatedNormalInitializer(0.05)),
  ],
  "b": [("other", 500, 16, UniformInitializer(0.3))],
}


def _specs(g):
  features, stacks = {}, {}
  for stack, tables in _TABLES.items():
    for name, vocab, dim, init in tables:
      table = TableSpec(name, vocab, dim, initializer=init, optimizer=ADAGRAD)
      features[f"f_{name}"] = FeatureSpec(f"f_{name}", table, (16, 2), (16, dim))
    stacks[stack] = [name for name, *_ in tables]
  specs = stack_tables(features, stacks["a"], g, S)
  return prepare_feature_specs_for_training(specs, g, S)


def _mesh(g):
  return core.make_mesh(jax.devices()[:g])


def test_a_group_of_tables_is_written_in_place():
  """A group of several tables is one update of its rows, not a copy of the stack."""
  tables = [TableSpec("big", 1 << 18, 8, optimizer=ADAGRAD)]
  tables += [TableSpec(f"small{i}", 1 << 12, 8, optimizer=ADAGRAD) for i in range(4)]
  raw = {f"f_{t.name}": FeatureSpec(f"f_{t.name}", t, (16, 2), (16, 8)) for t in tables}
  specs = stack_tables(raw, [t.name for t in tables], 1, S)
  specs = prepare_feature_specs_for_training(specs, 1, S)
  ((name, layout),) = pipeline.stack_layouts(specs, S).items()
  groups = variables._table_groups(layout)
  assert [[t.name for t in g] for g in groups] == [["big"], [f"small{i}" for i in range(4)]]
  mesh = _mesh(1)
  (program,) = variables._init_programs(((name, layout),), mesh, False).values()
  physical = jax.ShapeDtypeStruct(
    (layout.vocab_size, 8), jnp.float32, sharding=variables.table_sharding(mesh)
  )
  memory = program.writers[1].lower(physical, jax.random.key(0)).compile().memory_analysis()
  stack_bytes = layout.vocab_size * 8 * 4
  group_bytes = 4 * (1 << 12) * 8 * 4
  assert memory.alias_size_in_bytes == memory.output_size_in_bytes == stack_bytes
  # The group's values, padding and MOD transpose: a few times its own
  # 0.5 MiB. A chain of one update per table copied the 8.5 MiB stack.
  assert memory.temp_size_in_bytes < 8 * group_bytes < stack_bytes / 2


def test_init_equals_each_tables_own_initializer_in_few_programs():
  key = jax.random.key(11)
  for g in (8, 1):
    specs, mesh = _specs(g), _mesh(g)
    layouts = pipeline.stack_layouts(specs, g * S)
    variables._init_programs.cache_clear()
    counter = CompileCounter()
    try:
      state = pipeline.init_embedding_variables(
        key, specs, mesh, num_sc_per_device=S, track_updates=True
      )
      jax.block_until_ready(state)
    finally:
      counter.close()
    groups = [len(variables._table_groups(layout)) for layout in layouts.values()]
    assert groups == [3, 1]
    # Per stack: the zeros, one writer per group, the slots and `updated`.
    assert counter.requests == sum(2 + n for n in groups)
    for name, layout in layouts.items():
      # Each table is its initializer's output for its own key and shape,
      # placed in the stack's physical layout; padding zero.
      logical = {
        t.name: np.asarray(
          t.initializer(
            variables.table_key(key, t.name), (t.vocabulary_size, t.embedding_dim), jnp.float32
          )
        )
        for t in layout.tables
      }
      expected = pipeline.logical_to_physical(layout, logical)
      got = state[name]
      assert got.table.dtype == np.float32
      assert_same_draws(got.table, expected)
      (slot,) = got.slots
      np.testing.assert_array_equal(
        np.asarray(slot), np.full(expected.shape, 0.25, np.float32), strict=True
      )
      np.testing.assert_array_equal(
        np.asarray(got.updated), np.zeros(layout.vocab_size, np.int32), strict=True
      )


def test_fresh_state_makes_the_dense_params_in_one_program(tmp_path):
  config = launch_testing.tiny_config(seed=5)
  data_dir = training_data.ensure_dataset(config, str(tmp_path), show_progress=False)
  model = JobModel(config, data.read_manifest(data_dir), _mesh(1))
  variables._init_programs.cache_clear()
  counter = CompileCounter()
  try:
    state = model.fresh_train_state()
    jax.block_until_ready(state)
  finally:
    counter.close()
  # The same values, bit for bit, as the model's init run op by op (a
  # program per op and shape: made after the count).
  params_key, _ = jax.random.split(jax.random.key(5))
  eager = model.init_params(params_key)
  jax.tree.map(
    lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b), strict=True),
    state.params,
    eager,
  )
  layouts = pipeline.stack_layouts(model.base_specs, model.num_sc)
  tables = sum(2 + len(variables._table_groups(layout)) for layout in layouts.values())
  # The seed's key and its split (4 small programs), the params (1), the
  # tables, then the strongly typed params, the optimizer's state (2) and
  # the step (1); fewer where this process made one of them before. Op by
  # op, the params alone were 25 programs here (34 for the criteo DLRM).
  assert counter.requests <= 4 + 1 + tables + 4

"""What jax-tpu-embedding users rely on: inputs, spec forms and exported names.

Each test pins one behaviour of the reference that we used to refuse or
lack: specs stacked without an id transformation, the own-stack setting of
an unstacked table, 2-D object id arrays, `batch_number`, the lhs_*
properties, statistics without drop counters, and the table-stacking
helpers (exact values, and the reference's own results when it is
installed).
"""

import dataclasses
import re

import numpy as np
import pytest

from reference import reference_module
from sparsepipe import core
from sparsepipe import transforms as T


def _table(name, vocab, dim=8):
  return core.TableSpec(name, vocab, dim)


def _stacked_without_transformation():
  """Specs of a 2-table stack as a user builds them from saved settings."""
  specs = {
    "fa": core.FeatureSpec("fa", _table("a", 40), (8, 2), (8, 8)),
    "fb": core.FeatureSpec("fb", _table("b", 20, 12), (8, 2), (8, 12)),
  }
  stacked = T.stack_tables(specs, ["a", "b"], 1, 2, rotation=1)
  bare = {
    k: core.FeatureSpec(f.name, f.table_spec, f.input_shape, f.output_shape)
    for k, f in stacked.items()
  }
  return stacked, bare


def test_prepare_fills_missing_id_transformations():
  stacked, bare = _stacked_without_transformation()
  assert all(f.id_transformation is None for f in bare.values())
  prepared = T.prepare_feature_specs_for_training(bare, 1, 2)
  assert prepared == stacked
  half = dict(bare, fa=stacked["fa"])
  with pytest.raises(
    T.StackingError,
    match=re.escape(
      "stack 'a_b': features ['fb'] have no id_transformation but feature"
      " 'fa' has one; set all or none of them"
    ),
  ):
    T.prepare_feature_specs_for_training(half, 1, 2)
  table = stacked["fa"].table_spec
  no_setting = core.FeatureSpec(
    "fa", dataclasses.replace(table, setting_in_stack=None), (8, 2), (8, 8)
  )
  with pytest.raises(
    T.StackingError,
    match=re.escape(
      "table 'a' has the StackedTableSpec of stack 'a_b' but no"
      " setting_in_stack; give both or neither"
    ),
  ):
    T.prepare_feature_specs_for_training({"fa": no_setting}, 1, 2)


def test_unstacked_table_sits_in_its_own_stack():
  table = core.TableSpec("table_a", 64, 12)
  own = core.TableSettingInStack("table_a", 64, 12, row_offset_in_shard=0, shard_rotation=0)
  assert table.setting_in_stack == own
  assert table.stacked_table_spec is None
  # Derived, never stale: a replaced name or size gives the new table's own
  # setting, and a setting given without a StackedTableSpec is replaced.
  renamed = dataclasses.replace(table, name="b", vocabulary_size=40)
  assert renamed.setting_in_stack == core.TableSettingInStack("b", 40, 12)
  assert renamed == core.TableSpec("b", 40, 12)
  elsewhere = core.TableSettingInStack("s", 64, 16, row_offset_in_shard=8, shard_rotation=1)
  assert core.TableSpec("table_a", 64, 12, setting_in_stack=elsewhere) == table
  prepared = T.prepare_feature_specs_for_training(
    {"f": core.FeatureSpec("f", table, (8, 2), (8, 12))}, 1, 2
  )["f"]
  assert prepared.stack_name == "table_a"
  assert prepared.table_spec.setting_in_stack == core.TableSettingInStack("table_a", 64, 16)
  assert dataclasses.replace(prepared.table_spec, stacked_table_spec=None) == table
  embedding_spec = reference_module("nn.embedding_spec")
  if embedding_spec is not None:
    theirs = embedding_spec.TableSpec(
      name="table_a",
      vocabulary_size=64,
      embedding_dim=12,
      initializer=None,
      optimizer=embedding_spec.SGDOptimizerSpec(),
      combiner="sum",
    ).setting_in_stack
    assert dataclasses.astuple(table.setting_in_stack) == dataclasses.astuple(theirs)


def test_unset_id_transformation_reads_as_zero():
  table = T.prepare_feature_specs_for_training(
    {"f": core.FeatureSpec("f", _table("t", 40), (8, 2), (8, 8))}, 1, 2
  )["f"]
  bare = core.FeatureSpec("f", table.table_spec, (8, 2), (8, 8))
  ids = np.arange(16).reshape(8, 2) % 40
  want, _ = T.preprocess_sparse_dense_matmul_input(
    {"f": ids}, None, {"f": table}, 1, 1, num_sc_per_device=2
  )
  got, _ = T.preprocess_sparse_dense_matmul_input(
    {"f": ids}, None, {"f": bare}, 1, 1, num_sc_per_device=2
  )
  for a, b in zip(got.sparse_dense_matmul_input, want.sparse_dense_matmul_input):
    np.testing.assert_array_equal(a["t"], b["t"])


def test_object_arrays_batch_number_and_result_properties():
  specs = T.prepare_feature_specs_for_training(
    {"f": core.FeatureSpec("f", _table("t", 40), (4, 2), (4, 8))}, 1, 2
  )
  ids = np.array([[1, 2], [3, 3], [0, 39], [5, 6]])
  weights = np.array([[1.0, 0.5], [2.0, 1.0], [1.0, 1.0], [0.25, 4.0]])
  want, want_stats = T.preprocess_sparse_dense_matmul_input(
    {"f": ids}, {"f": weights.astype(np.float32)}, specs, 1, 1, num_sc_per_device=2
  )
  got, stats = T.preprocess_sparse_dense_matmul_input(
    {"f": ids.astype(object)},
    {"f": weights.astype(object)},
    specs,
    1,
    1,
    num_sc_per_device=2,
    batch_number=7,
  )
  for field in ("lhs_row_pointers", "lhs_embedding_ids", "lhs_sample_ids", "lhs_gains"):
    np.testing.assert_array_equal(
      getattr(got, field)["t"], getattr(want.sparse_dense_matmul_input, field)["t"]
    )
  np.testing.assert_array_equal(
    stats.max_ids_per_partition["t"], want_stats.max_ids_per_partition["t"]
  )
  # Ragged rows that are object arrays of Python ints (the reference
  # misreads them; we convert them).
  rows = np.empty(4, object)
  for i, row in enumerate(ids.tolist()):
    rows[i] = np.array(row, dtype=object)
  ragged, _ = T.preprocess_sparse_dense_matmul_input(
    {"f": rows}, None, specs, 1, 1, num_sc_per_device=2
  )
  dense, _ = T.preprocess_sparse_dense_matmul_input(
    {"f": ids}, None, specs, 1, 1, num_sc_per_device=2
  )
  for a, b in zip(ragged.sparse_dense_matmul_input, dense.sparse_dense_matmul_input):
    np.testing.assert_array_equal(a["t"], b["t"])
  rows[1] = np.array([None, 2], dtype=object)
  with pytest.raises(
    T.PreprocessingError,
    match=re.escape("feature 'f': ids row 1 has dtype object, expected integer"),
  ):
    T.preprocess_sparse_dense_matmul_input({"f": rows}, None, specs, 1, 1, num_sc_per_device=2)
  with pytest.raises(
    T.PreprocessingError, match=re.escape("feature 'f': ids have dtype float64, expected integer")
  ):
    T.preprocess_sparse_dense_matmul_input(
      {"f": weights.astype(object)}, None, specs, 1, 1, num_sc_per_device=2
    )


def test_stats_without_drop_counters():
  stats = core.SparseDenseMatmulInputStats(
    max_ids_per_partition={"t": np.array([3, 4])},
    max_unique_ids_per_partition={"t": np.array([2, 2])},
  )
  assert dict(stats.required_buffer_size_per_sc) == {}
  assert dict(stats.id_drop_counters) == {}
  specs = T.prepare_feature_specs_for_training(
    {"f": core.FeatureSpec("f", _table("t", 40), (4, 2), (4, 8))}, 1, 2
  )
  updated = T.update_preprocessing_parameters(specs, stats, 2)
  assert T.get_stack_limits(updated)["t"] == {
    "max_ids_per_partition": 4,
    "max_unique_ids_per_partition": 2,
    "suggested_coo_buffer_size_per_device": None,
  }


def _two_table_stack(g=1, s=2, order=("b", "a")):
  specs = {
    "fa": core.FeatureSpec("fa", _table("a", 10, 4), (8, 2), (8, 4)),
    "fb": core.FeatureSpec("fb", _table("b", 6, 8), (8, 2), (8, 8)),
  }
  return T.stack_tables(specs, list(order), g, s, rotation=3, stack_name="ab")


def test_table_helpers_exact():
  specs = _two_table_stack()
  tables = {k: f.table_spec for k, f in specs.items()}
  assert T.round_up_dim_and_vocab_size(tables, 2) == ({"fa": 8, "fb": 8}, {"fa": 16, "fb": 16})
  assert T.get_default_limits("x", 5) == 256
  # N = 2: b rows 0..7 per shard, a rows 8..15 with rotation 1.
  assert T.compute_physical_row_ids(2, 32, 1, 8, 0) == 16 + 8
  np.testing.assert_array_equal(
    T.compute_physical_row_ids(2, 32, 1, 8, np.array([0, 1, 5])), [24, 8, 10]
  )
  values = {
    "fa": np.arange(40, dtype=np.float32).reshape(10, 4),
    "fb": -np.arange(48, dtype=np.float32).reshape(6, 8),
  }
  stacked = T.stack_and_shard_tables(tables, values, 2)  # NaN padding
  assert set(stacked) == {"ab"} and stacked["ab"].shape == (32, 8)
  rows = T.compute_physical_row_ids(2, 32, 1, 8, np.arange(10))
  np.testing.assert_array_equal(stacked["ab"][rows, :4], values["fa"])
  assert np.isnan(stacked["ab"][rows, 4:]).all()
  back = T.unshard_and_unstack_tables(tables, stacked, 2)
  for k in values:
    np.testing.assert_array_equal(back[k], values[k])
  description = T.describe_stacked_tables(specs, 1, 2)
  (stack,) = description.stacked_table_specs
  assert (stack.stack_name, stack.num_sparsecores, stack.stack_vocab_size) == ("ab", 2, 32)
  assert [t.table_name for t in stack.table_specs] == ["a", "b"]
  by_table = {"a": values["fa"], "b": values["fb"]}
  feature_stacked = T.stack_and_shard_feature_tables(by_table, description)
  np.testing.assert_array_equal(feature_stacked["ab"], np.nan_to_num(stacked["ab"], nan=0.0))
  unstacked = T.unstack_and_unshard_stacked_tables(feature_stacked, description)
  for k in by_table:
    np.testing.assert_array_equal(unstacked[k], by_table[k])
  assert T.get_row_ids_in_stacked_table(stack, stack.table_specs[0], [0, 1]) == [24, 8]
  assert T.get_row_ids_in_stacked_tables(description, {"b": [1]}) == {"ab": [16]}
  with pytest.raises(ValueError, match=re.escape("table 'a': row id 10 is outside [0, 10)")):
    T.get_row_ids_in_stacked_table(stack, stack.table_specs[0], [10])


def test_table_helpers_match_reference():
  nn = "jax_tpu_embedding.sparsecore.lib.nn."
  embedding = pytest.importorskip(nn + "embedding")
  embedding_spec = pytest.importorskip(nn + "embedding_spec")
  table_stacking = pytest.importorskip(nn + "table_stacking")
  import jax  # pylint: disable=g-import-not-at-top

  opt = embedding_spec.SGDOptimizerSpec()
  ref_tables = {
    "fa": embedding_spec.TableSpec(
      name="a", vocabulary_size=10, embedding_dim=4, initializer=None, optimizer=opt, combiner="sum"
    ),
    "fb": embedding_spec.TableSpec(
      name="b", vocabulary_size=6, embedding_dim=8, initializer=None, optimizer=opt, combiner="sum"
    ),
  }
  ref_specs = {
    k: embedding_spec.FeatureSpec(
      name=k, table_spec=t, input_shape=[8, 2], output_shape=[8, t.embedding_dim]
    )
    for k, t in ref_tables.items()
  }
  # Stack order = leaf order: the reference's stack_and_shard_feature_tables
  # concatenates in proto (leaf) order (see docs/reference/compatibility.md).
  table_stacking.stack_tables(ref_specs, ["a", "b"], 1, 2, rotation=3, stack_name="ab")
  specs = _two_table_stack(order=("a", "b"))
  tables = {k: f.table_spec for k, f in specs.items()}
  rng = np.random.default_rng(0)
  values = {
    "fa": rng.normal(size=(10, 4)).astype(np.float32),
    "fb": rng.normal(size=(6, 8)).astype(np.float32),
  }
  want = table_stacking.stack_and_shard_tables(ref_tables, values, 2, 0.5)
  got = T.stack_and_shard_tables(tables, values, 2, 0.5)
  np.testing.assert_array_equal(got["ab"].reshape(2, -1, 8), np.asarray(want["ab"]))
  want_back = table_stacking.unshard_and_unstack_tables(ref_tables, want, 2)
  got_back = T.unshard_and_unstack_tables(tables, got, 2)
  for k in values:
    np.testing.assert_array_equal(got_back[k], np.asarray(want_back[k]))
  proto = embedding.create_proto_from_feature_specs(ref_specs, 1, 2)
  by_table = {"a": values["fa"], "b": values["fb"]}
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  ref_stacked = table_stacking.stack_and_shard_feature_tables(
    {k: jax.device_put(v, sharding) for k, v in by_table.items()}, proto
  )
  for embedding_specs in (proto, T.describe_stacked_tables(specs, 1, 2)):
    ours = T.stack_and_shard_feature_tables(by_table, embedding_specs)
    np.testing.assert_array_equal(ours["ab"], np.asarray(ref_stacked["ab"]))
    unstacked = T.unstack_and_unshard_stacked_tables(ours, embedding_specs)
    for k in by_table:
      np.testing.assert_array_equal(unstacked[k], by_table[k])
  ids = {"a": [0, 3, 9], "b": [5]}
  assert T.get_row_ids_in_stacked_tables(proto, ids) == dict(
    table_stacking.get_row_ids_in_stacked_tables(proto, ids)
  )
  assert T.round_up_dim_and_vocab_size(tables, 4) == (
    table_stacking.round_up_dim_and_vocab_size(ref_tables, 4)
  )


@pytest.mark.parametrize("delete_input", [False, True])
def test_stack_and_shard_tables_frees_its_device_inputs_when_asked(delete_input):
  import jax  # pylint: disable=g-import-not-at-top

  specs = _two_table_stack()
  tables = {k: f.table_spec for k, f in specs.items()}
  values = {
    "fa": np.arange(40, dtype=np.float32).reshape(10, 4),
    "fb": -np.arange(48, dtype=np.float32).reshape(6, 8),
  }
  expected = T.stack_and_shard_tables(tables, values, 2)
  on_device = {k: jax.device_put(v) for k, v in values.items()}
  stacked = T.stack_and_shard_tables(tables, on_device, 2, delete_input=delete_input)
  np.testing.assert_array_equal(stacked["ab"], expected["ab"])
  assert [a.is_deleted() for a in on_device.values()] == [delete_input] * 2
  # Numpy inputs are never touched.
  again = T.stack_and_shard_tables(tables, values, 2, delete_input=delete_input)
  np.testing.assert_array_equal(again["ab"], expected["ab"])
  np.testing.assert_array_equal(values["fa"], np.arange(40, dtype=np.float32).reshape(10, 4))


def test_stack_and_shard_tables_refuses_values_of_another_shape_before_deleting_any():
  """Before: a value short of rows or columns was padded with pad_value (NaN rows
  inside the vocabulary), and one with more rows raised numpy's "index can't contain
  negative values"."""
  import jax  # pylint: disable=g-import-not-at-top

  specs = _two_table_stack()
  tables = {k: f.table_spec for k, f in specs.items()}
  good = {"fa": np.zeros((10, 4), np.float32), "fb": np.zeros((6, 8), np.float32)}
  for feature, shape in [("fa", (9, 4)), ("fa", (10, 2)), ("fb", (7, 8))]:
    values = {k: jax.device_put(v) for k, v in good.items()}
    values[feature] = jax.device_put(np.zeros(shape, np.float32))
    expected = (10, 4) if feature == "fa" else (6, 8)
    name = tables[feature].name
    with pytest.raises(ValueError) as refused:
      T.stack_and_shard_tables(tables, values, 2, delete_input=True)
    assert str(refused.value) == (
      f"table '{name}': a value of shape {shape}, expected {expected}"
      " (vocabulary_size, embedding_dim)"
    )
    assert not any(v.is_deleted() for v in values.values())
  with pytest.raises(ValueError, match=r"^num_shards=0 must be at least 1$"):
    T.stack_and_shard_tables(tables, good, 0)
  with pytest.raises(ValueError, match=r"^tables must have the structure of table_specs"):
    T.stack_and_shard_tables(tables, {"fa": good["fa"]}, 2)

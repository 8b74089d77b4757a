"""Stacking, limit updates and buffer sizes on frozen specs."""

import re

import numpy as np
import pytest

from reference import reference_module
from sparsepipe import core
from sparsepipe import transforms as T


def _table(name, vocab=100, dim=8, combiner="sum", optimizer=None, **kw):
  return core.TableSpec(
    name=name,
    vocabulary_size=vocab,
    embedding_dim=dim,
    combiner=combiner,
    optimizer=optimizer or core.SGDOptimizerSpec(),
    **kw,
  )


def _feature(name, table, batch=16):
  return core.FeatureSpec(name, table, (batch, 4), (batch, table.embedding_dim))


def test_prepare_gives_each_table_its_own_stack_and_feature_stacking():
  t = _table(
    "t",
    vocab=100,
    dim=12,
    max_ids_per_partition=33,
    max_unique_ids_per_partition=22,
    suggested_coo_buffer_size_per_device=640,
  )
  u = _table("u", vocab=5)
  specs = {"z": _feature("z", t, 16), "a": _feature("a", t, 32), "m": _feature("m", u, 8)}
  out = T.prepare_feature_specs_for_training(specs, 2, 4)  # N = 8
  assert specs["z"].table_spec.stacked_table_spec is None  # inputs untouched
  # Features of one table are ordered by name: "a" then "z".
  assert out["a"].id_transformation == core.FeatureIdTransformation(0, 0, 0)
  assert out["z"].id_transformation == core.FeatureIdTransformation(32, 0, 0)
  assert out["m"].id_transformation == core.FeatureIdTransformation(0, 0, 0)
  assert out["a"].table_spec.setting_in_stack == core.TableSettingInStack(
    stack_name="t",
    padded_vocab_size=128,
    padded_embedding_dim=16,
    row_offset_in_shard=0,
    shard_rotation=0,
  )
  assert out["z"].table_spec.stacked_table_spec == core.StackedTableSpec(
    stack_name="t",
    stack_vocab_size=128,
    stack_embedding_dim=16,
    optimizer=core.SGDOptimizerSpec(),
    combiner="sum",
    total_sample_count=48,
    max_ids_per_partition=33,
    max_unique_ids_per_partition=22,
    suggested_coo_buffer_size_per_device=640,
  )
  assert out["a"].table_spec == out["z"].table_spec
  assert T.prepare_feature_specs_for_training(out, 2, 4) == out  # idempotent


def test_prepare_keeps_pytree_structure():
  t = _table("t")
  specs = [_feature("x", t), (_feature("y", _table("u")),)]
  out = T.prepare_feature_specs_for_training(specs, 1, 2)
  assert isinstance(out, list) and isinstance(out[1], tuple)
  assert out[1][0].table_spec.stacked_table_spec.stack_name == "u"


def test_stack_tables_offsets_rotation_and_limits():
  a, b, c = _table("a", vocab=100), _table("b", vocab=300), _table("c", vocab=10)
  specs = {
    "fa": _feature("fa", a, 16),
    "fb": _feature("fb", b, 8),
    "fc": _feature("fc", c, 32),
    "fa2": _feature("fa2", a, 8),
  }
  out = T.stack_tables(specs, ["b", "a", "c"], 2, 2)  # N = 4, rotation S = 2
  settings = {
    n: out[f].table_spec.setting_in_stack for n, f in (("a", "fa"), ("b", "fb"), ("c", "fc"))
  }
  # padded vocab: b 320, a 128, c 32 (multiples of 8*N = 32).
  assert settings["b"] == core.TableSettingInStack("b_a_c", 320, 8, 0, 0)
  assert settings["a"] == core.TableSettingInStack("b_a_c", 128, 8, 80, 2)
  assert settings["c"] == core.TableSettingInStack("b_a_c", 32, 8, 112, 0)
  # Row offsets: running sum of batches in pytree-leaf order (sorted keys).
  assert [out[f].id_transformation.row_offset for f in ("fa", "fa2", "fb", "fc")] == [0, 16, 24, 32]
  assert out["fa"].id_transformation.col_offset == 80 * 4
  assert out["fa"].id_transformation.col_shift == 2
  stacked = out["fc"].table_spec.stacked_table_spec
  assert (stacked.stack_vocab_size, stacked.total_sample_count) == (480, 64)
  assert (stacked.max_ids_per_partition, stacked.max_unique_ids_per_partition) == (256, 256)
  assert stacked.suggested_coo_buffer_size_per_device is None
  custom = T.stack_tables(
    specs,
    ["a", "b"],
    2,
    2,
    rotation=3,
    stack_name="ab",
    stack_to_max_ids_per_partition=lambda s, n: n + 1,
    stack_to_max_unique_ids_per_partition=lambda s, n: 7,
  )
  assert custom["fb"].table_spec.setting_in_stack.shard_rotation == 3
  st = custom["fb"].table_spec.stacked_table_spec
  assert (st.stack_name, st.max_ids_per_partition, st.max_unique_ids_per_partition) == ("ab", 33, 7)
  single = T.stack_tables({"f": _feature("f", _table("s", max_ids_per_partition=9))}, ["s"], 1, 2)
  assert single["f"].table_spec.stacked_table_spec.max_ids_per_partition == 9


@pytest.mark.parametrize(
  "tables,message",
  [
    (
      (_table("a"), _table("b", combiner="mean")),
      "stack 'a_b': tables 'a' and 'b' have different combiners ('sum' vs 'mean')",
    ),
    (
      (_table("a"), _table("b", optimizer=core.AdagradOptimizerSpec())),
      "stack 'a_b': tables 'a' and 'b' have different optimizers",
    ),
  ],
)
def test_stack_tables_rejects_incompatible_tables(tables, message):
  specs = {t.name: _feature(t.name, t) for t in tables}
  with pytest.raises(T.StackingError, match="^" + re.escape(message)):
    T.stack_tables(specs, [t.name for t in tables], 1, 2)


def test_stack_tables_errors():
  specs = {"fa": _feature("fa", _table("a")), "fb": _feature("fb", _table("b"))}
  with pytest.raises(T.StackingError, match=r"^Table a is repeated in group a_a\.$"):
    T.stack_tables(specs, ["a", "a"], 1, 2)
  with pytest.raises(T.StackingError, match="^table 'x' of stack 'a_x' is used by no feature$"):
    T.stack_tables(specs, ["a", "x"], 1, 2)
  stacked = T.stack_tables(specs, ["a", "b"], 1, 2, stack_name="s")
  with pytest.raises(T.StackingError, match="^table 'a' is already stacked in stack 's'$"):
    T.stack_tables(stacked, ["a"], 1, 2)
  other = dict(stacked, fc=_feature("fc", _table("c")))
  with pytest.raises(T.StackingError, match="^stack name 's' is already used by table 'a'$"):
    T.stack_tables(other, ["c"], 1, 2, stack_name="s")
  with pytest.raises(T.StackingError, match="^feature 'fa' is defined 2 times$"):
    T.stack_tables([specs["fa"], specs["fa"]], ["a"], 1, 2)


def test_repeated_table_is_reported_in_the_reference_words():
  # The reference's own case: ("A", "B", "A") in one manual stack.
  specs = [_feature(f"feature_{n.lower()}", _table(n)) for n in "ABC"]
  with pytest.raises(T.StackingError) as ours:
    T.stack_tables(specs, ("A", "B", "A"), 1, 2)
  assert str(ours.value) == "Table A is repeated in group A_B_A."
  embedding_spec = reference_module("nn.embedding_spec")
  if embedding_spec is None:
    return
  table_stacking = reference_module("nn.table_stacking")
  tables = [
    embedding_spec.TableSpec(
      name=n,
      vocabulary_size=100,
      embedding_dim=8,
      initializer=None,
      optimizer=embedding_spec.SGDOptimizerSpec(),
      combiner="sum",
    )
    for n in "ABC"
  ]
  ref = [
    embedding_spec.FeatureSpec(
      name=f"feature_{t.name.lower()}", table_spec=t, input_shape=[16, 4], output_shape=[16, 8]
    )
    for t in tables
  ]
  with pytest.raises(ValueError) as theirs:
    table_stacking.stack_tables(ref, ("A", "B", "A"), 1, 2)
  assert str(ours.value) == str(theirs.value)


def test_auto_stack_groups_compatible_tables_and_splits_by_memory():
  tables = [
    _table("t0"),
    _table("t1", combiner="mean"),
    _table("t2"),
    _table("t3", dim=16),
    _table("t4", combiner="mean"),
  ]
  specs = [_feature(f"f{i}", t, 64) for i, t in enumerate(tables)]
  out = T.auto_stack_tables(specs, 2, 2)
  names = [f.table_spec.stacked_table_spec.stack_name for f in out]
  assert names == ["t0_t2", "t1_t4", "t0_t2", "t3", "t1_t4"]
  # 8 * (64 / 4) * 4 bytes = 512 per table: a 1000-byte limit splits pairs.
  split = T.auto_stack_tables(specs, 2, 2, activation_mem_bytes_limit=1000)
  assert [f.table_spec.stacked_table_spec.stack_name for f in split] == [
    "t0",
    "t1",
    "t2",
    "t3",
    "t4",
  ]


def test_stack_names_are_shortened_with_a_hash():
  names = [f"a_fairly_long_table_name_{i}" for i in range(3)]
  joined = "_".join(names)
  short = T.stack_name_for(names)
  assert short.startswith(joined[:50] + "...") and len(short) == 50 + 3 + 12
  assert T.stack_name_for(names, use_short_stack_names=False) == joined
  assert T.stack_name_for(["a", "b"]) == "a_b"


def test_get_stacked_table_specs_and_table_stacks():
  specs = {
    "fa": _feature("fa", _table("a")),
    "fb": _feature("fb", _table("b")),
    "fc": _feature("fc", _table("c")),
  }
  out = T.prepare_feature_specs_for_training(
    T.stack_tables(specs, ["b", "a"], 1, 2, stack_name="ab"), 1, 2
  )
  stacked = T.get_stacked_table_specs(out)
  assert sorted(stacked) == ["ab", "c"]
  assert stacked["ab"].stack_vocab_size == 224
  assert T.get_table_stacks(out) == {"ab": ["b", "a"], "c": ["c"]}
  with pytest.raises(T.StackingError, match="^feature 'fa' \\(table 'a'\\) is not prepared"):
    T.get_stacked_table_specs(specs)


def _stats(max_ids, max_unique, required):
  return core.SparseDenseMatmulInputStats(
    max_ids_per_partition=max_ids,
    max_unique_ids_per_partition=max_unique,
    required_buffer_size_per_sc=required,
    id_drop_counters={},
  )


def test_update_preprocessing_parameters():
  specs = {
    "fa": _feature("fa", _table("a")),
    "fb": _feature("fb", _table("b")),
    "fc": _feature("fc", _table("c")),
  }
  specs = T.prepare_feature_specs_for_training(
    T.stack_tables(specs, ["a", "b"], 1, 2, stack_name="ab"), 1, 2
  )
  stats = _stats(
    {"ab": np.array([3, 17]), "c": np.array([0, 0])},
    {"ab": np.array([2, 9]), "c": np.array([0, 0])},
    {"ab": np.array([40, 24]), "c": np.array([0, 0])},
  )
  out = T.update_preprocessing_parameters(specs, stats, 2)
  ab = out["fa"].table_spec.stacked_table_spec
  assert (
    ab.max_ids_per_partition,
    ab.max_unique_ids_per_partition,
    ab.suggested_coo_buffer_size_per_device,
  ) == (17, 9, 80)
  assert out["fb"].table_spec.stacked_table_spec == ab
  for f in ("fa", "fb"):  # the numbers land on every table of the stack
    t = out[f].table_spec
    assert (
      t.max_ids_per_partition,
      t.max_unique_ids_per_partition,
      t.suggested_coo_buffer_size_per_device,
    ) == (17, 9, 80)
  # A stack that saw no id gets floors, never a limit of 0.
  c = out["fc"].table_spec.stacked_table_spec
  assert (
    c.max_ids_per_partition,
    c.max_unique_ids_per_partition,
    c.suggested_coo_buffer_size_per_device,
  ) == (8, 8, 16)
  assert specs["fa"].table_spec.stacked_table_spec.max_ids_per_partition == 256
  # Stacks absent from the statistics keep their limits.
  kept = T.update_preprocessing_parameters(specs, _stats({}, {}, {}), 2)
  assert kept == specs
  # Inconsistent (hand-made) statistics: Q clamped to T when G is known.
  odd = _stats({"ab": np.array([1])}, {"ab": np.array([1])}, {"ab": np.array([1000])})
  clamped = T.update_preprocessing_parameters(specs, odd, 2, global_device_count=1)
  assert clamped["fa"].table_spec.stacked_table_spec.suggested_coo_buffer_size_per_device == 32


def test_fdo_limits_feed_preprocessing():
  table = _table("t", vocab=64, max_ids_per_partition=64, max_unique_ids_per_partition=64)
  specs = T.prepare_feature_specs_for_training({"f": _feature("f", table, 8)}, 2, 2)
  rows = np.empty(4, object)
  rows[:] = [
    np.array([0, 4, 8], np.int32),
    np.array([1], np.int32),
    np.array([2, 2], np.int32),
    np.array([5], np.int32),
  ]
  _, stats = T.preprocess_sparse_dense_matmul_input(
    {"f": rows}, None, specs, 1, 2, num_sc_per_device=2
  )
  tuned = T.update_preprocessing_parameters(specs, stats, 2)
  out, stats2 = T.preprocess_sparse_dense_matmul_input(
    {"f": rows}, None, tuned, 1, 2, num_sc_per_device=2
  )
  st = tuned["f"].table_spec.stacked_table_spec
  assert st.max_ids_per_partition == 3
  size = T.compute_coo_buffer_size_per_device(st, 2, 2)
  assert out.sparse_dense_matmul_input.lhs_embedding_ids["t"].shape == (size,)
  # SC0 needs 8 + 8 (partitions 0 and 1), so Q = 16 * S.
  assert size == st.suggested_coo_buffer_size_per_device == 32
  np.testing.assert_array_equal(stats2.max_ids_per_partition["t"], stats.max_ids_per_partition["t"])


@pytest.mark.parametrize(
  "max_ids,g,s,theoretical,row_pointers",
  [
    (1, 1, 2, 32, 16),
    (8, 2, 4, 256, 32),
    (9, 1, 4, 256, 32),
    (100, 8, 4, 13312, 128),
    (7, 4, 4, 512, 64),
  ],
)
def test_buffer_sizes(max_ids, g, s, theoretical, row_pointers):
  assert T.compute_theoretical_max_coo_buffer_size(max_ids, g, s) == theoretical
  assert T.compute_row_pointers_size_per_device(g, s) == row_pointers


@pytest.mark.parametrize("suggested,size", [(None, 128), (1, 16), (16, 16), (17, 32), (100, 112)])
def test_coo_buffer_size_per_device(suggested, size):
  stacked = core.StackedTableSpec(
    "s",
    64,
    8,
    core.SGDOptimizerSpec(),
    "sum",
    8,
    max_ids_per_partition=9,
    suggested_coo_buffer_size_per_device=suggested,
  )
  assert T.compute_coo_buffer_size_per_device(stacked, 2, 2) == size
  assert T.compute_coo_buffer_sizes({"s": stacked}, 2, 2) == {"s": size}


def test_stacking_matches_reference_names_and_settings():
  pytest.importorskip("jax_tpu_embedding")
  import jax  # pylint: disable=g-import-not-at-top
  from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec as es  # pylint: disable=g-import-not-at-top
  from jax_tpu_embedding.sparsecore.lib.nn import table_stacking as ts  # pylint: disable=g-import-not-at-top

  names = [f"table_with_a_long_name_{i}" for i in range(4)]
  dims = [8, 8, 16, 8]
  ours = [
    _feature(f"f{i}", _table(n, vocab=1000 + i, dim=d), 128)
    for i, (n, d) in enumerate(zip(names, dims))
  ]
  ref_tables = [
    es.TableSpec(
      name=n,
      vocabulary_size=1000 + i,
      embedding_dim=d,
      initializer=jax.nn.initializers.zeros,
      optimizer=es.SGDOptimizerSpec(learning_rate=0.001),
      combiner="sum",
    )
    for i, (n, d) in enumerate(zip(names, dims))
  ]
  ref = [
    es.FeatureSpec(
      name=f"f{i}", table_spec=t, input_shape=[128, 4], output_shape=[128, t.embedding_dim]
    )
    for i, t in enumerate(ref_tables)
  ]
  ours = T.auto_stack_tables(ours, 4, 4)
  ts.auto_stack_tables(ref, 4, 4)
  for o, r in zip(ours, ref):
    assert o.table_spec.setting_in_stack.stack_name == r.table_spec.setting_in_stack.stack_name
    assert o.id_transformation.col_offset == r.id_transformation.col_offset
    assert o.id_transformation.col_shift == r.id_transformation.col_shift
    assert o.id_transformation.row_offset == r.id_transformation.row_offset


def _big_feature(name, vocab):
  table = core.TableSpec(name=name, vocabulary_size=vocab, embedding_dim=8)
  return core.FeatureSpec(name, table, (16, 1), (16, 8))


def test_stack_whose_columns_pass_int32_is_refused():
  # Regression: three tables of 2**31-1 rows stacked used to give row ids
  # above INT_MAX, written as negative int32 embedding ids.
  specs = {n: _big_feature(n, 2**31 - 1) for n in ("a", "b", "c")}
  with pytest.raises(
    T.StackingError,
    match=r"stack 'a_b_c': table 'b' reaches column 4294967295 \(col_offset"
    r" 2147483648 \+ 2147483647 rows\); COO columns are int32 and must stay"
    r" below INT_MAX=2147483647: stack fewer or smaller tables",
  ):
    T.stack_tables(specs, ["a", "b", "c"], 1, 2)


def test_largest_single_table_that_fits_int32_is_accepted():
  specs = T.prepare_feature_specs_for_training({"a": _big_feature("a", 2**31 - 1)}, 1, 2)
  assert specs["a"].table_spec.stacked_table_spec.stack_vocab_size == 2**31


def test_row_id_equal_to_the_padding_value_is_refused():
  # One SparseCore in all (N=1): the row id is the column; INT_MAX would
  # read as padding.
  specs = {n: _big_feature(n, 2**30) for n in ("a", "b")}
  with pytest.raises(
    T.StackingError, match=r"table 'b' reaches column 2147483647 \(col_offset 1073741824"
  ):
    T.stack_tables(specs, ["a", "b"], 1, 1)


def test_specs_of_the_wrong_kind_are_named_where_they_are_made():
  """Before: a string optimizer, an int initializer, a string table_spec or a text
  learning rate were taken, and failed later with AttributeError or TypeError deep
  in initialisation or the step."""
  cases = [
    (
      lambda: core.TableSpec("t", 10, 8, optimizer="sgd"),
      "table 't': optimizer must be an OptimizerSpec (e.g. core.AdagradOptimizerSpec()),"
      " got str 'sgd'",
    ),
    (
      lambda: core.TableSpec("t", 10, 8, initializer=3),
      "table 't': initializer must be a callable (key, shape, dtype) -> array, got int 3",
    ),
    (
      lambda: core.TableSpec("t", 10, "8"),
      "table 't': embedding_dim must be an integer, got str '8'",
    ),
    (
      lambda: core.FeatureSpec("f", "t", (8, 1), (8, 8)),
      "feature 'f': table_spec must be a TableSpec, got str 't'",
    ),
    (
      lambda: core.AdagradOptimizerSpec(learning_rate="0.1"),
      "AdagradOptimizerSpec: learning_rate must be a number or a schedule (a callable),"
      " got str '0.1'",
    ),
  ]
  for make, message in cases:
    with pytest.raises(TypeError) as refused:
      make()
    assert str(refused.value) == message
  with pytest.raises(ValueError, match=r"^a table's name must be a non-empty string, got ''$"):
    core.TableSpec("", 10, 8)
  assert core.TableSpec("t", np.int64(10), 8).vocabulary_size == 10


@pytest.mark.parametrize(
  "shapes, message",
  [
    (
      ((8,), (8, 4)),
      "feature 'f': input_shape (8,) must be (global batch, ids per sample), both >= 1",
    ),
    (
      ((8, 0), (8, 4)),
      "feature 'f': input_shape (8, 0) must be (global batch, ids per sample), both >= 1",
    ),
    (
      ((8, 1), (8, 6)),
      "feature 'f': output_shape (8, 6) must be (global batch, columns), the columns at most"
      " table 't''s embedding_dim 4",
    ),
    (
      ((8, 1), (8, 2, 4)),
      "feature 'f': output_shape (8, 2, 4) must be (global batch, columns), the columns at"
      " most table 't''s embedding_dim 4",
    ),
    (
      ((8, 1), (16, 4)),
      "feature 'f': output_shape (16, 4) and input_shape (8, 1) name other global batch sizes",
    ),
  ],
)
def test_feature_shapes_no_lookup_could_take_are_refused_where_made(shapes, message):
  # They failed in preprocessing or inside the lookup's shard_map.
  table = core.TableSpec("t", 10, 4)
  with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
    core.FeatureSpec("f", table, *shapes)
  assert core.FeatureSpec("f", table, (8, 3), (8, 2)).output_shape == (8, 2)  # 2 columns of 4

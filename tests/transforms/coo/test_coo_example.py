"""The worked example of docs/reference/coo_format.md, as exact arrays, and small
hand-computed cases for stacking offsets, rotation, sqrtn, merging and
dropping."""

import numpy as np
import pytest

from sparsepipe import core
from sparsepipe import transforms as T
from sparsepipe.data.ragged import RaggedBatch

I = 2**31 - 1
NAN = np.nan


def _rows(*rows, dtype=np.int32):
  out = np.empty(len(rows), object)
  out[:] = [np.asarray(r, dtype) for r in rows]
  return out


def _feature(name, table, batch, valency=4):
  return core.FeatureSpec(
    name=name,
    table_spec=table,
    input_shape=(batch, valency),
    output_shape=(batch, table.embedding_dim),
  )


def _example_specs(combiner="mean", max_ids=4, max_unique=4, suggested=None):
  table = core.TableSpec(
    name="t",
    vocabulary_size=16,
    embedding_dim=8,
    combiner=combiner,
    max_ids_per_partition=max_ids,
    max_unique_ids_per_partition=max_unique,
    suggested_coo_buffer_size_per_device=suggested,
  )
  return T.prepare_feature_specs_for_training({"f": _feature("f", table, 4)}, 1, 2)


EXAMPLE = _rows([0, 0, 3], [1, 2], [3], [5, 1, 1, 4])


def _run(features, specs, weights=None, **kwargs):
  kwargs.setdefault("num_sc_per_device", 2)
  return T.preprocess_sparse_dense_matmul_input(features, weights, specs, 1, 1, **kwargs)


def test_worked_example_exact_arrays():
  out, stats = _run({"f": EXAMPLE}, _example_specs())
  m = out.sparse_dense_matmul_input
  np.testing.assert_array_equal(
    m.lhs_row_pointers["t"], [2, 10, 16, 16, 16, 16, 16, 16, 1, 11, 16, 16, 16, 16, 16, 16]
  )
  np.testing.assert_array_equal(
    m.lhs_embedding_ids["t"],
    [0, 1] + [I] * 6 + [0, 1] + [I] * 6 + [2] + [I] * 7 + [0, 1, 2] + [I] * 5,
  )
  np.testing.assert_array_equal(
    m.lhs_sample_ids["t"],
    [0, 1] + [I] * 6 + [1, 0] + [I] * 6 + [1] + [I] * 7 + [1, 0, 1] + [I] * 5,
  )
  f = np.float32
  expected_gains = np.array(
    [f(1 / 3) + f(1 / 3), 0.5]
    + [NAN] * 6
    + [0.5, f(1 / 3)]
    + [NAN] * 6
    + [0.25]
    + [NAN] * 7
    + [0.5, 1, 0.25]
    + [NAN] * 5,
    np.float32,
  )
  np.testing.assert_array_equal(m.lhs_gains["t"].view(np.uint32), expected_gains.view(np.uint32))
  assert m.lhs_gains["t"].dtype == np.float32
  assert m.lhs_embedding_ids["t"].dtype == np.int32
  np.testing.assert_array_equal(stats.max_ids_per_partition["t"], [2, 3])
  np.testing.assert_array_equal(stats.max_unique_ids_per_partition["t"], [2, 3])
  np.testing.assert_array_equal(stats.required_buffer_size_per_sc["t"], [16, 16])
  assert stats.id_drop_counters == {"t": 0}
  for d in (
    stats.max_ids_per_partition,
    stats.max_unique_ids_per_partition,
    stats.required_buffer_size_per_sc,
  ):
    assert d["t"].dtype == np.int32


def test_leading_dimension_shapes():
  out, _ = _run({"f": EXAMPLE}, _example_specs(), has_leading_dimension=True)
  m = out.sparse_dense_matmul_input
  assert m.lhs_row_pointers["t"].shape == (1, 16)
  assert m.lhs_embedding_ids["t"].shape == (1, 32)
  assert m.lhs_sample_ids["t"].shape == (1, 32)
  assert m.lhs_gains["t"].shape == (1, 32)


@pytest.mark.parametrize(
  "combiner,expected",
  [
    ("sum", [2.0, 1.0, 1.0]),  # (e=0, sid 1) merges id 1 twice
    ("sqrtn", [1.0, 1.0, 0.5]),  # 1/sqrt(4) + 1/sqrt(4); 1/sqrt(1); 1/sqrt(4)
  ],
)
def test_other_combiners(combiner, expected):
  out, _ = _run({"f": EXAMPLE}, _example_specs(combiner))
  m = out.sparse_dense_matmul_input
  # SC1 partition 1: (e=0, sid 1), (e=1, sid 0), (e=2, sid 1).
  np.testing.assert_array_equal(m.lhs_embedding_ids["t"][24:27], [0, 1, 2])
  np.testing.assert_array_equal(m.lhs_gains["t"][24:27], np.float32(expected))


def test_weighted_sqrtn_accumulates_like_reference():
  # sqrtn: w / sqrt(float32(double(acc) + double(w)^2)) per sample.
  w = np.float32([0.1, 0.7, 0.3])
  table = core.TableSpec(name="t", vocabulary_size=64, embedding_dim=8, combiner="sqrtn")
  specs = T.prepare_feature_specs_for_training({"f": _feature("f", table, 2)}, 1, 2)
  rows = _rows([2, 4, 6], [8])
  weights = _rows(w, [2.0], dtype=np.float32)
  out, _ = _run({"f": rows}, specs, {"f": weights})
  acc = np.float32(0)
  for v in w:
    acc = np.float32(np.float64(acc) + np.float64(v) ** 2)
  want = w / np.sqrt(acc)
  g = out.sparse_dense_matmul_input.lhs_gains["t"]
  e = out.sparse_dense_matmul_input.lhs_embedding_ids["t"]
  # N = 2: ids 2, 4, 6 are in partition 0 at rows 1, 2, 3 of SC 0.
  np.testing.assert_array_equal(e[:3], [1, 2, 3])
  np.testing.assert_array_equal(g[:3].view(np.uint32), want.view(np.uint32))


def test_table_stacking_rotation_and_offsets():
  # Two tables (vocab 10 and 20) stacked with N = 2: padded vocab 16 and 32,
  # the second at row_offset_in_shard 8 with shard rotation S = 2 mod 2 = 0;
  # with rotation=1 the second table's ids move to the other partition.
  a = core.TableSpec(name="a", vocabulary_size=10, embedding_dim=8)
  b = core.TableSpec(name="b", vocabulary_size=20, embedding_dim=8)
  specs = {"fa": _feature("fa", a, 2), "fb": _feature("fb", b, 2)}
  four = lambda stack, samples: 4  # stacked M and U; C = 8*S*N = 32
  specs = T.stack_tables(
    specs,
    ["a", "b"],
    1,
    2,
    rotation=1,
    stack_to_max_ids_per_partition=four,
    stack_to_max_unique_ids_per_partition=four,
  )
  fb = specs["fb"]
  assert fb.id_transformation == core.FeatureIdTransformation(
    row_offset=2, col_offset=16, col_shift=1
  )
  assert fb.table_spec.setting_in_stack == core.TableSettingInStack(
    stack_name="a_b",
    padded_vocab_size=32,
    padded_embedding_dim=8,
    row_offset_in_shard=8,
    shard_rotation=1,
  )
  out, _ = _run({"fa": _rows([3], [4]), "fb": _rows([3], [4])}, specs)
  m = out.sparse_dense_matmul_input
  # fa: id 3 -> col 3 -> p 1, e 1 (SC 0, sid 0); id 4 -> p 0, e 2 (SC 1).
  # fb: id 3 -> col ((3+1)&1) + (3&~1) + 16 = 18 -> p 0, e 9 (SC 0, sid 1:
  #     its samples follow fa's on every SC); id 4 -> col 21 -> p 1, e 10.
  np.testing.assert_array_equal(m.lhs_row_pointers["a_b"], [1, 9, 16, 16, 16, 16, 16, 16] * 2)
  seg0, seg1 = m.lhs_embedding_ids["a_b"][:16], m.lhs_embedding_ids["a_b"][16:]
  np.testing.assert_array_equal(seg0[[0, 8]], [9, 1])
  np.testing.assert_array_equal(seg1[[0, 8]], [2, 10])
  np.testing.assert_array_equal(m.lhs_sample_ids["a_b"][[0, 8, 16, 24]], [1, 0, 0, 1])


def test_dropping_prefix_truncation_and_counter():
  # One SC pair, M = 2 ids and U = 1 unique id per partition. SC0 samples
  # 0-1: partition 0 gets (e0,s0), (e0,s1), (e1,s0) -> keep the first two
  # (same unique id), drop (e1, s0); raw duplicates count too.
  specs = _example_specs("sum", max_ids=2, max_unique=1)
  rows = _rows([0, 2, 2], [0], [], [])
  out, stats = _run({"f": rows}, specs, allow_id_dropping=True)
  m = out.sparse_dense_matmul_input
  np.testing.assert_array_equal(m.lhs_embedding_ids["t"][:8], [0, 0, I, I, I, I, I, I])
  np.testing.assert_array_equal(m.lhs_sample_ids["t"][:8], [0, 1, I, I, I, I, I, I])
  np.testing.assert_array_equal(m.lhs_row_pointers["t"][:8], [2, 8, 8, 8, 8, 8, 8, 8])
  # Statistics are observed before dropping.
  np.testing.assert_array_equal(stats.max_ids_per_partition["t"], [3, 0])
  np.testing.assert_array_equal(stats.max_unique_ids_per_partition["t"], [2, 0])
  assert stats.id_drop_counters["t"] == 2  # id 2 appeared twice in sample 0


def test_overflow_with_dropping_counts_lost_ids():
  # Q = 16 gives 8 entries per SC; SC0 needs 8 in partition 0 and 2 more in
  # partition 1, which start at the aligned position 8: both are lost.
  specs = _example_specs("sum", max_ids=16, max_unique=16, suggested=16)
  rows = _rows([0, 2, 4, 6, 8, 10, 12, 14, 1, 3], [], [], [])
  out, stats = _run({"f": rows}, specs, allow_id_dropping=True)
  m = out.sparse_dense_matmul_input
  assert m.lhs_embedding_ids["t"].shape == (16,)
  np.testing.assert_array_equal(m.lhs_embedding_ids["t"][:8], np.arange(8))
  np.testing.assert_array_equal(m.lhs_row_pointers["t"][:8], [8] * 8)
  np.testing.assert_array_equal(stats.required_buffer_size_per_sc["t"], [16, 0])
  assert stats.id_drop_counters["t"] == 2  # partition 1's ids 1 and 3


def test_ragged_batch_and_dense_forms_give_the_same_buffers():
  specs = _example_specs()
  ragged, _ = _run({"f": EXAMPLE}, specs)
  columnar, _ = _run(
    {"f": RaggedBatch(np.array([0, 0, 3, 1, 2, 3, 5, 1, 1, 4]), np.array([3, 2, 1, 4]))}, specs
  )
  for a, b in zip(ragged.sparse_dense_matmul_input, columnar.sparse_dense_matmul_input):
    np.testing.assert_array_equal(a["t"].view(np.uint32), b["t"].view(np.uint32))

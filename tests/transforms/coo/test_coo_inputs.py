"""Every input form gives the same buffers; dtypes are converted, not misread."""

import numpy as np
import pytest

from sparsepipe import core
from sparsepipe import transforms as T
from sparsepipe.data.ragged import RaggedBatch
from sparsepipe.transforms.coo import inputs as coo_inputs
from sparsepipe.transforms.coo import ragged_flatten

IDS = [[0, 5, 5, 9], [], [3], [7, 1], [2, 2, 2], [11], [], [4, 8, 15]]
WEIGHTS = [
  [0.5, 1.0, 2.0, 0.25],
  [],
  [3.0],
  [1.5, 0.5],
  [1.0, 2.0, 3.0],
  [0.75],
  [],
  [1.0, 1.0, 2.5],
]


def _object_rows(rows, dtype):
  out = np.empty(len(rows), object)
  out[:] = [np.asarray(r, dtype) for r in rows]
  return out


def _specs(combiner="mean", batch=8):
  table = core.TableSpec(name="t", vocabulary_size=16, embedding_dim=8, combiner=combiner)
  return T.prepare_feature_specs_for_training(
    {"f": core.FeatureSpec("f", table, (batch, 4), (batch, 8))}, 2, 2
  )


def _run(feature, weights=None, specs=None):
  out, stats = T.preprocess_sparse_dense_matmul_input(
    {"f": feature},
    None if weights is None else {"f": weights},
    specs or _specs(),
    2,
    2,
    num_sc_per_device=2,
  )
  return out, stats


def _assert_same(a, b):
  for x, y in zip(a[0].sparse_dense_matmul_input, b[0].sparse_dense_matmul_input):
    np.testing.assert_array_equal(x["t"].view(np.uint32), y["t"].view(np.uint32))
  for x, y in zip(a[1], b[1]):
    if isinstance(x["t"], np.ndarray):
      np.testing.assert_array_equal(x["t"], y["t"])
    else:
      assert x["t"] == y["t"]


def _flat(rows, dtype):
  return np.concatenate([np.asarray(r, dtype) for r in rows])


LENGTHS = np.array([len(r) for r in IDS])


@pytest.mark.parametrize("weighted", [False, True])
def test_ragged_forms_agree(weighted):
  w32 = _object_rows(WEIGHTS, np.float32) if weighted else None
  base = _run(_object_rows(IDS, np.int32), w32)
  w64 = _object_rows(WEIGHTS, np.float64) if weighted else None
  _assert_same(base, _run(_object_rows(IDS, np.int64), w64))
  _assert_same(base, _run(_object_rows(IDS, np.uint16), w32))
  _assert_same(
    base, _run([np.asarray(r, np.int32) for r in IDS], None if w32 is None else list(w32))
  )
  _assert_same(
    base, _run([list(r) for r in IDS], None if w32 is None else [list(r) for r in WEIGHTS])
  )
  columnar = RaggedBatch(
    _flat(IDS, np.int64), LENGTHS, _flat(WEIGHTS, np.float64) if weighted else None
  )
  _assert_same(base, _run(columnar))
  if weighted:
    _assert_same(base, _run(RaggedBatch(_flat(IDS, np.int32), LENGTHS), _flat(WEIGHTS, np.float32)))


def test_mixed_row_dtypes_views_and_float_empty_rows():
  base = _run(_object_rows(IDS, np.int32))
  rows = _object_rows(IDS, np.int32)
  rows[0] = rows[0].astype(np.int64)  # mixed dtypes
  rows[1] = np.array([])  # empty float64 row, as np.array([]) makes it
  rows[3] = np.array([7, 0, 1], np.int32)[::2]  # a strided view
  rows[4] = np.array([2, 2, 2], np.dtype(">i4"))  # big-endian
  _assert_same(base, _run(rows))


def test_dense_and_sparse_tensor_forms_agree():
  dense = np.array(
    [[1, 1, 3], [4, 0, 2], [9, 9, 9], [5, 6, 7], [0, 0, 1], [2, 3, 4], [8, 8, 1], [15, 14, 13]]
  )
  weights = np.linspace(0.1, 2.4, 24).reshape(8, 3)
  base = _run(_object_rows(dense.tolist(), np.int32), _object_rows(weights.tolist(), np.float32))
  _assert_same(base, _run(dense.astype(np.int64), weights))
  _assert_same(base, _run(dense.astype(np.int32), weights.astype(np.float32)))
  unweighted = _run(dense)
  rows, cols = np.nonzero(np.ones_like(dense))
  sparse = T.preprocess_sparse_dense_matmul_input_from_sparse_tensor(
    {"f": np.stack([rows, cols], 1)},
    {"f": dense.reshape(-1)},
    {"f": np.array([8, 3])},
    _specs(),
    2,
    2,
    num_sc_per_device=2,
  )
  _assert_same(unweighted, sparse)


def test_sparse_tensor_with_empty_rows_matches_ragged():
  rows = np.repeat(np.arange(8), LENGTHS)
  cols = np.concatenate([np.arange(n) for n in LENGTHS])
  sparse = T.preprocess_sparse_dense_matmul_input_from_sparse_tensor(
    {"f": np.stack([rows, cols], 1)},
    {"f": _flat(IDS, np.int32)},
    {"f": np.array([8, 4])},
    _specs(),
    2,
    2,
    num_sc_per_device=2,
  )
  _assert_same(_run(_object_rows(IDS, np.int32)), sparse)


def test_partially_weighted_pytree_and_nested_structures():
  table_a = core.TableSpec(name="a", vocabulary_size=16, embedding_dim=8, combiner="sum")
  table_b = core.TableSpec(name="b", vocabulary_size=16, embedding_dim=8, combiner="sum")
  specs = T.prepare_feature_specs_for_training(
    {
      "group": [
        core.FeatureSpec("x", table_a, (8, 4), (8, 8)),
        core.FeatureSpec("y", table_b, (8, 4), (8, 8)),
      ]
    },
    2,
    2,
  )
  rows = _object_rows(IDS, np.int32)
  weights = {"group": [_object_rows(WEIGHTS, np.float32), None]}
  out, _ = T.preprocess_sparse_dense_matmul_input(
    {"group": [rows, rows]}, weights, specs, 2, 2, num_sc_per_device=2
  )
  gains = out.sparse_dense_matmul_input.lhs_gains
  sample_ids = out.sparse_dense_matmul_input.lhs_sample_ids
  # Same ids, same layout; only the weighted feature's gains differ from 1.
  np.testing.assert_array_equal(sample_ids["a"], sample_ids["b"])
  written = ~np.isnan(gains["b"])
  assert set(gains["b"][written].tolist()) <= {1.0, 2.0, 3.0}  # merged counts
  assert not np.array_equal(gains["a"][written], gains["b"][written])


def test_int64_ids_are_range_checked_before_conversion():
  rows = _object_rows(IDS, np.int64)
  rows[5] = np.array([2**40], np.int64)
  with pytest.raises(T.PreprocessingError, match="id 1099511627776 in sample 5"):
    _run(rows)


def test_uint64_ids_beyond_int64_are_reported():
  batch = RaggedBatch(np.array([1, 2**63 + 5, 3, 4, 5, 6, 7, 8], np.uint64), np.ones(8, np.int64))
  with pytest.raises(T.PreprocessingError, match="id 9223372036854775813 in sample 1"):
    _run(batch)


def test_normalize_feature_fast_path_keeps_values():
  rows = _object_rows(IDS, np.int32)
  x = coo_inputs.normalize_feature("f", rows)
  np.testing.assert_array_equal(x.values, _flat(IDS, np.int32))
  np.testing.assert_array_equal(x.row_lengths, LENGTHS)
  assert x.values.dtype == np.int32 and x.row_lengths.dtype == np.int64
  w = coo_inputs.normalize_feature("f", rows, _object_rows(WEIGHTS, np.float64)).weights
  assert w.dtype == np.float32
  np.testing.assert_array_equal(w, _flat(WEIGHTS, np.float32))


def test_empty_batch_features_give_empty_buffers():
  table = core.TableSpec(name="t", vocabulary_size=16, embedding_dim=8)
  specs = T.prepare_feature_specs_for_training(
    {"f": core.FeatureSpec("f", table, (4, 1), (4, 8))}, 1, 2
  )
  rows = _object_rows([[], [], [], []], np.int32)
  out, stats = T.preprocess_sparse_dense_matmul_input(
    {"f": rows}, None, specs, 1, 1, num_sc_per_device=2
  )
  m = out.sparse_dense_matmul_input
  assert (m.lhs_embedding_ids["t"] == 2**31 - 1).all()
  assert np.isnan(m.lhs_gains["t"]).all()
  np.testing.assert_array_equal(m.lhs_row_pointers["t"], np.zeros(16, np.int32))
  np.testing.assert_array_equal(stats.max_ids_per_partition["t"], [0, 0])
  np.testing.assert_array_equal(stats.required_buffer_size_per_sc["t"], [0, 0])


def test_compiled_row_reader_reads_object_arrays_of_one_dtype():
  for dtype in (np.int32, np.int64, np.uint16, np.float32):
    values, lengths = ragged_flatten.flatten(_object_rows(IDS, dtype))
    assert values.dtype == dtype and lengths.dtype == np.int64
    np.testing.assert_array_equal(values, _flat(IDS, dtype))
    np.testing.assert_array_equal(lengths, LENGTHS)
  values, lengths = ragged_flatten.flatten(_object_rows([[], []], np.int32))
  assert values.shape == (0,) and lengths.tolist() == [0, 0]
  # Rows of Python ints (object dtype) are the Python path's to convert.
  assert ragged_flatten.flatten(_object_rows(IDS, object)) is None


@pytest.mark.parametrize(
  "row",
  [
    np.array([7, 0, 1], np.int32)[::2],  # strided view
    np.array([[7], [1]], np.int32),  # 2-D
    np.array([7, 1], np.int64),  # another dtype than the first row's
    np.array([7, 1], np.dtype(np.int32, metadata={"m": 1})),  # an equal dtype, another object
    np.ma.masked_array([7, 1], dtype=np.int32),  # a subclass
    [7, 1],
    None,
  ],
  ids=["strided", "2d", "int64", "dtype_object", "subclass", "list", "none"],
)
def test_compiled_row_reader_leaves_every_other_row_to_the_python_path(row):
  rows = _object_rows(IDS, np.int32)
  rows[3] = row
  assert ragged_flatten.flatten(rows) is None
  assert ragged_flatten.flatten(_object_rows(IDS, np.int32)[::2]) is None  # a strided object array
  if row is not None:  # the Python path reads the same ids (or names the bad row)
    expect = coo_inputs.normalize_feature("f", _object_rows(IDS, np.int64))
    got = coo_inputs.normalize_feature("f", rows)
    np.testing.assert_array_equal(got.values, expect.values)
    np.testing.assert_array_equal(got.row_lengths, expect.row_lengths)


def test_compiled_row_reader_is_used_on_this_build():
  """The struct offsets match here (CI's CPython 3.11 / numpy 2), so
  object arrays do not silently take the slow path."""
  assert ragged_flatten._layout_matches()  # pylint: disable=protected-access

"""Bad input raises a ValueError subclass naming the thing and the numbers.

Covers every case of docs/reference/coo_format.md "Where we are deliberately better than the
reference" (the reference aborts, drops or misreads there).
"""

import re

import numpy as np
import pytest

from sparsepipe import core
from sparsepipe import transforms as T
from sparsepipe.data.ragged import RaggedBatch


def _rows(*rows, dtype=np.int32):
  out = np.empty(len(rows), object)
  out[:] = [np.asarray(r, dtype) for r in rows]
  return out


def _replace_row(rows, i, row):
  rows[i] = row
  return rows


def _specs(vocab=16, batch=4, max_ids=4, max_unique=4, suggested=None, global_devices=1, sc=2):
  table = core.TableSpec(
    name="c7",
    vocabulary_size=vocab,
    embedding_dim=8,
    combiner="sum",
    max_ids_per_partition=max_ids,
    max_unique_ids_per_partition=max_unique,
    suggested_coo_buffer_size_per_device=suggested,
  )
  feature = core.FeatureSpec("C7", table, (batch, 4), (batch, 8))
  return T.prepare_feature_specs_for_training({"C7": feature}, global_devices, sc)


def _run(features, specs, weights=None, local=1, global_devices=1, sc=2, **kw):
  return T.preprocess_sparse_dense_matmul_input(
    features, weights, specs, local, global_devices, num_sc_per_device=sc, **kw
  )


def _raises(error, message):
  return pytest.raises(error, match="^" + re.escape(message) + "$")


def test_max_ids_per_partition_exceeded():
  with _raises(
    T.LimitExceededError,
    "feature 'C7' (stack 'c7'): 5 ids in partition 0 of device 0"
    " SC 0 exceed max_ids_per_partition=4",
  ):
    _run({"C7": _rows([0, 2, 4, 6, 8], [], [], [])}, _specs())


def test_max_unique_ids_per_partition_exceeded():
  with _raises(
    T.LimitExceededError,
    "feature 'C7' (stack 'c7'): 2 unique ids in partition 0 of"
    " device 0 SC 0 exceed max_unique_ids_per_partition=1",
  ):
    _run({"C7": _rows([0, 2, 0, 2, 0], [0], [2], [4])}, _specs(max_ids=8, max_unique=1))


def test_limit_names_device_sc_and_partition_with_several_devices():
  # N = 2 (2 devices x 1 SC), both local: device 1 gets samples 2-3, whose
  # ids 3, 5, 1 all live in partition 1.
  specs = _specs(max_ids=1, global_devices=2, sc=1)
  with _raises(
    T.LimitExceededError,
    "feature 'C7' (stack 'c7'): 3 ids in partition 1 of device 1"
    " SC 0 exceed max_ids_per_partition=1",
  ):
    _run({"C7": _rows([0], [1], [3], [5, 1])}, specs, local=2, global_devices=2, sc=1)


def test_multi_feature_stack_is_named_with_its_features():
  a = core.TableSpec(name="a", vocabulary_size=16, embedding_dim=8)
  b = core.TableSpec(name="b", vocabulary_size=16, embedding_dim=8)
  specs = {
    "x": core.FeatureSpec("x", a, (2, 1), (2, 8)),
    "y": core.FeatureSpec("y", b, (2, 1), (2, 8)),
  }
  one = lambda stack, samples: 1
  specs = T.stack_tables(
    specs, ["a", "b"], 1, 2, stack_name="ab", stack_to_max_ids_per_partition=one
  )
  with _raises(
    T.LimitExceededError,
    "features 'x', 'y' (stack 'ab'): 2 ids in partition 0 of"
    " device 0 SC 0 exceed max_ids_per_partition=1",
  ):
    _run({"x": _rows([0], [1]), "y": _rows([0], [1])}, specs)


def test_suggested_buffer_larger_than_theoretical_max():
  with _raises(
    T.PreprocessingError,
    "stack 'c7': suggested_coo_buffer_size_per_device=100 exceeds"
    " the theoretical maximum 32 (max_ids_per_partition=8)",
  ):
    _run({"C7": _rows([0], [1], [2], [3])}, _specs(max_ids=8, suggested=100))


def test_suggested_buffer_not_positive():
  with _raises(
    T.PreprocessingError, "stack 'c7': suggested_coo_buffer_size_per_device=0 must be positive"
  ):
    _run({"C7": _rows([0], [1], [2], [3])}, _specs(suggested=0))


def test_segment_overflow_is_an_error_without_dropping():
  with _raises(
    T.LimitExceededError,
    "feature 'C7' (stack 'c7'): device 0 SC 0 needs 16 COO entries"
    " but suggested_coo_buffer_size_per_device=16 gives 16 per"
    " device, 8 per SC",
  ):
    _run(
      {"C7": _rows([0, 2, 4, 6, 8, 10, 12, 14, 1], [], [], [])},
      _specs(max_ids=16, max_unique=16, suggested=16),
    )


@pytest.mark.parametrize("bad,sample", [(16, 3), (-3, 1)])
def test_ids_outside_the_vocabulary(bad, sample):
  rows = _rows([0], [1], [2], [3])
  rows[sample] = np.array([bad], np.int32)
  with _raises(
    T.PreprocessingError,
    f"feature 'C7' (stack 'c7'): id {bad} in sample {sample} is"
    " outside the vocabulary [0, 16) of table 'c7'",
  ):
    _run({"C7": rows}, _specs())


def test_int64_ids_beyond_int32_are_reported_not_wrapped():
  rows = _rows([0], [2**32 + 1], [2], [3], dtype=np.int64)
  with _raises(
    T.PreprocessingError,
    "feature 'C7' (stack 'c7'): id 4294967297 in sample 1 is"
    " outside the vocabulary [0, 16) of table 'c7'",
  ):
    _run({"C7": rows}, _specs())


def test_batch_not_divisible_by_local_sparsecores():
  with _raises(
    T.PreprocessingError,
    "feature 'C7' (stack 'c7'): batch of 3 rows is not divisible"
    " by local_device_count*num_sc_per_device=1*2=2",
  ):
    _run({"C7": _rows([0], [1], [2])}, _specs(batch=3))


def test_batch_not_matching_the_spec():
  with _raises(
    T.PreprocessingError,
    "feature 'C7' (stack 'c7'): batch of 4 rows on this host does"
    " not match the global batch 8 of its spec for 1 local of 1"
    " global devices (expected 8)",
  ):
    _run({"C7": _rows([0], [1], [2], [3])}, _specs(batch=8))


def test_sparsecore_count_not_a_power_of_two():
  with _raises(
    T.PreprocessingError,
    "global_device_count*num_sc_per_device=3*2=6 SparseCores is not a power of two",
  ):
    _run({"C7": np.zeros((4, 2), np.int32)}, _specs(global_devices=4), global_devices=3)


def test_local_devices_must_divide_global_devices():
  with _raises(
    T.PreprocessingError, "local_device_count=3 must be positive and divide global_device_count=4"
  ):
    _run({"C7": np.zeros((4, 2), np.int32)}, _specs(global_devices=4), local=3, global_devices=4)


def test_only_mod_sharding():
  with _raises(T.PreprocessingError, "sharding_strategy 'DIV' is not supported; only MOD"):
    _run({"C7": np.zeros((4, 2), np.int32)}, _specs(), sharding_strategy="DIV")


@pytest.mark.parametrize(
  "feature,weights,message",
  [
    (
      np.array([1, 2, 3, 4]),
      None,
      "feature 'C7': ids have shape (4,); expected a dense 2-D [batch, k]"
      " array, ragged rows (1-D object array) or a RaggedBatch",
    ),
    (np.zeros((4, 2), np.float32), None, "feature 'C7': ids have dtype float32, expected integer"),
    (
      np.zeros((4, 2), np.int32),
      np.zeros((4, 3), np.float32),
      "feature 'C7': weights have shape (4, 3) but ids have shape (4, 2)",
    ),
    (
      np.zeros((4, 2), np.int32),
      np.zeros((4, 2), np.int32),
      "feature 'C7': weights have dtype int32, expected floating-point",
    ),
    (
      _replace_row(_rows([0], [1], [2], [3]), 1, np.array([1.5])),
      None,
      "feature 'C7': ids row 1 has dtype float64, expected integer",
    ),
    (
      _replace_row(_rows([0], [1], [2], [3]), 1, np.array([[1, 2]])),
      None,
      "feature 'C7': ids row 1 has shape (1, 2), expected 1-D",
    ),
    (
      _rows([0], [1], [2], [3]),
      _rows([1.0], [1.0, 2.0], [1.0], [1.0], dtype=np.float32),
      "feature 'C7': weights row 1 has 2 values but ids row 1 has 1",
    ),
    (
      _rows([0], [1], [2], [3]),
      np.ones((4, 1), np.float32),
      "feature 'C7': weights must be ragged rows like the ids (4 rows), got ndarray with 4 rows",
    ),
    (
      RaggedBatch(np.array([1, 2, 3]), np.array([1, 1, 1, 1])),
      None,
      "feature 'C7': row_lengths sum to 4 but there are 3 ids",
    ),
    (
      RaggedBatch(np.array([1, 2, 3]), np.array([1, 1, 2, -1])),
      None,
      "feature 'C7': row_lengths[3]=-1 is negative",
    ),
    (
      RaggedBatch(np.array([1, 2, 3, 4]), np.array([1, 1, 1, 1]), np.ones(4, np.float32)),
      np.ones(4, np.float32),
      "feature 'C7': weights given both inside the RaggedBatch and separately",
    ),
  ],
)
def test_bad_feature_input(feature, weights, message):
  w = None if weights is None else {"C7": weights}
  with _raises(T.PreprocessingError, message):
    _run({"C7": feature}, _specs(), w)


def test_structure_mismatch():
  with pytest.raises(
    T.PreprocessingError,
    match=re.escape("features do not have the structure of feature_specs (PyTreeDef({'C7': *}))"),
  ):
    _run({"x": np.zeros((4, 2), np.int32)}, _specs())


def test_unprepared_specs():
  table = core.TableSpec(name="t", vocabulary_size=16, embedding_dim=8)
  specs = {"C7": core.FeatureSpec("C7", table, (4, 2), (4, 8))}
  with _raises(
    T.PreprocessingError,
    "feature 'C7' (table 't') is not prepared: call"
    " prepare_feature_specs_for_training (or stack_tables) first",
  ):
    _run({"C7": np.zeros((4, 2), np.int32)}, specs)


def test_features_of_one_stack_with_different_limits():
  specs = _specs()
  t = specs["C7"].table_spec
  other = core.FeatureSpec("D", t, (4, 2), (4, 8), specs["C7"].id_transformation)
  other = T.update_preprocessing_parameters(
    {"D": other},
    core.SparseDenseMatmulInputStats({"c7": np.array([9])}, {"c7": np.array([9])}, {}, {}),
    2,
  )["D"]
  with _raises(
    T.PreprocessingError,
    "stack 'c7': features 'C7' and 'D' carry different"
    " StackedTableSpecs (limits or sizes); re-run stacking or"
    " update_preprocessing_parameters on all features",
  ):
    _run(
      {"C7": np.zeros((4, 2), np.int32), "D": np.zeros((4, 2), np.int32)},
      {"C7": specs["C7"], "D": other},
    )


@pytest.mark.parametrize(
  "indices,shape,message",
  [
    (
      [[1, 0], [0, 0]],
      [4, 2],
      "feature 'C7': indices are not row-major: index 1 has row 0 after row 1",
    ),
    ([[0, 0], [4, 0]], [4, 2], "feature 'C7': index 1 [4, 0] is outside dense_shape [4, 2]"),
    ([[0, 0], [1, 2]], [4, 2], "feature 'C7': index 1 [1, 2] is outside dense_shape [4, 2]"),
    ([[0, 0], [1, 0]], [4, 2, 1], "feature 'C7': dense_shape [4, 2, 1] must have 2 entries"),
  ],
)
def test_bad_sparse_tensor(indices, shape, message):
  with _raises(T.PreprocessingError, message):
    T.preprocess_sparse_dense_matmul_input_from_sparse_tensor(
      {"C7": np.array(indices)},
      {"C7": np.array([1, 2])},
      {"C7": np.array(shape)},
      _specs(),
      1,
      1,
      num_sc_per_device=2,
    )

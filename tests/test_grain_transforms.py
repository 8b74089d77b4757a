"""The Grain transforms on their own: PackArrays/UnpackArrays, StatsTotals, Grain stats."""

import gc
import json
import time

import grain
from grain._src.python.dataset import dataset as grain_dataset
import numpy as np
import pytest

from sparsepipe import core
from sparsepipe import data
from sparsepipe import transforms as T


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("grain") / "ds")
  features = (
    data.SyntheticFeature("a", 20, 1, 2),
    data.SyntheticFeature("b", 10, 0, 2, weighted=True),
  )
  return data.write_synthetic(
    path,
    features,
    num_examples=13,
    num_dense=1,
    seed=1,
    examples_per_record=3,
    max_records_per_shard=2,
  )


def test_pack_unpack_round_trip():
  batch = T.PreprocessedBatch(
    core.TrainBatch(
      np.arange(4, dtype=np.float32),
      np.ones((4, 2), np.float32),
      core.SparseDenseMatmulInput(
        {"s": np.arange(8, dtype=np.int32)},
        {"s": np.arange(16, dtype=np.int32)},
        {"s": np.arange(16, dtype=np.int32) * 2},
        {"s": np.full(16, np.nan, np.float32)},
      ),
    ),
    core.SparseDenseMatmulInputStats(
      {"s": np.int32([1, 2])}, {"s": np.int32([3, 4])}, {"s": np.int32([8])}, {"s": 5}
    ),
    2,
  )
  packed = T.PackArrays().map(batch)
  assert sorted(packed.buffers) == ["<f4", "<i4"]
  assert packed.buffers["<i4"].size == 8 + 16 + 16 + 2 + 2 + 1
  back = T.UnpackArrays().map(packed)
  assert type(back) is T.PreprocessedBatch and back.num_corrupt_records == 2
  assert back.stats.id_drop_counters == {"s": 5}
  np.testing.assert_array_equal(back.batch.sparse.lhs_sample_ids["s"], np.arange(16) * 2)
  np.testing.assert_array_equal(back.batch.dense, np.ones((4, 2)))
  assert np.isnan(back.batch.sparse.lhs_gains["s"]).all()


def test_stats_totals_state_round_trip_and_shape_check():
  totals = T.StatsTotals()
  s1 = core.SparseDenseMatmulInputStats(
    {"x": np.int32([1, 5])}, {"x": np.int32([1, 1])}, {"x": np.int32([8])}, {"x": 2}
  )
  s2 = core.SparseDenseMatmulInputStats(
    {"x": np.int32([3, 4])}, {"x": np.int32([2, 0])}, {"x": np.int32([16])}, {"x": 1}
  )
  totals.add(s1, 1)
  totals.add(s2)
  state = json.loads(json.dumps(totals.to_state()))
  assert state == {
    "batches": 2,
    "corrupt_records": 1,
    "max_ids_per_partition": {"x": [3, 5]},
    "max_unique_ids_per_partition": {"x": [2, 1]},
    "required_buffer_size_per_sc": {"x": [16]},
    "id_drop_counters": {"x": 3},
  }
  again = T.StatsTotals.from_state(state)
  assert again.to_state() == state
  np.testing.assert_array_equal(again.as_stats().max_ids_per_partition["x"], [3, 5])
  with pytest.raises(
    ValueError,
    match=(
      r"stack 'x': max_ids_per_partition has shape \(3,\) but the running total has shape \(2,\)"
    ),
  ):
    again.add(core.SparseDenseMatmulInputStats({"x": np.int32([1, 2, 3])}, {}, {}, {}))


def test_custom_iterators_record_grain_stage_timing(dataset):
  """DecodeBatch and RecordStats report time and elements like Grain's own stages."""
  table = core.TableSpec("a", 20, 4, max_ids_per_partition=64, max_unique_ids_per_partition=64)
  specs = T.prepare_feature_specs_for_training(
    {"a": core.FeatureSpec("a", table, (4, 2), (4, 4))}, 1, 2
  )
  config = T.InputConfig(dataset.directory, 4, num_sc_per_device=2)
  ds = T.make_host_dataset(
    config,
    specs,
    local_device_count=1,
    global_device_count=1,
    process_index=0,
    process_count=1,
    manifest=dataset,
  )
  options = grain.experimental.DatasetOptions(
    execution_tracking_mode=grain.experimental.ExecutionTrackingMode.STAGE_TIMING
  )
  it = iter(grain.experimental.WithOptionsIterDataset(ds, options))
  for _ in range(3):
    next(it)
  # Grain's reporting thread folds the recorded times into the summary: wait for it.
  builtin = "MapDatasetIterator(transform=PreprocessSparse)"
  for _ in range(500):
    it._stats.report()  # pylint: disable=protected-access
    nodes = {n.name: n for n in grain_dataset.get_execution_summary(it).nodes.values()}
    record = nodes["RecordStatsIterator"]
    if record.num_produced_elements == 3 and nodes[builtin].num_produced_elements:
      break
    time.sleep(0.01)
  decode = nodes["_DecodeBatchIterator(batch_size=4)"]
  # Counted like Grain's own map stage between them (which misses the first element).
  assert record.num_produced_elements == 3
  assert decode.num_produced_elements == nodes[builtin].num_produced_elements >= 2
  assert decode.total_processing_time_ns > 0 and record.total_processing_time_ns > 0
  assert "ParsedBatch" in decode.output_spec and "PreprocessedBatch" in record.output_spec


def test_unpack_from_shared_memory_gives_plain_views_that_keep_the_buffer_alive():
  element = {"ids": np.arange(10, dtype=np.int32).reshape(2, 5), "g": np.ones(3, np.float32)}
  packed = T.PackArrays(shared_memory=True).map(element)
  for buffer in packed.buffers.values():
    buffer.unlink_on_del()
  back = T.UnpackArrays().map(packed)
  assert type(back["ids"]) is np.ndarray and type(back["g"]) is np.ndarray
  del packed
  gc.collect()
  np.testing.assert_array_equal(back["ids"], np.arange(10).reshape(2, 5))
  np.testing.assert_array_equal(back["g"], np.ones(3))

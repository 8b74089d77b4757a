"""The Grain transforms on their own: ParseRecords, PackArrays/UnpackArrays, StatsTotals."""

import json

import grain
import numpy as np
import pytest

from sparsepipe import data
from sparsepipe import transforms as T


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("grain") / "ds")
  features = (data.SyntheticFeature("a", 20, 1, 2), data.SyntheticFeature("b", 10, 0, 2, weighted=True))
  return data.write_synthetic(path, features, num_examples=13, num_dense=1, seed=1,
                              examples_per_record=3, max_records_per_shard=2)


def test_parse_records_in_a_users_pipeline(dataset):
  source = data.manifest_source(dataset)
  ds = grain.MapDataset.source(source).map_with_index(
      T.ParseRecords(dataset.schema, data.RecordLocator.from_manifest(dataset)))
  parsed = [ds[i] for i in range(len(ds))]
  assert [p.examples.num_examples for p in parsed] == [3, 3, 3, 3, 1]
  assert all(p.num_corrupt_records == 0 for p in parsed)
  np.testing.assert_array_equal(parsed[4].examples.labels,
                                data.decode_batch(source[4], dataset.schema).labels)
  # Later epochs (indices past the end) wrap around.
  repeated = ds.repeat(2)
  assert repeated[6].examples.num_examples == 3


def test_parse_records_names_file_and_index_or_skips():
  schema = data.make_schema(0, {"a": 4})
  record = data.encode_example(data.Example(1.0, np.zeros(0, np.float32), {"a": np.array([3])}), schema)
  locator = data.RecordLocator(("/d/part-00000.arrayrecord", "/d/part-00001.arrayrecord"), (2, 5))
  parse = T.ParseRecords(schema, locator)
  assert parse.map_with_index(1, record).examples.num_examples == 1
  with pytest.raises(data.CorruptRecordError, match=(
      r"^corrupt record 1 in '/d/part-00001.arrayrecord': expected 36 bytes, got 35 \(truncated\)$")):
    parse.map_with_index(3, record[:-1])
  skipping = T.ParseRecords(schema, locator, skip_corrupt=True)
  assert skipping.map_with_index(8, record[:-1]) == T.ParsedBatch(None, 1)


def test_pack_unpack_round_trip():
  batch = T.PreprocessedBatch(
      T.TrainBatch(np.arange(4, dtype=np.float32), np.ones((4, 2), np.float32),
                   T.SparseDenseMatmulInput({"s": np.arange(8, dtype=np.int32)},
                                            {"s": np.arange(16, dtype=np.int32)},
                                            {"s": np.arange(16, dtype=np.int32) * 2},
                                            {"s": np.full(16, np.nan, np.float32)})),
      T.SparseDenseMatmulInputStats({"s": np.int32([1, 2])}, {"s": np.int32([3, 4])},
                                    {"s": np.int32([8])}, {"s": 5}),
      2)
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
  s1 = T.SparseDenseMatmulInputStats({"x": np.int32([1, 5])}, {"x": np.int32([1, 1])},
                                     {"x": np.int32([8])}, {"x": 2})
  s2 = T.SparseDenseMatmulInputStats({"x": np.int32([3, 4])}, {"x": np.int32([2, 0])},
                                     {"x": np.int32([16])}, {"x": 1})
  totals.add(s1, 1)
  totals.add(s2)
  state = json.loads(json.dumps(totals.to_state()))
  assert state == {
      "batches": 2, "corrupt_records": 1,
      "max_ids_per_partition": {"x": [3, 5]}, "max_unique_ids_per_partition": {"x": [2, 1]},
      "required_buffer_size_per_sc": {"x": [16]}, "id_drop_counters": {"x": 3}}
  again = T.StatsTotals.from_state(state)
  assert again.to_state() == state
  np.testing.assert_array_equal(again.as_stats().max_ids_per_partition["x"], [3, 5])
  with pytest.raises(ValueError, match=(
      r"stack 'x': max_ids_per_partition has shape \(3,\) but the running total has shape \(2,\)")):
    again.add(T.SparseDenseMatmulInputStats({"x": np.int32([1, 2, 3])}, {}, {}, {}))

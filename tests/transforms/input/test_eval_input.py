"""The eval input: one ordered pass, padded and masked, every example exactly once."""

import dataclasses
import os

from array_record.python import array_record_module
import numpy as np
import pytest

from sparsepipe import core
from sparsepipe import data
from sparsepipe import transforms as T
from sparsepipe.transforms.input import eval_read
from sparsepipe.transforms.input import example_order
import datasets

S = 2
NUM_EXAMPLES = 93
PER_RECORD = 5  # 19 records, the last holds 3
FEATURES = (
  data.SyntheticFeature("a", 40, 1, 3),
  data.SyntheticFeature("b", 24, 0, 4, weighted=True),
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
  """93 examples whose dense[:, 0] is the example number + 1, in 4 shards."""
  path = str(tmp_path_factory.mktemp("eval") / "ds")
  examples = datasets.write_numbered(
    path, FEATURES, NUM_EXAMPLES, PER_RECORD, max_records_per_shard=6, first=1
  )
  return path, examples


def make_specs(global_batch, global_devices):
  return datasets.feature_specs(FEATURES, global_batch, global_devices, S)


def host_batches(path, batch, index, count, **kw):
  specs = make_specs(batch * count, 2 * count)
  config = T.InputConfig(path, batch, num_sc_per_device=S, **kw)
  ds = T.make_host_eval_input(
    config,
    specs,
    local_device_count=2,
    global_device_count=2 * count,
    process_index=index,
    process_count=count,
  )
  return list(ds), specs


@pytest.mark.parametrize("batch,count", [(16, 1), (12, 2), (20, 2)])
def test_every_example_exactly_once(dataset, batch, count):
  path, _ = dataset
  per_host = [host_batches(path, batch, i, count)[0] for i in range(count)]
  num_batches = -(-NUM_EXAMPLES // (batch * count))
  assert [len(b) for b in per_host] == [num_batches] * count
  seen = []
  for host in per_host:
    for b in host:
      assert isinstance(b, core.EvalBatch)
      assert b.mask.shape == (batch,) and b.mask.dtype == np.float32
      pad = b.mask == 0
      np.testing.assert_array_equal(b.batch.labels[pad], 0)
      np.testing.assert_array_equal(b.batch.dense[pad], 0)
      seen.append(b.batch.dense[b.mask == 1, 0])
  np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(1, NUM_EXAMPLES + 1))


def test_two_hosts_read_blocks_of_each_global_batch(dataset):
  path, _ = dataset
  (host0, _), (host1, _) = (host_batches(path, 20, i, 2) for i in range(2))
  # Global batch g is examples [40g, 40g + 40): host 0 the first 20, host 1 the rest.
  np.testing.assert_array_equal(host0[0].batch.dense[:, 0], np.arange(1, 21))
  np.testing.assert_array_equal(host1[0].batch.dense[:, 0], np.arange(21, 41))
  np.testing.assert_array_equal(host0[2].mask, [1] * 13 + [0] * 7)
  np.testing.assert_array_equal(host1[2].mask, [0] * 20)  # nothing left: all padding


def test_batches_equal_direct_preprocessing_of_padded_examples(dataset):
  path, examples = dataset
  batches, specs = host_batches(path, 16, 0, 1)
  last = data.slice_batch(examples, 80, 93)
  padding = eval_read.padding_examples(data.read_manifest(path).schema, 3)
  padded = data.concat_batches([last, padding])
  np.testing.assert_array_equal(padded.sparse["a"].row_lengths[13:], 0)
  want = (
    T.PreprocessSparse(specs, local_device_count=2, global_device_count=2, num_sc_per_device=S)
    .map(padded)
    .batch
  )
  got = batches[-1].batch
  np.testing.assert_array_equal(got.labels, want.labels)
  np.testing.assert_array_equal(got.dense, want.dense)
  for part_got, part_want in zip(got.sparse, want.sparse):
    for stack in part_want:
      np.testing.assert_array_equal(part_got[stack], part_want[stack])


def test_workers_give_the_same_batches(dataset):
  path, _ = dataset
  plain, _ = host_batches(path, 16, 0, 1)
  workers, _ = host_batches(path, 16, 0, 1, num_workers=1)
  assert len(workers) == len(plain)
  for a, b in zip(plain, workers):
    np.testing.assert_array_equal(a.mask, b.mask)
    np.testing.assert_array_equal(a.batch.dense, b.batch.dense)


def test_record_starts_allow_a_short_last_record_per_shard(dataset):
  path, _ = dataset
  manifest = data.read_manifest(path)
  shards = (data.manifest.ShardInfo("x", 3, 13), data.manifest.ShardInfo("y", 2, 6))
  m = dataclasses.replace(manifest, shards=shards)
  np.testing.assert_array_equal(example_order.record_starts(m), [0, 5, 10, 13, 18, 19])
  bad = dataclasses.replace(manifest, shards=(data.manifest.ShardInfo("x", 3, 16),))
  with pytest.raises(
    ValueError,
    match=r"shard 'x' of '.*': 3 records hold 16 examples, not full"
    r" records of examples_per_record=5 and a last one of 1 to R: its examples cannot be located",
  ):
    example_order.record_starts(bad)


def eval_specs(vocab):
  raw = {"a": core.FeatureSpec("a", core.TableSpec("t", vocab, 8), (2, 1), (2, 8))}
  return T.prepare_feature_specs_for_training(raw, 1, S)


def test_corrupt_eval_record_is_an_error_even_with_skip_corrupt(tmp_path):
  shard = datasets.write_with_corrupt_records(str(tmp_path / "ds"), bad={4})
  config = T.InputConfig(str(tmp_path / "ds"), 2, num_sc_per_device=S, skip_corrupt=True)
  ds = T.make_host_eval_input(
    config,
    eval_specs(10),
    local_device_count=1,
    global_device_count=1,
    process_index=0,
    process_count=1,
  )
  with pytest.raises(data.CorruptRecordError, match=rf"^corrupt record 4 in '{shard}'"):
    list(ds)


def test_records_that_disagree_with_the_manifest_are_an_error(tmp_path):
  """Records of 1, 2, 2 examples where the manifest implies 2, 2, 1."""
  path = str(tmp_path / "ds")
  schema = data.make_schema(1, {"a": 10})
  codec = data.RecordCodec(schema)
  os.makedirs(path)
  shard = os.path.join(path, "part-00000.arrayrecord")
  writer = array_record_module.ArrayRecordWriter(shard, "group_size:1")
  examples = [data.Example(float(i % 2), np.float32([i]), {"a": np.array([i])}) for i in range(5)]
  for lo, hi in ((0, 1), (1, 3), (3, 5)):
    writer.write(codec.encode_batch(data.batch_from_examples(examples[lo:hi], schema)))
  writer.close()
  data.write_manifest(
    data.Manifest(path, schema, (data.ShardInfo("part-00000.arrayrecord", 3, 5),), 2)
  )
  config = T.InputConfig(path, 2, num_sc_per_device=S)
  ds = T.make_host_eval_input(
    config,
    eval_specs(10),
    local_device_count=1,
    global_device_count=1,
    process_index=0,
    process_count=1,
  )
  with pytest.raises(
    ValueError,
    match=rf"^record 0 of '{shard}' holds 1 examples, the manifest"
    r" implies 2\n",
  ):
    list(ds)


def test_an_eval_pass_of_batches_below_one_example_is_refused():
  # Was a ZeroDivisionError.
  assert [eval_read.num_eval_batches(n, 4) for n in (0, 1, 4, 5)] == [0, 1, 1, 2]
  with pytest.raises(
    ValueError,
    match=r"^an eval pass of 10 examples in global batches of 0: the batch size must be >= 1"
    r" and the examples >= 0$",
  ):
    eval_read.num_eval_batches(10, 0)

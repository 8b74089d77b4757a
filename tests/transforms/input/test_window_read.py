"""Gathering examples of a decoded window: rows in any order, ids and weights with them."""

import pickle

import numpy as np

from sparsepipe import data
from sparsepipe import transforms as T

SCHEMA = data.ExampleSchema(
  num_dense=2,
  sparse=(data.SparseFeatureSchema("a", 10), data.SparseFeatureSchema("b", 100, weighted=True)),
)
EXAMPLES = [
  data.Example(
    1.0,
    np.float32([0.5, -1.0]),
    {"a": np.array([1, 2, 3]), "b": np.array([7])},
    {"b": np.float32([0.25])},
  ),
  data.Example(
    0.0,
    np.float32([2.0, 3.0]),
    {"a": np.array([], np.int64), "b": np.array([99, 0])},
    {"b": np.float32([1.5, 2.5])},
  ),
  data.Example(
    1.0,
    np.float32([0.0, 0.0]),
    {"a": np.array([9]), "b": np.array([], np.int32)},
    {"b": np.float32([])},
  ),
]


def assert_batch_equal(x, y):
  np.testing.assert_array_equal(x.labels, y.labels)
  np.testing.assert_array_equal(x.dense, y.dense)
  assert list(x.sparse) == list(y.sparse)
  for name in x.sparse:
    for field in ("values", "row_lengths", "weights"):
      np.testing.assert_array_equal(getattr(x.sparse[name], field), getattr(y.sparse[name], field))


def test_take_examples_gathers_in_any_order_with_repeats():
  batch = data.batch_from_examples(EXAMPLES, SCHEMA)
  got = T.take_examples(batch, np.array([2, 0, 2, 1]))
  assert_batch_equal(got, data.batch_from_examples([EXAMPLES[i] for i in (2, 0, 2, 1)], SCHEMA))
  np.testing.assert_array_equal(got.sparse["a"].values, [9, 1, 2, 3, 9])
  np.testing.assert_array_equal(got.sparse["a"].row_lengths, [1, 3, 1, 0])
  np.testing.assert_array_equal(got.sparse["b"].weights, [0.25, 1.5, 2.5])
  assert got.sparse["a"].weights is None
  splits = {name: rb.row_splits() for name, rb in batch.sparse.items()}
  sliced = data.slice_batch(batch, 1, 3)
  assert_batch_equal(T.take_examples(batch, np.array([1, 2]), splits), sliced)
  assert T.take_examples(batch, np.zeros(0, np.int64)).num_examples == 0


def test_each_worker_decodes_only_its_own_windows(tmp_path):
  # 200 examples in 50 records of 4, windows of 2 records (8 examples, 25 an epoch),
  # batches of 4: batches r, r + 8, ... read lane r of 8 (epoch 0's windows r, r + 8,
  # ..., then epoch 1's r - 1, ...); 64 batches read 8 per lane, 32 examples = 4
  # windows each: 32 windows in all. Worker j of N reads batches j, j + N, ..., so
  # with N dividing 8 it reads whole lanes: each window is decoded once in all (each
  # worker used to decode every window: 64 decodes with 2 workers).
  features = data.criteo_like_features(2, 10, min_ids=1, max_ids=3)
  manifest = data.write_synthetic(
    str(tmp_path / "ds"), features, num_examples=200, num_dense=1, examples_per_record=4
  )
  order = T.ExampleOrder(manifest, shuffle=True, seed=3, window=2)
  assert order.windows_per_epoch == 25 and T.WINDOW_LANES == 8

  def make():
    reader = T.ExampleReader(manifest)
    return T.ReadTrainBatch(order, reader, per_host_batch_size=4, process_index=0, process_count=1)

  one = make()
  want = [one.map(k).examples for k in range(64)]
  assert one._windows.windows_decoded == 32 and one._windows.windows_kept == 16
  for n in (2, 4, 8):
    workers = [pickle.loads(pickle.dumps(make())) for _ in range(n)]
    for k in range(64):
      assert_batch_equal(workers[k % n].map(k).examples, want[k])
    assert [w._windows.windows_decoded for w in workers] == [32 // n] * n
    assert [w._windows.windows_kept for w in workers] == [16 // n] * n
  # 3 workers do not divide the lanes: a lane's batches go to all 3, and each window's
  # 2 batches (lane batches 2i and 2i + 1: batches 8 apart) to 2 of them.
  workers = [pickle.loads(pickle.dumps(make())) for _ in range(3)]
  for k in range(64):
    workers[k % 3].map(k)
  assert sum(w._windows.windows_decoded for w in workers) == 64

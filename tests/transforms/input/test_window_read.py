"""Gathering examples of a decoded window: rows in any order, ids and weights with them."""

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

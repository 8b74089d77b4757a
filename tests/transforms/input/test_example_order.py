"""The example stream: a seeded per-epoch permutation, and ranges located by arithmetic."""

import numpy as np
import pytest

from sparsepipe import data
from sparsepipe import transforms as T

R = 5
# Three shards, each with a short last record (records 4 and 9 hold 3 and 2).
SHARDS = (
  data.ShardInfo("a", 5, 4 * R + 3),
  data.ShardInfo("b", 5, 4 * R + 2),
  data.ShardInfo("c", 2, 2 * R),
)
MANIFEST = data.Manifest("/nowhere", data.make_schema(1, {"x": 10}), SHARDS, R)
COUNTS = [5, 5, 5, 5, 3, 5, 5, 5, 5, 2, 5, 5]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 17, 1000, 4099])
def test_permute_is_a_bijection_for_every_size(n):
  for epoch in (0, 1, 5):
    image = T.permute(np.arange(n), n, seed=11, epoch=epoch)
    assert sorted(image.tolist()) == list(range(n))


def test_permute_is_deterministic_and_differs_per_epoch_and_seed():
  n = 1000
  first = T.permute(np.arange(n), n, seed=3, epoch=0)
  np.testing.assert_array_equal(first, T.permute(np.arange(n), n, seed=3, epoch=0))
  # Any subset of positions maps like the whole: a batch needs no other batch.
  np.testing.assert_array_equal(T.permute(np.arange(500, 520), n, seed=3, epoch=0), first[500:520])
  for other in (T.permute(np.arange(n), n, seed=3, epoch=1), T.permute(np.arange(n), n, seed=4)):
    assert np.mean(other == first) < 0.02
  # Far from the identity: about n/3 mean displacement for a random order.
  assert 250 < np.mean(np.abs(first - np.arange(n))) < 420
  with pytest.raises(ValueError, match=r"^positions must lie in \[0, 10\)$"):
    T.permute(np.array([10]), 10, seed=0)


def expand(run):
  """[(record, offset)] of a RecordRun."""
  examples = [(int(r), i) for r, c in zip(run.records, run.counts) for i in range(c)]
  return examples[run.skip : run.skip + run.take]


def naive_epoch(epoch, shuffle):
  """The epoch's examples built from the definition, record by record."""
  short = [i for i, c in enumerate(COUNTS) if c < R]
  full = [i for i, c in enumerate(COUNTS) if c == R]
  if shuffle:
    ranks = T.permute(np.arange(len(full)), len(full), seed=9, epoch=epoch)
    records = [full[r] for r in ranks] + short
  else:
    records = list(range(len(COUNTS)))
  return [(r, i) for r in records for i in range(COUNTS[r])]


@pytest.mark.parametrize("shuffle", [False, True])
def test_any_range_of_the_stream_is_located_like_the_definition(shuffle):
  order = T.ExampleOrder(MANIFEST, shuffle=shuffle, seed=9)
  assert order.epoch_examples == sum(COUNTS) == 55
  stream = [x for e in range(3) for x in naive_epoch(e, shuffle)]
  for start, stop in [(0, 55), (3, 9), (50, 61), (53, 56), (54, 110), (108, 165), (7, 140)]:
    assert expand(order.locate(start, stop)) == stream[start:stop], (start, stop)
  if shuffle:  # every epoch holds each example once, in another order
    assert sorted(stream[:55]) == sorted(stream[55:110]) and stream[:55] != stream[55:110]


def test_a_shard_that_is_not_full_records_is_named():
  bad = data.Manifest("/d", MANIFEST.schema, (data.ShardInfo("x", 2, 11),), R)
  with pytest.raises(
    ValueError,
    match=r"^shard 'x' of '/d': 2 records hold 11 examples, not full records of"
    r" examples_per_record=5 and a last one of 1 to R: its examples cannot be located$",
  ):
    T.ExampleOrder(bad, shuffle=True)

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


# ------------------------------------------------------------- window shuffle
# Windows of W = 3 records: 15 examples each in an epoch's record sequence,
# the last window (records of rank 9-11: one full and the two short ones) 10.
W = 3


def window_examples(order, start, stop, lane=0, lanes=1):
  """[(record, offset)] of positions [start, stop) of a lane, from window_records/window_slots."""
  slots = order.window_slots(start, stop, lane, lanes)
  out = []
  for i, number in enumerate(slots.windows):
    run = order.window_records(int(number))
    pairs = [(int(r), j) for r, c in zip(run.records, run.counts) for j in range(c)]
    out += [pairs[q] for q in slots.slot[slots.window == i]]
  return out


def naive_windows(epoch):
  """The epoch's windows from the definition: each window's examples in its own order."""
  records = [r for r, _ in naive_epoch(epoch, True)]
  sequence = list(dict.fromkeys(records))  # the epoch's records, in sequence order
  out = []
  for w in range(0, len(sequence), W):
    pairs = [(r, i) for r in sequence[w : w + W] for i in range(COUNTS[r])]
    slots = T.permute(np.arange(len(pairs)), len(pairs), seed=9, epoch=epoch, stream=w // W + 1)
    out.append([pairs[q] for q in slots])
  return out


def naive_window_epoch(epoch):
  """The epoch's examples from the definition, window after window."""
  return [x for window in naive_windows(epoch) for x in window]


def test_window_shuffle_places_each_example_exactly():
  order = T.ExampleOrder(MANIFEST, shuffle=True, seed=9, window=W)
  assert order.shuffles_examples and order.windows_per_epoch == 4
  first = window_examples(order, 0, 15)  # window 0: records 1, 0, 3
  assert [r for r, _ in first] == [3, 3, 1, 3, 3, 1, 0, 1, 0, 0, 0, 1, 0, 1, 3]
  assert [i for _, i in first] == [0, 4, 0, 2, 1, 1, 0, 2, 1, 4, 2, 4, 3, 3, 3]
  last = window_examples(order, 45, 60)  # window 3 (records 11, 4, 9), then epoch 1's first
  assert [r for r, _ in last] == [11, 11, 11, 4, 11, 4, 9, 9, 11, 4, 10, 8, 1, 10, 1]
  assert [i for _, i in last] == [4, 0, 1, 1, 3, 0, 1, 0, 2, 2, 0, 2, 1, 3, 3]


def test_window_shuffle_splits_records_across_batches():
  # With records shuffled alone, a batch of 5 aligned to records is one record's
  # examples; with the window shuffle every such batch mixes records.
  records_only = T.ExampleOrder(MANIFEST, shuffle=True, seed=9)
  assert not records_only.shuffles_examples
  assert [len(set(expand(records_only.locate(s, s + 5)))) for s in (0, 5, 10)] == [5, 5, 5]
  assert {len({r for r, _ in expand(records_only.locate(s, s + 5))}) for s in (0, 5, 10)} == {1}
  order = T.ExampleOrder(MANIFEST, shuffle=True, seed=9, window=W)
  batches = [{r for r, _ in window_examples(order, s, s + 5)} for s in range(0, 45, 5)]
  assert all(len(b) >= 2 for b in batches), batches


def test_window_shuffle_is_the_definition_over_epochs_and_any_range():
  order = T.ExampleOrder(MANIFEST, shuffle=True, seed=9, window=W)
  stream = [x for e in range(3) for x in naive_window_epoch(e)]
  for start, stop in [(0, 55), (3, 9), (14, 16), (50, 61), (53, 56), (54, 110), (7, 165)]:
    assert window_examples(order, start, stop) == stream[start:stop], (start, stop)
  # Each epoch holds every example once; epochs differ.
  assert sorted(stream[:55]) == sorted(stream[55:110]) and stream[:55] != stream[55:110]


def naive_lane(lane, lanes, cycles):
  """Lane `lane` of `lanes`: in epoch e, the windows w with (w + e) mod lanes == lane."""
  return [
    x
    for e in range(cycles * lanes)
    for w, window in enumerate(naive_windows(e))
    if (w + e) % lanes == lane
    for x in window
  ]


def test_window_lanes_are_the_definitions_windows_dealt_per_epoch():
  # 4 windows an epoch (15, 15, 15, 10 examples). Lane 1 of 3 holds epoch 0's
  # window 1, epoch 1's windows 0 and 3, epoch 2's window 2 (55 examples: one
  # epoch's worth per 3 epochs, as each lane), then the same for epochs 3..5.
  order = T.ExampleOrder(MANIFEST, shuffle=True, seed=9, window=W)
  first = window_examples(order, 13, 17, lane=1, lanes=3)  # the end of 0's window 1, 1's 0
  assert first == [(8, 3), (8, 4), (10, 0), (8, 2)]
  assert first == naive_windows(0)[1][13:] + naive_windows(1)[0][:2]
  for lanes in (1, 2, 3, 8):
    for lane in range(lanes):
      stream = naive_lane(lane, lanes, 2)
      assert len(stream) == 110
      for start, stop in [(0, 15), (3, 40), (14, 16), (50, 61), (40, 110)]:
        got = window_examples(order, start, stop, lane, lanes)
        assert got == stream[start:stop], (lane, lanes, start, stop)
  # One lane is the stream itself.
  assert window_examples(order, 0, 110, 0, 1) == naive_window_epoch(0) + naive_window_epoch(1)
  with pytest.raises(ValueError, match=r"^lane 3 of 3 lanes: must be in \[0, 3\)$"):
    order.window_slots(0, 5, 3, 3)


def test_records_of_one_example_and_no_shuffle_keep_the_record_order():
  one = data.Manifest("/d", MANIFEST.schema, (data.ShardInfo("x", 7, 7),), 1)
  for manifest, shuffle in ((one, True), (MANIFEST, False)):
    order = T.ExampleOrder(manifest, shuffle=shuffle, seed=9, window=W)
    assert not order.shuffles_examples
    plain = T.ExampleOrder(manifest, shuffle=shuffle, seed=9)
    assert expand(order.locate(0, 7)) == expand(plain.locate(0, 7))
  with pytest.raises(ValueError, match=r"^shuffle window=-1 records must be >= 0$"):
    T.ExampleOrder(MANIFEST, shuffle=True, window=-1)


def test_permute_streams_are_other_permutations_and_stream_0_is_the_original():
  n = 1000
  base = T.permute(np.arange(n), n, seed=3, epoch=2)
  np.testing.assert_array_equal(T.permute(np.arange(n), n, seed=3, epoch=2, stream=0), base)
  one = T.permute(np.arange(n), n, seed=3, epoch=2, stream=1)
  assert sorted(one.tolist()) == list(range(n))
  assert np.mean(one == base) < 0.02
  assert np.mean(one == T.permute(np.arange(n), n, seed=3, epoch=2, stream=2)) < 0.02

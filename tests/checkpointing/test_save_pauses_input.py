"""An asynchronous save holds the data iterator's read-ahead while the loop waits.

Orbax starts about a dozen threads in save(); while read-ahead threads run
Python each start waits for the GIL (benchmarks/checkpoint.py: a save right
after a fresh iterator's first batch blocked 6-9x longer). The save pauses
an InputIterator's read-ahead (read_ahead_paused) and the batches stay the
same.
"""

import threading
import time

import grain
import numpy as np
import pytest

import checkpoint_toy as toy
from sparsepipe.checkpointing import CheckpointItems
from sparsepipe.checkpointing import LoopPosition
from sparsepipe.checkpointing import RunInfo
from sparsepipe.checkpointing import TrainingCheckpointManager
from sparsepipe.core import SparseDenseMatmulInputStats
from sparsepipe.transforms import InputIterator
from sparsepipe.transforms import PreprocessedBatch

NO_STATS = SparseDenseMatmulInputStats({}, {})
AHEAD = 6  # batches read ahead, by one thread
SLOW_S = 0.1  # per batch: the read-ahead (0.6 s) is still busy when the save starts


class Started:
  """The batch indices whose computation started, in order."""

  def __init__(self):
    self.indices = []
    self.lock = threading.Lock()

  def __call__(self, index):
    with self.lock:
      self.indices.append(int(index))
    time.sleep(SLOW_S)
    return PreprocessedBatch(np.full(4, index, np.int64), NO_STATS)

  def count(self):
    with self.lock:
      return len(self.indices)

  def wait_for_more_than(self, count, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while self.count() <= count and time.monotonic() < deadline:
      time.sleep(0.005)
    return self.count()


class WatchedIterator(InputIterator):
  """Records, at its first get_state (inside save), the batches started at
  that moment and 0.2 s later (or, `wait_for_more`, once one more started)."""

  def __init__(self, started, wait_for_more=False):
    options = grain.ReadOptions(num_threads=1, prefetch_buffer_size=AHEAD)
    super().__init__(
      grain.MapDataset.range(1000).map(started),
      lambda ds: ds.to_iter_dataset(options),
      place=None,
      metadata={"test": "pause"},
      output=lambda element: element.batch,
    )
    self.started = started
    self.wait_for_more = wait_for_more
    self.seen = None

  def get_state(self):
    if self.seen is None:
      before = self.started.count()
      if self.wait_for_more:
        after = self.started.wait_for_more_than(before)
      else:
        time.sleep(0.2)
        after = self.started.count()
      self.seen = (before, after)
    return super().get_state()


def _save(tmp_path, iterator, async_save):
  mesh = toy.make_mesh()
  state = toy.init_state(mesh, 4)
  run = RunInfo.create({"test": "pause"}, mesh, data_worker_count=0)
  with TrainingCheckpointManager(tmp_path / "c", run, async_save=async_save) as manager:
    assert manager.save(1, CheckpointItems(*state, iterator, {}), LoopPosition(1, 1), force=True)


def test_async_save_pauses_the_read_ahead_and_the_batches_are_unchanged(tmp_path):
  started = Started()
  iterator = WatchedIterator(started)
  np.testing.assert_array_equal(next(iterator), [0, 0, 0, 0])
  assert started.count() < AHEAD + 1  # still reading ahead
  _save(tmp_path, iterator, async_save=True)
  before, after = iterator.seen
  assert after == before  # no batch started while the loop waited
  assert started.wait_for_more_than(after) > after  # resumed after save()
  for index in range(1, 2 * AHEAD):
    np.testing.assert_array_equal(next(iterator), [index] * 4)
  assert started.indices[: 2 * AHEAD] == list(range(2 * AHEAD))
  iterator.close()


def test_sync_save_leaves_the_read_ahead_running(tmp_path):
  # It fills its buffer while the files are written.
  started = Started()
  iterator = WatchedIterator(started, wait_for_more=True)
  next(iterator)
  _save(tmp_path, iterator, async_save=False)
  before, after = iterator.seen
  assert after > before
  iterator.close()


def test_a_batch_asked_for_while_paused_raises_and_later_ones_are_unchanged():
  started = Started()
  iterator = WatchedIterator(started)
  next(iterator)
  with iterator.read_ahead_paused():
    with iterator.read_ahead_paused():  # nested: the outer block resumes
      pass
    with pytest.raises(
      RuntimeError, match=r"^next batch \(1\) asked for inside read_ahead_paused\(\)$"
    ):
      next(iterator)
  np.testing.assert_array_equal(next(iterator), [1, 1, 1, 1])
  np.testing.assert_array_equal(next(iterator), [2, 2, 2, 2])
  iterator.close()

"""The input's workers start at `start_prefetch`, before the first batch is asked for, all
together; and they stop together."""

import atexit
import os
import sys
import time

import datasets
import jax
import numpy as np
from sparsepipe import data
from sparsepipe import transforms as T

S = 2
FEATURES = (data.SyntheticFeature("a", 40, 1, 3), data.SyntheticFeature("b", 24, 0, 4))
_DIR_ENV = "SPARSEPIPE_TEST_WORKER_DIR"


def _write_whole(name, text):
  """Writes `text` to `name` in the test's folder, whole once the name exists (the
  test waits for the name: it read an empty file once, in CI)."""
  path = os.path.join(os.environ[_DIR_ENV], name)
  with open(f"{path}.tmp", "w") as f:
    f.write(text)
  os.replace(f"{path}.tmp", path)


def _record_worker(worker_index, worker_count):
  """Runs in each worker: writes when it started and which modules it holds."""
  _write_whole(f"worker{worker_index}", " ".join(sorted(sys.modules)))


def _record_and_hold_worker(worker_index, worker_count):
  """Writes that it started, then holds its first batch until the file 'go' exists."""
  _record_worker(worker_index, worker_count)
  while not os.path.exists(os.path.join(os.environ[_DIR_ENV], "go")):
    time.sleep(0.05)


def _record_exit(worker_index, worker_count):
  """At the worker's exit: 3 s of teardown, recorded as 'start end' in exit<index>."""

  def record():
    start = time.time()
    time.sleep(3)
    _write_whole(f"exit{worker_index}", f"{start} {time.time()}")

  atexit.register(record)


def _wait_for(paths, seconds=300):
  deadline = time.monotonic() + seconds
  while not all(os.path.exists(p) for p in paths) and time.monotonic() < deadline:
    time.sleep(0.2)
  return [os.path.basename(p) for p in paths if os.path.exists(p)]


def _input_maker(tmp_path):
  """(num_workers, worker_init_fn) -> a host input over a small dataset in tmp_path."""
  path = str(tmp_path / "ds")
  datasets.write_numbered(path, FEATURES, 40, 4, max_records_per_shard=5)
  specs = datasets.feature_specs(FEATURES, 8, 1, S)

  def make(num_workers, worker_init_fn=None):
    config = T.InputConfig(path, 8, seed=3, num_sc_per_device=S, num_workers=num_workers)
    return T.make_host_input(
      config,
      specs,
      local_device_count=1,
      global_device_count=1,
      worker_init_fn=worker_init_fn,
      place=lambda batch: batch,
    )

  return make


def test_start_prefetch_starts_the_workers_before_the_first_batch(tmp_path, monkeypatch):
  monkeypatch.setenv(_DIR_ENV, str(tmp_path))
  # With a placement read ahead, as the train input has.
  iterator = _input_maker(tmp_path)(2, _record_worker)
  try:
    iterator.start_prefetch()
    # No batch is asked for: the workers start on their own (they started
    # at the first batch before, after the job had made its state).
    names = ["worker0", "worker1"]
    assert _wait_for([tmp_path / n for n in names]) == names
    assert iterator.next_batch == 0
    # What the workers import: Grain itself imports jax and orbax (its
    # checkpoint handler), so they are there; the job's own layers are not.
    modules = set((tmp_path / "worker0").read_text().split())
    assert "sparsepipe.transforms" in modules
    assert not {"sparsepipe.pipeline", "sparsepipe.launch", "optax", "flax"} & modules
  finally:
    iterator.close()


def test_every_worker_starts_before_any_has_made_a_batch(tmp_path, monkeypatch):
  """Grain started worker k+1 only once worker k had handed over its first batch:
  12 workers took about 40 s to all run. Now they start together; the batches
  are those of a run without workers."""
  monkeypatch.setenv(_DIR_ENV, str(tmp_path))
  make = _input_maker(tmp_path)
  iterator = make(3, _record_and_hold_worker)
  try:
    iterator.start_prefetch()
    names = ["worker0", "worker1", "worker2"]
    # Every worker holds its first batch: all three run only if they started together.
    started = _wait_for([tmp_path / n for n in names])
    (tmp_path / "go").touch()
    assert started == names
    batches = [next(iterator) for _ in range(6)]
  finally:
    (tmp_path / "go").touch()  # a held worker would keep close() waiting
    iterator.close()
  reference = make(0)
  expected = [next(reference) for _ in range(6)]
  reference.close()
  for got, want in zip(batches, expected):
    got_leaves, want_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(got_leaves) == len(want_leaves) > 0
    for g, w in zip(got_leaves, want_leaves):
      np.testing.assert_array_equal(g, w)


def test_closing_stops_the_workers_side_by_side(tmp_path, monkeypatch):
  """Grain told a worker to stop only once the one before had exited (about 1 s each,
  9 s after the last batch with 12 workers): the workers' exits now overlap."""
  monkeypatch.setenv(_DIR_ENV, str(tmp_path))
  iterator = _input_maker(tmp_path)(3, _record_exit)
  try:
    for _ in range(3):
      next(iterator)
  finally:
    iterator.close()
  exits = [(tmp_path / f"exit{i}").read_text().split() for i in range(3)]
  starts, ends = [float(s) for s, _ in exits], [float(e) for _, e in exits]
  # Each exit takes 3 s: one after another, each would start after the one before ended.
  assert max(starts) < min(ends), exits

"""The input's workers start at `start_prefetch`, before the first batch is asked for."""

import os
import sys
import time

import datasets
from sparsepipe import data
from sparsepipe import transforms as T

S = 2
FEATURES = (data.SyntheticFeature("a", 40, 1, 3), data.SyntheticFeature("b", 24, 0, 4))
_DIR_ENV = "SPARSEPIPE_TEST_WORKER_DIR"


def _record_worker(worker_index, worker_count):
  """Runs in each worker: writes when it started and which modules it holds."""
  with open(os.path.join(os.environ[_DIR_ENV], f"worker{worker_index}"), "w") as f:
    f.write(" ".join(sorted(sys.modules)))


def test_start_prefetch_starts_the_workers_before_the_first_batch(tmp_path, monkeypatch):
  path = str(tmp_path / "ds")
  datasets.write_numbered(path, FEATURES, 40, 4, max_records_per_shard=5)
  monkeypatch.setenv(_DIR_ENV, str(tmp_path))
  iterator = T.make_host_input(
    T.InputConfig(path, 8, seed=3, num_sc_per_device=S, num_workers=2),
    datasets.feature_specs(FEATURES, 8, 1, S),
    local_device_count=1,
    global_device_count=1,
    worker_init_fn=_record_worker,
    place=lambda batch: batch,  # with a placement read ahead, as the train input has
  )
  try:
    iterator.start_prefetch()
    # No batch is asked for: the workers start on their own (they started
    # at the first batch before, after the job had made its state).
    deadline = time.monotonic() + 300
    names = ["worker0", "worker1"]
    while not all(os.path.exists(tmp_path / n) for n in names) and time.monotonic() < deadline:
      time.sleep(0.2)
    assert all(os.path.exists(tmp_path / n) for n in names)
    assert iterator.next_batch == 0
    # What the workers import: Grain itself imports jax and orbax (its
    # checkpoint handler), so they are there; the job's own layers are not.
    modules = set((tmp_path / "worker0").read_text().split())
    assert "sparsepipe.transforms" in modules
    assert not {"sparsepipe.pipeline", "sparsepipe.launch", "optax", "flax"} & modules
  finally:
    iterator.close()

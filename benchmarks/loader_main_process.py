"""The main process's CPU time per batch of the criteo config: receive + place.

Section (f) of benchmarks/loader.py (which runs it); alone:

    python benchmarks/loader_main_process.py [--devices 1,8] [--workers 0,2]
        [--seconds 6] [--json out.json]

The training input at the shipped criteo config's shape (batch 4096, 26
features of one id, 13 dense, its vocabularies, COO limits and SparseCores
per device) is run as the job runs it (pipeline.make_train_input: data
workers, placement on the mesh, label check) on N CPU devices, each device
count in its own process (XLA_FLAGS). Reported per batch, in CPU-ms:
  - the main process's Python threads except the read-ahead ones (Grain's
    'grain-prefetch' threads, which without workers read and preprocess:
    the workers' work otherwise): receiving the batch from a worker, its
    placement, the iterator's bookkeeping;
  - with workers, the whole main process: that, plus the runtime's native
    threads (on CPU devices the devices' own work on the batch, e.g. the
    placed buffer's transfer; the job's train step splits it in its own
    program, not timed here; without workers this would hold the
    preprocessing's compiled passes and the record reads too, so it is
    left out).
After 3 batches (start-up and compiling), only batches taken from full
buffers are timed: bursts after pauses in which the workers fill them, up
to the first batch that waits for them (the main process's polling while
it waits for slow workers is CPU per second, not per batch).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sparsepipe import core  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe import data  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.launch.config import packing  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.launch.config import config_specs  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.launch.config.shipped import criteo  # pylint: disable=g-import-not-at-top,wrong-import-position
import outputs  # pylint: disable=g-import-not-at-top,wrong-import-position

_WARM_BATCHES = 3
_FILL_SECONDS = 2.0  # a pause in which the buffers fill
_WAITED = 0.02  # a batch that took longer waited for the workers
_MAX_PAUSES = 20


def _python_thread_cpu_seconds() -> dict[int, float]:
  """CPU time of each Python thread of this process but the read-ahead ones
  (Grain names them 'grain-prefetch...'), by thread id."""
  times = {}
  for thread in threading.enumerate():
    if not thread.name.startswith("grain-prefetch") and thread.ident is not None:
      try:
        times[thread.ident] = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
      except OSError:  # the thread ended meanwhile
        pass
  return times


def _since(before: dict[int, float]) -> float:
  now = _python_thread_cpu_seconds()
  return sum(t - before.get(ident, 0.0) for ident, t in now.items())


def _buffered_bursts(it, seconds: float) -> tuple[int, float, float, float]:
  """(batches, Python-thread CPU s, process CPU s, wall s) of batches taken from full buffers.

  On a loaded machine a batch takes the workers 100+ ms, and the main
  process's threads poll their queues meanwhile: CPU per wall second, not
  per batch. So the buffers (workers', read-ahead, placement) fill during a
  pause, then batches are taken until one has to wait (over 20 ms: not
  counted), and only those bursts are timed.
  """
  import jax  # pylint: disable=g-import-not-at-top

  n, threads, process, wall = 0, 0.0, 0.0, 0.0
  end = time.perf_counter() + seconds
  for _ in range(_MAX_PAUSES):
    if time.perf_counter() > end and n >= 5:
      break
    time.sleep(_FILL_SECONDS)
    while True:
      start, t0, p0 = time.perf_counter(), _python_thread_cpu_seconds(), time.process_time()
      jax.block_until_ready(next(it))
      took = time.perf_counter() - start
      if took > _WAITED:
        break
      threads, process = threads + _since(t0), process + time.process_time() - p0
      wall, n = wall + took, n + 1
  return n, threads, process, wall


def probe(data_dir: str, workers: list[int], seconds: float) -> list[dict]:
  """(f) on this process's devices: one row per worker count."""
  import jax  # pylint: disable=g-import-not-at-top

  from sparsepipe import pipeline  # pylint: disable=g-import-not-at-top

  config = criteo.get_config()
  devices = jax.device_count()
  mesh = core.make_mesh()
  specs = config_specs.build_feature_specs(
    config, global_batch_size=config.global_batch_size, global_device_count=devices
  )
  rows = []
  for w in workers:
    input_config = dataclasses.replace(
      config_specs.input_config(config, data_dir, 1), num_workers=w
    )
    it = pipeline.make_train_input(input_config, specs, mesh, label_range=(0.0, 1.0))
    for _ in range(_WARM_BATCHES):
      jax.block_until_ready(next(it))
    n, threads, process, wall = _buffered_bursts(it, seconds)
    it.close()
    rows.append(
      {
        "devices": devices,
        "workers": w,
        "batches": n,
        "python_threads_cpu_ms_per_batch": 1e3 * threads / max(n, 1),
        "process_cpu_ms_per_batch": 1e3 * process / max(n, 1),
        "burst_wall_ms_per_batch": 1e3 * wall / max(n, 1),
      }
    )
  return rows


def generate(directory: str, num_examples: int) -> str:
  """A synthetic dataset of the criteo config's features (its records' packing)."""
  config = criteo.get_config()
  features = [
    data.SyntheticFeature(
      name, int(f.vocab_size), min_ids=1, max_ids=1, zipf_exponent=float(f.zipf_exponent)
    )
    for name, f in config.features.items()
  ]
  data.write_synthetic(
    directory,
    features,
    num_examples=num_examples,
    num_dense=int(config.synthetic.num_dense),
    seed=0,
    # The default (0) is a new job's packing, as the launcher resolves it.
    examples_per_record=packing.examples_per_record(config.synthetic.examples_per_record),
  )
  return directory


def measure(data_dir: str, devices: list[int], workers: list[int], seconds: float) -> list[dict]:
  """(f) for every device count, each in a fresh process with that many CPU devices."""
  rows = []
  for n in devices:
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={n}"}
    command = [
      sys.executable,
      os.path.abspath(__file__),
      f"--data_dir={data_dir}",
      f"--workers={','.join(map(str, workers))}",
      f"--seconds={seconds}",
      "--probe",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
      raise RuntimeError(f"(f) on {n} devices failed:\n{done.stderr[-3000:]}")
    rows += json.loads(done.stdout.strip().splitlines()[-1])
  return rows


def print_rows(rows: list[dict]) -> None:
  print(
    "\n(f) main process per criteo batch (4096, 26 one-id features, 13 dense), CPU-ms:"
    " its Python threads but the read-ahead ones (receive + place + bookkeeping; goal"
    " <= 1 ms), and the whole process (with workers: that plus the runtime's threads,"
    " on CPU devices the devices' own work)"
  )
  print(
    f"{'devices':>8} {'workers':>8} {'Python threads':>15} {'whole process':>14}"
    f" {'burst wall ms':>14} {'batches':>8}"
  )
  for r in rows:
    whole = f"{r['process_cpu_ms_per_batch']:>14.3f}" if r["workers"] else f"{'-':>14}"
    print(
      f"{r['devices']:>8} {r['workers']:>8} {r['python_threads_cpu_ms_per_batch']:>15.3f}"
      f" {whole} {r['burst_wall_ms_per_batch']:>14.2f} {r['batches']:>8}"
    )


def main(argv):
  del argv
  workers = [int(w) for w in _WORKERS.value]
  if _PROBE.value:
    print(json.dumps(probe(_DATA.value, workers, _SECONDS.value)))
    return
  import tempfile  # pylint: disable=g-import-not-at-top

  with tempfile.TemporaryDirectory() as tmp:
    directory = _DATA.value or generate(os.path.join(tmp, "criteo"), _NUM_EXAMPLES.value)
    rows = measure(directory, [int(d) for d in _DEVICES.value], workers, _SECONDS.value)
  print_rows(rows)
  if _JSON.value:
    outputs.write(_JSON.value, {"benchmark": "loader_main_process", "rows": rows})


if __name__ == "__main__":
  # Here, not at import: benchmarks/loader.py imports this module and has flags of these names.
  _DATA = flags.DEFINE_string("data_dir", None, "Dataset (default: generate one).")
  _DEVICES = flags.DEFINE_list("devices", ["1", "8"], "CPU device counts.")
  _WORKERS = flags.DEFINE_list("workers", ["0", "2"], "Worker counts.")
  _SECONDS = flags.DEFINE_float("seconds", 6.0, "Measuring time per row.")
  _NUM_EXAMPLES = flags.DEFINE_integer("num_examples", 65536, "Examples to generate.")
  _PROBE = flags.DEFINE_bool("probe", False, "Measure on this process's devices, print JSON.")
  _JSON = outputs.json_flag("Write the rows to this JSON file.")
  app.run(main)

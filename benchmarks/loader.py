"""Input pipeline throughput on a Criteo-shaped synthetic dataset.

    python benchmarks/loader.py [--json out.json] [--workers 0,2] [--seconds 6]
        [--packing 1,128]

Measures examples/s of
  (a) raw record reads (the pipeline's shuffled record order, ExampleOrder,
      one batched source read per batch, bytes dropped),
  (b) decode + batch (make_example_batches: batched reads, bulk decode),
  (c) the full host pipeline (make_host_input) with COO preprocessing and
      stats recording,
each with every worker count in --workers, and reports (c)/(a) per worker
count. The dataset has 13 dense and 26 sparse features of 1..20 ids
(Zipf ids, vocabulary 100k: no shipped config, a heavier multi-id shape;
the criteo config has one id per feature), packed 128 examples per record
(--examples_per_record); the preprocessing limits come from an FDO pass
over a few batches (ids above them are dropped and counted, as in training
with allow_id_dropping). Worker start-up is excluded (the clock starts
after every worker's first batch). The machine may be shared: compare figures from
one run. "(c) cores busy" is CPU-seconds per wall second of (c), workers
included: the in-process pipeline already keeps more than one core busy
(its read-ahead threads run the compiled passes without the GIL), so on C
cores the wall speed-up of workers is at most C / that figure.

  (d) the cost per example (CPU-microseconds) of (a), (b) and (c) at 0
      workers on the same examples written with each --packing (examples
      per record; the shipped configs generated records of 1 up to 0.3),
      with the ratio of (c) to the largest packing. Records of one example pay
      ArrayRecord's per-record read (each record is its own chunk, group_size
      1): (a) of 1 per record is that floor. The writer compresses chunks of
      small records with snappy (data/writer.py); the row "1, zstd" reads
      the same records rewritten as zstd chunks, as 0.2 wrote them.
  (e) the example shuffle (data.shuffle_window) at the criteo config's
      shape (26 features of one id, its vocabularies and batch): (c)'s
      CPU-microseconds per example, at 0 and 2 workers (none and the
      shipped config's, whatever --workers says), for records of 1
      (what the criteo config generated up to 0.3), records of 128 shuffled
      as whole records (shuffle_window 0) and records of 128 with the
      example shuffle over windows of --shuffle_window records (a new job's
      default now); ratios to the records-only packed row (issue 27's goal
      for a shipped window: <= 1.2).
      Every row's clock starts after WINDOW_LANES (8) batches, once each
      lane of the window rows has decoded its first window.
  (f) the main process's CPU time per batch of the shipped criteo config
      (batch 4096, 26 features of one id, 13 dense) on 1 and 8 CPU devices
      (--main_process_devices, each in a subprocess), with 0 and 2 workers
      (as (e), whatever --workers says):
      receiving the batch, placing it on the devices, the iterator's
      bookkeeping (benchmarks/loader_main_process.py, which runs it alone).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sys
import tempfile
import time

from absl import app
from absl import flags
import grain
import numpy as np
from array_record.python import array_record_module

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sparsepipe import core
from sparsepipe import data  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe import transforms as T  # pylint: disable=g-import-not-at-top,wrong-import-position
import loader_main_process  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.launch.config.shipped import criteo as criteo_config  # pylint: disable=g-import-not-at-top,wrong-import-position
import outputs  # pylint: disable=g-import-not-at-top,wrong-import-position

_DATA_DIR = flags.DEFINE_string(
  "data_dir", None, "Existing dataset; default: generate one in a temp dir."
)
_NUM_EXAMPLES = flags.DEFINE_integer("num_examples", 200_000, "Examples to generate.")
_PER_RECORD = flags.DEFINE_integer("examples_per_record", 128, "Examples packed per record.")
_VOCAB = flags.DEFINE_integer("vocab_size", 100_000, "Vocabulary of every sparse feature.")
_BATCH = flags.DEFINE_integer("batch_size", 4096, "Per-host batch size.")
_DEVICES = flags.DEFINE_integer(
  "devices", 8, "Local (= global) devices the COO buffers are made for."
)
_SC = flags.DEFINE_integer("num_sc_per_device", 2, "SparseCores per device.")
_WORKERS = flags.DEFINE_list(
  "workers", ["0", "2"], "Worker counts of (a), (b), (c) ((e) and (f) run 0 and 2)."
)
_SECONDS = flags.DEFINE_float("seconds", 6.0, "Measuring time per stage.")
_PACKING = flags.DEFINE_list(
  "packing", ["1", "128"], "Examples per record compared in (d) (generated data only)."
)
_JSON = outputs.json_flag()
_MAIN_DEVICES = flags.DEFINE_list(
  "main_process_devices", ["1", "8"], "CPU device counts of (f) (empty: no (f))."
)
_WINDOW = flags.DEFINE_integer("shuffle_window", 256, "Records per example-shuffle window in (e).")


def _cpu_seconds() -> float:
  """CPU time of this process and its live children (the Grain workers)."""
  total = time.process_time()
  tick = os.sysconf("SC_CLK_TCK")
  for child in multiprocessing.active_children():
    try:
      with open(f"/proc/{child.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
      total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    except (OSError, IndexError, ValueError):
      pass
  return total


def _rate(it, examples_per_element, seconds, warmup=1):
  """(examples per wall second, examples per CPU second) after every worker's first element.

  Grain hands worker j of N the elements j, j+N, ...: the clock starts once
  elements 0..N-1 are in, so no worker's start-up (imports, numba compiling
  the COO passes: seconds of CPU each) is counted. Started after element 0
  only, a late worker's start-up fell into a few seconds' measurement.
  `warmup`: elements read before the clock starts (at least 1).
  """
  for _ in range(max(1, warmup)):
    next(it)
  start, cpu = time.perf_counter(), _cpu_seconds()
  n = 0
  while time.perf_counter() - start < seconds:
    next(it)
    n += 1
  elapsed, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
  return n * examples_per_element / elapsed, n * examples_per_element / max(cpu, 1e-9)


def _mp(ds, workers):
  return T.prefetch_in_workers(ds, workers)


class _ReadBatch(grain.transforms.Map):
  """Global batch index -> the total size of its records, read as the pipeline reads them."""

  def __init__(self, manifest, batch_size):
    self.order = T.ExampleOrder(manifest, shuffle=True, seed=0)
    self.source = data.manifest_source(manifest)
    self.batch_size = batch_size

  def map(self, k):
    run = self.order.locate(k * self.batch_size, (k + 1) * self.batch_size)
    return np.int64(sum(map(len, self.source.__getitems__(run.records.tolist()))))


def raw_reads(manifest, workers, seconds):
  """The pipeline's record order (ExampleOrder), one batched source read a batch, bytes dropped."""
  ds = grain.MapDataset.range(1 << 40).map(_ReadBatch(manifest, _BATCH.value))
  ds = _mp(ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)), workers)
  it = iter(ds)
  rate = _rate(it, _BATCH.value, seconds, workers)
  it.close()
  return rate


def decode_batch(manifest, workers, seconds):
  cfg = T.InputConfig(manifest.directory, _BATCH.value, num_workers=workers)
  batches = T.make_example_batches(cfg, process_index=0, process_count=1, manifest=manifest)
  ds = _mp(
    batches.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)), workers
  )
  it = iter(ds)
  rate = _rate(it, _BATCH.value, seconds, workers)
  it.close()
  return rate


def _specs(manifest, devices):
  specs = {}
  for f in manifest.schema.sparse:
    table = core.TableSpec(
      f.name.lower(),
      f.vocab_size,
      16,
      combiner="sum",
      max_ids_per_partition=4096,
      max_unique_ids_per_partition=4096,
    )
    specs[f.name] = core.FeatureSpec(f.name, table, (_BATCH.value, 20), (_BATCH.value, 16))
  specs = T.prepare_feature_specs_for_training(specs, devices, _SC.value)
  # FDO: limits from a few batches, as training would derive them.
  warm = T.make_host_input(
    T.InputConfig(manifest.directory, _BATCH.value, seed=1, num_sc_per_device=_SC.value),
    specs,
    local_device_count=devices,
    global_device_count=devices,
    process_index=0,
    process_count=1,
  )
  for _ in range(4):
    next(warm)
  stats = warm.stats_totals().as_stats()
  warm.close()
  return T.update_preprocessing_parameters(specs, stats, _SC.value, devices)


def full_pipeline(manifest, specs, workers, seconds, warmup=1, **config):
  cfg = T.InputConfig(
    manifest.directory,
    _BATCH.value,
    num_workers=workers,
    num_sc_per_device=_SC.value,
    allow_id_dropping=True,
    **config,
  )
  it = T.make_host_input(
    cfg,
    specs,
    local_device_count=_DEVICES.value,
    global_device_count=_DEVICES.value,
    process_index=0,
    process_count=1,
  )
  rate = _rate(it, _BATCH.value, seconds, max(workers, warmup))
  totals = it.stats_totals()
  it.close()
  return rate, sum(totals.id_drops.values())


def _generate(directory, examples_per_record):
  """The benchmark's dataset: the same examples (same seed) whatever the packing."""
  start = time.perf_counter()
  manifest = data.write_synthetic(
    directory,
    data.criteo_like_features(26, _VOCAB.value, min_ids=1, max_ids=20),
    num_examples=_NUM_EXAMPLES.value,
    num_dense=13,
    seed=0,
    examples_per_record=examples_per_record,
  )
  print(
    f"generated {manifest.num_examples:,} examples ({manifest.num_records:,} records of"
    f" {manifest.examples_per_record}, {len(manifest.shards)} shards) in"
    f" {time.perf_counter() - start:.1f} s",
    file=sys.stderr,
  )
  return manifest


def _rewrite_zstd(manifest, directory):
  """The dataset copied with every record a zstd chunk (0.2's writer options)."""
  os.makedirs(directory)
  shutil.copy(os.path.join(manifest.directory, data.MANIFEST_NAME), directory)
  source = data.manifest_source(manifest)
  start = 0
  for path, shard in zip(manifest.shard_paths(), manifest.shards):
    writer = array_record_module.ArrayRecordWriter(
      os.path.join(directory, os.path.basename(path)), "group_size:1"
    )
    for record in source.__getitems__(range(start, start + shard.num_records)):
      writer.write(record)
    writer.close()
    start += shard.num_records
  return data.read_manifest(directory)


def _worker_rows(manifest, specs, seconds):
  """(a), (b), (c) with every worker count in --workers."""
  rows = []
  for w in (int(x) for x in _WORKERS.value):
    a = raw_reads(manifest, w, seconds)
    b = decode_batch(manifest, w, seconds)
    c, drops = full_pipeline(manifest, specs, w, seconds)
    rows.append(
      {
        "workers": w,
        "raw_reads": a[0],
        "decode_batch": b[0],
        "full_pipeline": c[0],
        "full_over_raw": c[0] / a[0],
        "raw_reads_per_cpu_s": a[1],
        "decode_batch_per_cpu_s": b[1],
        "full_pipeline_per_cpu_s": c[1],
        # CPU-seconds per wall second: the cores (c) kept busy, workers included.
        "full_pipeline_cores_busy": c[0] / c[1],
        "ids_dropped": drops,
      }
    )
  return rows


def _print_worker_rows(manifest, rows):
  print(
    f"\nloader: batch {_BATCH.value}, {manifest.examples_per_record} examples/record,"
    f" {_DEVICES.value} devices x {_SC.value} SC, {os.cpu_count()} cores (examples/s)"
  )
  print(
    f"{'workers':>8} {'(a) raw reads':>15} {'(b) decode+batch':>17} {'(c) full':>12}"
    f" {'(c)/(a)':>8}   per CPU-second: {'(a)':>9} {'(b)':>9} {'(c)':>9}"
    f"   (c) cores busy"
  )
  for r in rows:
    print(
      f"{r['workers']:>8} {r['raw_reads']:>15,.0f} {r['decode_batch']:>17,.0f}"
      f" {r['full_pipeline']:>12,.0f} {r['full_over_raw']:>8.3f}"
      f"   {'':>15} {r['raw_reads_per_cpu_s']:>9,.0f} {r['decode_batch_per_cpu_s']:>9,.0f}"
      f" {r['full_pipeline_per_cpu_s']:>9,.0f}   {r['full_pipeline_cores_busy']:>14.2f}"
    )


def _packing_rows(manifest, specs, tmp, seconds):
  """(d): CPU-microseconds per example of (a), (b), (c) at 0 workers, per --packing value.

  The same examples written as records of each packing (the main dataset is
  reused for its own); one set of COO limits (the main dataset's), so only
  the packing differs. Ratios are to the largest packing.
  """
  datasets = []
  for r in sorted({int(x) for x in _PACKING.value}):
    m = manifest
    if r != manifest.examples_per_record:
      m = _generate(os.path.join(tmp, f"criteo_like_r{r}"), r)
    if r == 1:
      datasets.append(("1, zstd", _rewrite_zstd(m, os.path.join(tmp, "criteo_like_r1_zstd"))))
    datasets.append((str(r), m))
  rows = []
  for label, m in datasets:
    a = raw_reads(m, 0, seconds)
    b = decode_batch(m, 0, seconds)
    c, _ = full_pipeline(m, specs, 0, seconds)
    rows.append(
      {
        "examples_per_record": m.examples_per_record,
        "records": label,
        "raw_reads_cpu_us": 1e6 / a[1],
        "decode_batch_cpu_us": 1e6 / b[1],
        "full_pipeline_cpu_us": 1e6 / c[1],
        "full_pipeline_wall": c[0],
      }
    )
  last = rows[-1]
  for row in rows:
    row["full_pipeline_ratio"] = row["full_pipeline_cpu_us"] / last["full_pipeline_cpu_us"]
  print(
    f"\n(d) cost per example by packing: the same {manifest.num_examples:,} examples, 0 workers,"
    f" CPU-microseconds per example (ratio to {last['examples_per_record']} per record;"
    " goal for (c): <= 1.5)"
  )
  print(
    f"{'ex/record':>10} {'(a) raw reads':>14} {'(b) decode+batch':>17} {'(c) full':>9}"
    f" {'(c) ratio':>10} {'(c) examples/s':>15}"
  )
  for row in rows:
    print(
      f"{row['records']:>10} {row['raw_reads_cpu_us']:>14.2f}"
      f" {row['decode_batch_cpu_us']:>17.2f} {row['full_pipeline_cpu_us']:>9.2f}"
      f" {row['full_pipeline_ratio']:>10.2f} {row['full_pipeline_wall']:>15,.0f}"
    )
  return rows


def _shuffle_rows(tmp, seconds):
  """(e): the criteo config's shape, records of 1 and of 128, records-only and example shuffle."""
  features = data.criteo_like_features(
    26, list(criteo_config.VOCAB_SIZES), min_ids=1, max_ids=1, zipf_exponent=1.05
  )
  cases = [("1", 1, 0), ("128, records only", 128, 0), (f"128, window {_WINDOW.value}", 128, None)]
  manifests = {}
  for r in (1, 128):
    directory = os.path.join(tmp, f"criteo_r{r}")
    manifests[r] = data.write_synthetic(
      directory,
      features,
      num_examples=_NUM_EXAMPLES.value,
      num_dense=13,
      seed=0,
      examples_per_record=r,
    )
  specs = _specs(manifests[128], _DEVICES.value)
  rows = []
  for label, r, window in cases:
    row = {"records": label, "examples_per_record": r}
    for w in (0, 2):
      window_kw = {"shuffle_window": _WINDOW.value if window is None else window}
      # Every row starts the clock after WINDOW_LANES batches: the window rows'
      # lanes have then each decoded their first window (a start-up cost, once).
      (wall, per_cpu), _ = full_pipeline(
        manifests[r], specs, w, seconds, warmup=T.WINDOW_LANES, **window_kw
      )
      row[f"cpu_us_{w}_workers"] = 1e6 / per_cpu
      row[f"examples_per_s_{w}_workers"] = wall
    rows.append(row)
  base = rows[1]
  for row in rows:
    for w in (0, 2):
      row[f"ratio_{w}_workers"] = row[f"cpu_us_{w}_workers"] / base[f"cpu_us_{w}_workers"]
  print(
    f"\n(e) example shuffle, criteo config shape (26 x 1 id, batch {_BATCH.value}),"
    " (c) CPU-microseconds per example (ratio to 128 records only; goal for the window: <= 1.2)"
  )
  print(f"{'records':>22} {'0 workers':>10} {'ratio':>6} {'2 workers':>10} {'ratio':>6}")
  for row in rows:
    print(
      f"{row['records']:>22} {row['cpu_us_0_workers']:>10.2f} {row['ratio_0_workers']:>6.2f}"
      f" {row['cpu_us_2_workers']:>10.2f} {row['ratio_2_workers']:>6.2f}"
    )
  return rows


def _main_process_rows(tmp, seconds):
  """(f): the main process's CPU per criteo batch, 0 and 2 workers, per device count."""
  if not _MAIN_DEVICES.value:
    return []
  directory = loader_main_process.generate(
    os.path.join(tmp, "criteo_main_process"), min(_NUM_EXAMPLES.value, 65536)
  )
  devices = [int(d) for d in _MAIN_DEVICES.value]
  rows = loader_main_process.measure(directory, devices, [0, 2], seconds)
  loader_main_process.print_rows(rows)
  return rows


def main(argv):
  del argv
  tmp = tempfile.TemporaryDirectory()
  if _DATA_DIR.value:
    manifest = data.read_manifest(_DATA_DIR.value)
  else:
    manifest = _generate(os.path.join(tmp.name, "criteo_like"), _PER_RECORD.value)
  specs = _specs(manifest, _DEVICES.value)
  seconds = _SECONDS.value
  rows = _worker_rows(manifest, specs, seconds)
  _print_worker_rows(manifest, rows)
  packing = [] if _DATA_DIR.value else _packing_rows(manifest, specs, tmp.name, seconds)
  shuffle = [] if _DATA_DIR.value else _shuffle_rows(tmp.name, seconds)
  main_process = _main_process_rows(tmp.name, seconds)
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
  print(
    f"load average at the end: {load:.1f} (a shared machine makes wall figures noisy;"
    " per-CPU-second figures are steadier)"
  )
  if _JSON.value:
    result = {
      "benchmark": "loader",
      "batch_size": _BATCH.value,
      "examples_per_record": manifest.examples_per_record,
      "num_examples": manifest.num_examples,
      "devices": _DEVICES.value,
      "num_sc_per_device": _SC.value,
      "cpu_count": os.cpu_count(),
      "seconds_per_stage": seconds,
      "load_average_end": load,
      "rows": rows,
      "packing": packing,
      "main_process": main_process,
      "example_shuffle": shuffle,
    }
    outputs.write(_JSON.value, result)
  tmp.cleanup()


if __name__ == "__main__":
  app.run(main)

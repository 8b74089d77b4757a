"""Input pipeline throughput on a Criteo-shaped synthetic dataset.

    python benchmarks/loader.py [--json out.json] [--workers 0,2] [--seconds 6]

Measures examples/s of
  (a) raw record reads (the pipeline's shuffled record order, batched
      ArrayRecord reads, bytes dropped),
  (b) decode + batch (DecodeBatchIterDataset: batched reads, bulk decode),
  (c) the full host pipeline with COO preprocessing and stats recording,
each with every worker count in --workers, and reports (c)/(a) per worker
count. The dataset has 13 dense and 26 sparse features of 1..20 ids
(Zipf ids); the preprocessing limits come from an FDO pass over a few
batches (ids above them are dropped and counted, as in training with
allow_id_dropping). Worker start-up is excluded (the clock starts after the
first batch). The machine may be shared: compare figures from one run.
"(c) cores busy" is CPU-seconds per wall second of (c), workers included:
the in-process pipeline already keeps more than one core busy (its read-ahead
threads run the compiled passes without the GIL), so on C cores the wall
speed-up of workers is at most C / that figure.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import tempfile
import time

from absl import app
from absl import flags
import grain
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sparsepipe import core
from sparsepipe import data  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe import transforms as T  # pylint: disable=g-import-not-at-top,wrong-import-position

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
_WORKERS = flags.DEFINE_list("workers", ["0", "2"], "Worker counts to measure.")
_SECONDS = flags.DEFINE_float("seconds", 6.0, "Measuring time per stage.")
_JSON = flags.DEFINE_string("json", None, "Write the figures to this JSON file.")


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


def _rate(it, examples_per_element, seconds):
  """(examples per wall second, examples per CPU second) after the first element."""
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


class _ReadGroup(grain.transforms.Map):
  """Reads a group of records in one batched source call; keeps only their size."""

  def __init__(self, source):
    self.source = source

  def map(self, indices):
    records = self.source.__getitems__([int(i) % len(self.source) for i in indices])
    return np.int64(sum(map(len, records)))


def raw_reads(manifest, workers, seconds):
  """The pipeline's record order, read with batched ArrayRecord reads, bytes dropped."""
  group = max(1, _BATCH.value // manifest.examples_per_record)
  indices = grain.MapDataset.range(manifest.num_records).seed(0).shuffle().repeat()
  ds = indices.batch(group, batch_fn=list).map(_ReadGroup(data.manifest_source(manifest)))
  ds = _mp(ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)), workers)
  it = iter(ds)
  rate = _rate(it, group * manifest.examples_per_record, seconds)
  it.close()
  return rate


def decode_batch(manifest, workers, seconds):
  cfg = T.InputConfig(manifest.directory, _BATCH.value, num_workers=workers)
  ds = _mp(
    T.make_example_dataset(cfg, process_index=0, process_count=1, manifest=manifest), workers
  )
  it = iter(ds)
  rate = _rate(it, _BATCH.value, seconds)
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
  warm = T.make_host_pipeline(
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


def full_pipeline(manifest, specs, workers, seconds):
  cfg = T.InputConfig(
    manifest.directory,
    _BATCH.value,
    num_workers=workers,
    num_sc_per_device=_SC.value,
    allow_id_dropping=True,
  )
  it = T.make_host_pipeline(
    cfg,
    specs,
    local_device_count=_DEVICES.value,
    global_device_count=_DEVICES.value,
    process_index=0,
    process_count=1,
  )
  rate = _rate(it, _BATCH.value, seconds)
  totals = it.stats_totals()
  it.close()
  return rate, sum(totals.id_drops.values())


def main(argv):
  del argv
  tmp = None
  if _DATA_DIR.value:
    manifest = data.read_manifest(_DATA_DIR.value)
  else:
    tmp = tempfile.TemporaryDirectory()
    start = time.perf_counter()
    manifest = data.write_synthetic(
      os.path.join(tmp.name, "criteo_like"),
      data.criteo_like_features(26, _VOCAB.value, min_ids=1, max_ids=20),
      num_examples=_NUM_EXAMPLES.value,
      num_dense=13,
      seed=0,
      examples_per_record=_PER_RECORD.value,
    )
    print(
      f"generated {manifest.num_examples:,} examples ({manifest.num_records:,} records of"
      f" {manifest.examples_per_record}, {len(manifest.shards)} shards) in"
      f" {time.perf_counter() - start:.1f} s",
      file=sys.stderr,
    )
  specs = _specs(manifest, _DEVICES.value)
  seconds = _SECONDS.value
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
      "load_average_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
      "rows": rows,
    }
    with open(_JSON.value, "w") as f:
      json.dump(result, f, indent=1)
  if tmp is not None:
    tmp.cleanup()


if __name__ == "__main__":
  app.run(main)

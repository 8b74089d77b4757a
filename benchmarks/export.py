"""Exports: time and size, delta size after 1, 10 and 100 batches, predictions per second.

    python benchmarks/export.py [--json out.json] [--vocab 200000] [--batch 2048]

A job of the shipped `demo` config's shape with larger tables (8 features
of `--vocab` rows, dim 16, Zipf(1.05) ids: a few rows are hot, most are
cold, as in click logs) trains through `train_and_evaluate` on this
machine's CPU devices. After a warm-up, a full export is taken (its time
and size); the job then trains 1, 10 and 100 more batches, and a delta
against the full export is taken after each (rows and bytes: what changed
grows with the rows touched, not with the tables). Predictions per second
use the Predictor (host lookup + the exported jax function on the CPU) at
batch 1 and 4096. Every figure comes from one run; the machine may be
shared.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

from absl import app
from absl import flags
from absl import logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sparsepipe import data  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe import serving  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.launch import train_and_evaluate  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.launch.config.base_config import base_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.launch.config.base_config import feature  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.launch.export import export_checkpoint  # pylint: disable=g-import-not-at-top,wrong-import-position
import outputs  # pylint: disable=g-import-not-at-top,wrong-import-position

_JSON = outputs.json_flag()
_VOCAB = flags.DEFINE_integer("vocab", 200_000, "Rows of each of the 8 tables.")
_BATCH = flags.DEFINE_integer("batch", 2048, "Global batch of the job.")
_WARMUP = flags.DEFINE_integer("warmup", 20, "Batches before the full export.")


def config(num_steps: int):
  cfg = base_config(
    (f"f{i}", feature(_VOCAB.value, max_ids=1 + i % 3, zipf_exponent=1.05)) for i in range(8)
  )
  cfg.num_steps = num_steps
  cfg.global_batch_size = _BATCH.value
  cfg.log_every_steps = 1000
  cfg.synthetic.num_examples = 1 << 18
  cfg.synthetic.num_dense = 4
  cfg.synthetic.records_per_shard = 1 << 14
  cfg.model.embedding_dim = 16
  cfg.checkpoint.every_steps = 1 << 20  # only the end of each run
  return cfg


def _bytes(directory: str) -> int:
  return sum(
    os.path.getsize(os.path.join(root, name))
    for root, _, names in os.walk(directory)
    for name in names
  )


def _rows(info) -> int:
  return sum(t["rows"] for t in info.tables.values())


def _predictions_per_second(predictor, examples, batch: int, seconds: float = 3.0) -> float:
  chunk = data.slice_batch(examples, 0, batch)
  predictor.predict(chunk)  # compile for this shape
  count, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    predictor.predict(chunk)
    count += batch
  return count / (time.perf_counter() - start)


def run(root: str) -> dict:
  workdir = os.path.join(root, "job")
  figures = {"vocab_per_table": _VOCAB.value, "tables": 8, "dim": 16, "batch": _BATCH.value}
  steps = _WARMUP.value
  train_and_evaluate(config(steps), workdir)
  start = time.perf_counter()
  full = export_checkpoint(workdir, os.path.join(root, "full"))
  figures["full_export_seconds"] = time.perf_counter() - start
  figures["full_rows"] = _rows(full)
  figures["full_bytes"] = _bytes(os.path.join(root, "full"))
  figures["deltas"] = []
  for more in (1, 10, 100):
    target = _WARMUP.value + more
    train_and_evaluate(config(target), workdir)
    directory = os.path.join(root, f"delta_{more}")
    start = time.perf_counter()
    delta = export_checkpoint(workdir, directory, since=os.path.join(root, "full"))
    figures["deltas"].append(
      {
        "batches_since_full": more,
        "rows": _rows(delta),
        "bytes": _bytes(directory),
        "rows_vs_full": _rows(delta) / figures["full_rows"],
        "bytes_vs_full": _bytes(directory) / figures["full_bytes"],
        "seconds": time.perf_counter() - start,
      }
    )
  predictor = serving.Predictor.load(os.path.join(root, "full"))
  manifest = data.read_manifest(os.path.join(workdir, "data"))
  examples = data.decode_batch(data.manifest_source(manifest)[0], manifest.schema)
  while examples.num_examples < 4096:
    examples = data.concat_batches([examples, examples])
  figures["predictions_per_second"] = {
    str(b): _predictions_per_second(predictor, examples, b) for b in (1, 4096)
  }
  return figures


def report(figures: dict) -> None:
  print(
    f"tables: 8 x {figures['vocab_per_table']:,} rows x dim 16; full export"
    f" {figures['full_rows']:,} rows, {figures['full_bytes'] / 2**20:.1f} MiB in"
    f" {figures['full_export_seconds']:.2f} s"
  )
  head = ("batches since full", "delta rows", "rows/full", "MiB", "bytes/full", "s")
  print("{:>20} {:>12} {:>10} {:>8} {:>10} {:>6}".format(*head))
  for d in figures["deltas"]:
    print(
      f"{d['batches_since_full']:>20} {d['rows']:>12,} {d['rows_vs_full']:>10.4f}"
      f" {d['bytes'] / 2**20:>8.2f} {d['bytes_vs_full']:>10.4f} {d['seconds']:>6.2f}"
    )
  for batch, rate in figures["predictions_per_second"].items():
    print(f"predictions/s at batch {batch}: {rate:,.0f}")


def main(argv) -> None:
  del argv
  logging.set_verbosity(logging.WARNING)
  with tempfile.TemporaryDirectory() as root:
    figures = run(root)
  report(figures)
  if _JSON.value:
    outputs.write(_JSON.value, figures, indent=2)


if __name__ == "__main__":
  app.run(main)

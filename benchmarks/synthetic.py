"""Synthetic data generation speed: a multi-id benchmark shape, and the shipped configs.

    python benchmarks/synthetic.py [--json out.json] [--num_examples 200000]
        [--shipped_examples 200000]

Part 1, the benchmark shape: 26 sparse features of 1..--max_ids ids (vocabulary
--vocab_size), 13 dense; no shipped config has it (it is benchmarks/loader.py's
dataset). Examples per CPU-second (steadier than wall time on a shared
machine) of
  (0) the baseline: numpy drawing just the uniforms the stream needs (one
      per id, dense value and label), the floor of any generator of it,
  (a) generation alone (`generate_batches`: ids, dense values, planted
      click probabilities, labels),
  (b) the true probabilities alone (`synthetic_click_probabilities` on the
      generated batches),
  (c) writing a dataset (`write_synthetic`: generation + record encoding +
      ArrayRecord writes) with the writer's default 128 examples per record,
and the Bayes AUC of the planted model (true probabilities vs. labels),
quoted as ratios to (0) within one run: the machine may be shared.

Part 2, what a shipped config generates before its first batch
(`launch.job.ensure_dataset`, exactly as the job calls it), examples per
wall second and per CPU-second:
  (d) --config=criteo (sparsepipe/launch/config/shipped/criteo.py) with
      records of ONE example, as it shipped up to 0.3
      (--config.synthetic.examples_per_record=1): 26 features of one id
      each, the Kaggle vocabularies capped at 2^20, Zipf exponent 1.05, 13
      dense values, 16384 records per shard; --shipped_examples examples
      (the config ships 2^20),
  (e) the same as shipped now: 128 examples per record (a new job's default),
  (f) ArrayRecord's own writes of (d)'s records, encoded beforehand, with
      the writer's options: the floor for records of one example (each
      record is one snappy-compressed chunk, group_size 1, a fixed cost
      per record),
  (f0) the same writes as zstd chunks, as 0.2 wrote them (data/writer.py
      says why small records are snappy chunks now),
  (g) --config=demo as shipped (4 features of 1, 1, 1..3 and 1..8 ids,
      4 dense, records of 128 examples, 16384 train and 4096 eval examples),
with the ratios (d)/(e) and (d)/(f) of examples per CPU-second.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before jax: no probing for a TPU backend

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags
import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from array_record.python import array_record_module
from sparsepipe import data
from sparsepipe.data.bulk_encode import encode_records
from sparsepipe.launch.config.shipped import criteo
from sparsepipe.launch.config.shipped import demo
from sparsepipe.launch.job.training_data import ensure_dataset
from sparsepipe.launch.job.training_data import synthetic_features
import outputs

_NUM_EXAMPLES = flags.DEFINE_integer("num_examples", 200_000, "Examples per part-1 measurement.")
_SHIPPED = flags.DEFINE_integer(
  "shipped_examples", 200_000, "Examples of (d), (e), (f) (the criteo config ships 1048576)."
)
_VOCAB = flags.DEFINE_integer("vocab_size", 100_000, "Vocabulary of every sparse feature.")
_MAX_IDS = flags.DEFINE_integer("max_ids", 20, "Most ids per feature per example (1..max_ids).")
_SEED = flags.DEFINE_integer("seed", 0, "Dataset seed.")
_JSON = outputs.json_flag()


def _auc(p: np.ndarray, y: np.ndarray) -> float:
  ranks = np.empty(len(p))
  ranks[np.argsort(p, kind="stable")] = np.arange(1, len(p) + 1)
  pos = y > 0.5
  n1, n0 = int(pos.sum()), int((~pos).sum())
  return float((ranks[pos].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def _baseline(n: int, ids_per_example: float, seed: int) -> None:
  """Draws the stream's uniforms only, chunk by chunk like the generator."""
  rng = np.random.default_rng(seed)
  for _ in range(0, n, 4096):
    rng.random(int(4096 * ids_per_example), np.float32)
    rng.random((4096, 13), np.float32)
    rng.random(4096)


def _timed(fn):
  """(result, CPU seconds, wall seconds)."""
  start, wall = time.process_time(), time.perf_counter()
  result = fn()
  return result, time.process_time() - start, time.perf_counter() - wall


def _benchmark_shape(n: int, seed: int) -> dict:
  """Part 1."""
  features = data.criteo_like_features(26, _VOCAB.value, max_ids=_MAX_IDS.value)
  ids_per_example = 26 * (1 + _MAX_IDS.value) / 2
  _, base_s, _ = _timed(lambda: _baseline(n, ids_per_example, seed))
  batches, generate_s, _ = _timed(lambda: list(data.generate_batches(features, 13, n, seed)))
  probs, probs_s, _ = _timed(
    lambda b=batches: np.concatenate([data.synthetic_click_probabilities(x, seed) for x in b])
  )
  labels = np.concatenate([b.labels for b in batches])
  del batches
  with tempfile.TemporaryDirectory() as tmp:
    _, write_s, _ = _timed(
      lambda: data.write_synthetic(os.path.join(tmp, "ds"), features, num_examples=n, seed=seed)
    )
  rows = [
    ("(0) numpy uniforms only (baseline)", base_s),
    ("(a) generate (ids, dense, labels)", generate_s),
    ("(b) true probabilities only", probs_s),
    ("(c) write_synthetic, 128/record", write_s),
  ]
  figures = {"num_examples": n, "stages": {}}
  print(f"benchmark shape: 26 features of 1..{_MAX_IDS.value} ids, vocabulary {_VOCAB.value:,}")
  print(f"{'stage':<38}{'examples/CPU-s':>15}{'vs (0)':>8}")
  for name, seconds in rows:
    rate = n / seconds
    figures["stages"][name] = {"examples_per_cpu_s": rate, "ratio_to_baseline": base_s / seconds}
    print(f"{name:<38}{rate:>15,.0f}{base_s / seconds:>8.2f}")
  figures.update(
    click_rate=float(labels.mean()),
    mean_probability=float(probs.mean()),
    bayes_auc=_auc(probs, labels),
  )
  print(
    f"click rate {figures['click_rate']:.4f}, mean probability"
    f" {figures['mean_probability']:.4f}, Bayes AUC {figures['bayes_auc']:.4f}"
  )
  return figures


def _job_generation(config, tmp: str, name: str) -> tuple[int, float, float]:
  """(examples, CPU s, wall s) of the job's own data generation for `config`."""
  workdir = os.path.join(tmp, name)
  _, cpu, wall = _timed(lambda: ensure_dataset(config, workdir, show_progress=False))
  synth = config.synthetic
  return int(synth.num_examples) + int(synth.eval_examples), cpu, wall


def _array_record_floor(config, tmp: str, options: str) -> tuple[int, float, float]:
  """(f), (f0): ArrayRecord's writes of the job's records (encoded first), in the job's
  shards, into directory `tmp`."""
  os.makedirs(tmp)
  features = synthetic_features(config)
  codec = data.RecordCodec(data.synthetic_schema(features, int(config.synthetic.num_dense)))
  n = int(config.synthetic.num_examples)
  batches = data.generate_batches(features, int(config.synthetic.num_dense), n, int(config.seed))
  records = [r for b in batches for r in encode_records(codec, b, 1)[0]]
  per_shard = int(config.synthetic.records_per_shard)

  def write():
    for i, start in enumerate(range(0, len(records), per_shard)):
      path = os.path.join(tmp, f"floor-{i:05d}.arrayrecord")
      writer = array_record_module.ArrayRecordWriter(path, options)
      for record in records[start : start + per_shard]:
        writer.write(record)
      writer.close()

  _, cpu, wall = _timed(write)
  return n, cpu, wall


def _shipped(n: int) -> dict:
  """Part 2."""
  jax.process_index()  # the backend starts before the clocks do
  one = criteo.get_config()
  one.synthetic.num_examples = n
  one.synthetic.examples_per_record = 1
  packed = criteo.get_config()  # as shipped: 128 per record for a new job
  packed.synthetic.num_examples = n
  with tempfile.TemporaryDirectory() as tmp:
    rows = {
      "(d) criteo, 1/record (up to 0.3)": _job_generation(one, tmp, "criteo_1"),
      "(e) criteo, 128/record (as shipped)": _job_generation(packed, tmp, "criteo_128"),
      "(f) ArrayRecord writes of (d) alone": _array_record_floor(
        one, os.path.join(tmp, "f"), data.array_record_options(1)
      ),
      "(f0) the same, zstd chunks (0.2)": _array_record_floor(
        one, os.path.join(tmp, "f0"), "group_size:1"
      ),
      "(g) demo, 128/record (as shipped)": _job_generation(demo.get_config(), tmp, "demo"),
    }
    sizes = {
      part: sum(e.stat().st_size for e in os.scandir(os.path.join(tmp, part)))
      for part in ("f", "f0")
    }
  figures = {}
  print(f"\nshipped configs' data generation (launch.job.ensure_dataset), {n:,} criteo examples")
  print(f"{'':<38}{'examples':>10}{'examples/s':>12}{'examples/CPU-s':>16}")
  for name, (count, cpu, wall) in rows.items():
    figures[name] = {
      "examples": count,
      "examples_per_s": count / wall,
      "examples_per_cpu_s": count / cpu,
    }
    print(f"{name:<38}{count:>10,}{count / wall:>12,.0f}{count / cpu:>16,.0f}")
  rate = {k: v["examples_per_cpu_s"] for k, v in figures.items()}
  d, e, f = (rate[k] for k in list(rows)[:3])
  figures["ratio_d_to_e"], figures["ratio_d_to_f"] = d / e, d / f
  f0 = rate["(f0) the same, zstd chunks (0.2)"]
  figures["ratio_f_to_f0"] = f / f0
  figures["file_bytes_f_to_f0"] = sizes["f"] / sizes["f0"]
  print(f"per CPU-second: (d)/(e) = {d / e:.3f}, (d)/(f) = {d / f:.3f}, (f)/(f0) = {f / f0:.2f}")
  print(
    f"file bytes (f)/(f0) = {sizes['f'] / sizes['f0']:.3f}"
    f" ({sizes['f'] / n:.0f} and {sizes['f0'] / n:.0f} per record)"
  )
  return figures


def _main(argv):
  del argv
  figures = _benchmark_shape(_NUM_EXAMPLES.value, _SEED.value)
  figures["shipped"] = _shipped(_SHIPPED.value)
  if _JSON.value:
    outputs.write(_JSON.value, figures)


if __name__ == "__main__":
  app.run(_main)

"""Synthetic data generation speed, Criteo shape (26 sparse, 13 dense features).

    python benchmarks/synthetic.py [--json out.json] [--num_examples 200000]

Measures examples per CPU-second (steadier than wall time on a shared machine) of
  (0) the baseline: numpy drawing just the uniforms the stream needs (one
      per id, dense value and label), the floor of any generator of it,
  (a) generation alone (`generate_batches`: ids, dense values, planted
      click probabilities, labels),
  (b) the true probabilities alone (`synthetic_click_probabilities` on the
      generated batches),
  (c) writing a dataset (`write_synthetic`: generation + record encoding +
      ArrayRecord writes),
and the Bayes AUC of the planted model (true probabilities vs. labels).
Figures are quoted as ratios to (0) within one run: the machine may be shared.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from absl import app
from absl import flags
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sparsepipe import data  # pylint: disable=g-import-not-at-top,wrong-import-position

_NUM_EXAMPLES = flags.DEFINE_integer("num_examples", 200_000, "Examples per measurement.")
_VOCAB = flags.DEFINE_integer("vocab_size", 100_000, "Vocabulary of every sparse feature.")
_MAX_IDS = flags.DEFINE_integer("max_ids", 20, "Most ids per feature per example (1..max_ids).")
_SEED = flags.DEFINE_integer("seed", 0, "Dataset seed.")
_JSON = flags.DEFINE_string("json", None, "Write the figures to this JSON file.")


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
  start = time.process_time()
  result = fn()
  return result, time.process_time() - start


def _main(argv):
  del argv
  n, seed = _NUM_EXAMPLES.value, _SEED.value
  features = data.criteo_like_features(26, _VOCAB.value, max_ids=_MAX_IDS.value)
  ids_per_example = 26 * (1 + _MAX_IDS.value) / 2
  _, base_s = _timed(lambda: _baseline(n, ids_per_example, seed))
  batches, generate_s = _timed(lambda: list(data.generate_batches(features, 13, n, seed)))
  probs, probs_s = _timed(
    lambda b=batches: np.concatenate([data.synthetic_click_probabilities(x, seed) for x in b])
  )
  labels = np.concatenate([b.labels for b in batches])
  del batches
  with tempfile.TemporaryDirectory() as tmp:
    _, write_s = _timed(
      lambda: data.write_synthetic(os.path.join(tmp, "ds"), features, num_examples=n, seed=seed)
    )
  rows = [
    ("(0) numpy uniforms only (baseline)", base_s),
    ("(a) generate (ids, dense, labels)", generate_s),
    ("(b) true probabilities only", probs_s),
    ("(c) write_synthetic (ArrayRecord)", write_s),
  ]
  figures = {"num_examples": n, "stages": {}}
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
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(figures, f, indent=1)


if __name__ == "__main__":
  app.run(_main)

"""Synthetic data generation speed, Criteo shape (26 sparse, 13 dense features).

    python benchmarks/synthetic.py [--json out.json] [--num_examples 200000]

Measures examples/s of
  (a) generation alone (`generate_batches`: ids, dense values, planted
      click probabilities, labels),
  (b) the true probabilities alone (`synthetic_click_probabilities` on the
      generated batches),
  (c) writing a dataset (`write_synthetic`: generation + record encoding +
      ArrayRecord writes),
and the Bayes AUC of the planted model (true probabilities vs. labels).
Figures are quoted as ratios within one run: the machine may be shared.
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


def _main(argv):
  del argv
  n, seed = _NUM_EXAMPLES.value, _SEED.value
  features = data.criteo_like_features(26, _VOCAB.value, max_ids=_MAX_IDS.value)
  start = time.perf_counter()
  batches = list(data.generate_batches(features, 13, n, seed))
  generate_s = time.perf_counter() - start
  start = time.perf_counter()
  probs = np.concatenate([data.synthetic_click_probabilities(b, seed) for b in batches])
  probs_s = time.perf_counter() - start
  labels = np.concatenate([b.labels for b in batches])
  del batches
  with tempfile.TemporaryDirectory() as tmp:
    start = time.perf_counter()
    data.write_synthetic(os.path.join(tmp, "ds"), features, num_examples=n, seed=seed)
    write_s = time.perf_counter() - start
  figures = {
      "num_examples": n,
      "generate_examples_per_s": n / generate_s,
      "probabilities_examples_per_s": n / probs_s,
      "write_examples_per_s": n / write_s,
      "write_over_generate": generate_s / write_s,
      "click_rate": float(labels.mean()),
      "mean_probability": float(probs.mean()),
      "bayes_auc": _auc(probs, labels),
  }
  print(f"{'stage':<34}{'examples/s':>14}")
  print(f"{'generate (ids, dense, labels)':<34}{figures['generate_examples_per_s']:>14,.0f}")
  print(f"{'true probabilities only':<34}{figures['probabilities_examples_per_s']:>14,.0f}")
  print(f"{'write_synthetic (to ArrayRecord)':<34}{figures['write_examples_per_s']:>14,.0f}")
  print(f"write / generate: {figures['write_over_generate']:.2f}")
  print(f"click rate {figures['click_rate']:.4f}, mean probability"
        f" {figures['mean_probability']:.4f}, Bayes AUC {figures['bayes_auc']:.4f}")
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(figures, f, indent=1)


if __name__ == "__main__":
  app.run(_main)

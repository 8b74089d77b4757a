"""Model quality: does the job learn? Held-out AUC against known bounds.

    python benchmarks/quality.py [--json out.json] [--ratings_csv ratings.csv]

Figures (each from full jobs run through `train_and_evaluate`, CPU):
  (a) planted data: the synthetic generator knows every example's true click
      probability; the eval AUC of the trained DLRM against the Bayes AUC of
      the same eval set (the AUC of the true probabilities, which no model
      can beat). Target: within 0.025.
  (b) pipelined vs sequential training (config.pipelining), same data and
      steps: eval AUC difference. Target: within 0.002.
  (c) a real public ratings dataset (--ratings_csv: user, item, rating
      columns, e.g. MovieLens), converted with the CSV converter (rating >=
      4 is a click) with a 10% eval split: the default hyperparameters of
      configs/dataset.py against logistic regression on one-hot user and item
      features of the same split (numpy, full-batch Newton-free Adagrad).
      Target: at least the logistic regression's AUC.
  (d) the demo config: its AUC at every eval must rise.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

from absl import app
from absl import flags
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sparsepipe import data  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe import pipeline  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.launch import train_and_evaluate  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.launch.config_base import base_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.launch.config_base import feature  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.launch.configs import config_path  # pylint: disable=g-import-not-at-top,wrong-import-position

_JSON = flags.DEFINE_string("json", None, "Write the figures to this JSON file.")
_STEPS = flags.DEFINE_integer("planted_steps", 400, "Batches of the planted-data runs.")
_RATINGS = flags.DEFINE_string(
    "ratings_csv", None, "A ratings CSV (user,item,rating columns) for figure (c).")
_RATING_COLUMNS = flags.DEFINE_list(
    "rating_columns", ["userId", "movieId", "rating"], "User, item and rating column names.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Keep the runs here (default: a temp dir).")


def _load(name):
  import importlib.util  # pylint: disable=g-import-not-at-top

  spec = importlib.util.spec_from_file_location(name, config_path(name))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def _read_all(directory: str) -> data.ExampleBatch:
  manifest = data.read_manifest(directory)
  source = data.manifest_source(manifest)
  return data.concat_batches(
      [data.decode_batch(source[i], manifest.schema) for i in range(len(source))])


def planted_config(pipelining: bool):
  """A DLRM on planted click data: 4 features, Bayes AUC about 0.78."""
  config = base_config([
      ("user", feature(2000)),
      ("item", feature(5000)),
      ("category", feature(200, max_ids=3, combiner="mean")),
      ("history", feature(5000, max_ids=8, combiner="mean")),
  ])
  config.num_steps = _STEPS.value
  config.per_host_batch_size = 512
  config.synthetic.num_examples = _STEPS.value * 512
  config.synthetic.eval_examples = 32768
  config.synthetic.num_dense = 4
  config.synthetic.records_per_shard = 8192
  config.model.embedding_dim = 8
  config.model.bottom_mlp_dims = (32, 8)
  config.model.top_mlp_dims = (32, 16)
  config.fdo.every_steps = 100
  config.eval.every_steps = 0
  config.checkpoint.every_steps = 1000
  config.pipelining = pipelining
  return config


def planted(root: str) -> dict[str, float]:
  figures = {}
  for mode in ("pipelined", "sequential"):
    workdir = os.path.join(root, f"planted_{mode}")
    result = train_and_evaluate(planted_config(mode == "pipelined"), workdir)
    figures[f"planted_{mode}_auc"] = result.last_eval.auc
  evals = _read_all(os.path.join(root, "planted_pipelined", "data_eval"))
  seed = data.read_manifest(os.path.join(root, "planted_pipelined", "data_eval")).info["seed"]
  probabilities = data.synthetic_click_probabilities(evals, seed)
  figures["planted_bayes_auc"] = pipeline.auc(evals.labels, probabilities)
  figures["planted_gap_to_bayes"] = figures["planted_bayes_auc"] - figures["planted_pipelined_auc"]
  figures["pipelined_minus_sequential_auc"] = (
      figures["planted_pipelined_auc"] - figures["planted_sequential_auc"])
  return figures


def demo(root: str) -> dict[str, object]:
  workdir = os.path.join(root, "demo")
  train_and_evaluate(_load("demo"), workdir)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    aucs = [r["auc"] for r in map(json.loads, f) if r.get("event") == "eval"]
  return {"demo_eval_aucs": aucs, "demo_auc_rises": all(b > a for a, b in zip(aucs, aucs[1:]))}


def logistic_regression_auc(train: data.ExampleBatch, evals: data.ExampleBatch,
                            epochs: int = 30) -> float:
  """One-hot (user, item) logistic regression, Adagrad on the full batch."""
  names = sorted(train.sparse)
  sizes = [int(max(train.sparse[n].values.max(), evals.sparse[n].values.max())) + 1 for n in names]
  offsets = np.cumsum([0] + sizes[:-1])

  def columns(batch):  # one id per example and feature
    return np.stack([batch.sparse[n].values + o for n, o in zip(names, offsets)], axis=1)

  x, y = columns(train), train.labels.astype(np.float64)
  w, b = np.zeros(sum(sizes)), 0.0
  g2w, g2b, lr = np.full(sum(sizes), 1e-8), 1e-8, 0.5
  for _ in range(epochs):
    p = 1 / (1 + np.exp(-(w[x].sum(axis=1) + b)))
    err = p - y
    grad = np.bincount(x.ravel(), np.repeat(err, x.shape[1]), minlength=w.size) / len(y)
    grad += 1e-6 * w
    g2w += grad**2
    w -= lr * grad / np.sqrt(g2w)
    gb = err.mean()
    g2b += gb**2
    b -= lr * gb / np.sqrt(g2b)
  scores = 1 / (1 + np.exp(-(w[columns(evals)].sum(axis=1) + b)))
  return pipeline.auc(evals.labels, scores)


def ratings(root: str, path: str) -> dict[str, float]:
  user, item, rating = _RATING_COLUMNS.value
  train_dir, eval_dir = os.path.join(root, "ratings"), os.path.join(root, "ratings_eval")
  data.convert_csv(
      [path], train_dir, label_column=rating, label_threshold=4.0,
      sparse_columns=[user, item], integer_id_columns=[user, item],
      eval_output=eval_dir, eval_fraction=0.1, overwrite=True,
  )
  config = _load("dataset")
  config.data.dir, config.eval.data_dir = train_dir, eval_dir
  examples = data.read_manifest(train_dir).num_examples
  config.num_steps = max(1, examples // int(config.per_host_batch_size))
  result = train_and_evaluate(config, os.path.join(root, "ratings_job"))
  lr_auc = logistic_regression_auc(_read_all(train_dir), _read_all(eval_dir))
  return {"ratings_dlrm_auc": result.last_eval.auc, "ratings_logistic_regression_auc": lr_auc,
          "ratings_train_examples": examples}


def main(argv):
  del argv
  root = _WORKDIR.value or tempfile.mkdtemp(prefix="sparsepipe_quality_")
  figures = {**planted(root), **demo(root)}
  if _RATINGS.value:
    figures.update(ratings(root, _RATINGS.value))
  rows = [(k, f"{v:.4f}" if isinstance(v, float) else str(v)) for k, v in figures.items()]
  width = max(len(k) for k, _ in rows)
  for k, v in rows:
    print(f"{k:<{width}}  {v}")
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(figures, f, indent=1)


if __name__ == "__main__":
  app.run(main)

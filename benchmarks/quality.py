r"""Model quality: does the job learn? Held-out AUC against known bounds.

    pip download recbole==1.2.1 --no-deps -d /tmp/recbole   # ships MovieLens ml-100k
    python benchmarks/quality.py [--json out.json] \
        --ratings_wheel /tmp/recbole/recbole-1.2.1-py3-none-any.whl

Figures (each from full jobs run through `train_and_evaluate`, CPU):
  (a) planted data: the synthetic generator knows every example's true click
      probability; the eval AUC of the trained DLRM against the Bayes AUC of
      the same eval set (the AUC of the true probabilities, which no model
      can beat). Target: within 0.025.
  (b) pipelined vs sequential training (config.pipelining), same data and
      steps: eval AUC difference. Target: within 0.002.
  (c) a real public ratings dataset: MovieLens ml-100k (100,000 ratings of
      943 users on 1,682 movies, GroupLens, research use; read from the
      recbole wheel, which ships it: nothing is downloaded at run time and
      nothing is committed). Ratings joined with the user and movie files
      into a CSV (user, movie, age, gender, occupation, genres), converted
      with the CSV converter (rating >= 4 is a click, 10% eval split), then
      trained with the default hyperparameters of configs/dataset.py, as a
      DLRM and as a DCN-v2 (config.model.name), against logistic regression
      on the one-hot (genres multi-hot) features of the same split (numpy,
      full-batch Adagrad to convergence). Target: at least the logistic
      regression's AUC.
  (d) the demo config: its AUC at every eval must rise.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys

from absl import app
from absl import flags
from absl import logging
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sparsepipe import data  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe import pipeline  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.launch import train_and_evaluate  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.launch.config.base_config import base_config  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.launch.config.base_config import feature  # pylint: disable=g-import-not-at-top,wrong-import-position
import outputs  # pylint: disable=g-import-not-at-top,wrong-import-position

_JSON = outputs.json_flag()
_STEPS = flags.DEFINE_integer("planted_steps", 600, "Batches of the planted-data runs.")
_EMBEDDING_LR = flags.DEFINE_float("planted_embedding_lr", 0.1, "Adagrad rate of the tables.")
_DENSE_LR = flags.DEFINE_float("planted_dense_lr", 0.002, "Adam rate of the dense layers.")
_PARTS = flags.DEFINE_list("parts", ["planted", "demo", "ratings"], "Figures to compute.")
_RATINGS = flags.DEFINE_string(
  "ratings_wheel", None, "recbole-1.2.1-py3-none-any.whl (MovieLens ml-100k) for figure (c)."
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Keep the runs here (default: a temp dir).")


def _load(name):
  """A shipped config (they are modules of the package)."""
  return importlib.import_module(f"sparsepipe.launch.config.shipped.{name}").get_config()


def _read_all(directory: str) -> data.ExampleBatch:
  manifest = data.read_manifest(directory)
  source = data.manifest_source(manifest)
  return data.concat_batches(
    [data.decode_batch(source[i], manifest.schema) for i in range(len(source))]
  )


def planted_config(pipelining: bool):
  """A DLRM on planted click data: 4 features, Bayes AUC about 0.78.

  The planted logit sums each feature's per-id weights over sqrt(ids), so
  the multivalent features use the sqrtn combiner: the model can represent
  the truth, and what it misses is what the data did not show it.
  """
  config = base_config(
    [
      ("user", feature(500)),
      ("item", feature(1000)),
      ("category", feature(50, max_ids=3, combiner="sqrtn")),
      ("history", feature(1000, max_ids=8, combiner="sqrtn")),
    ]
  )
  config.embedding_optimizer.learning_rate = _EMBEDDING_LR.value
  config.dense_optimizer.learning_rate = _DENSE_LR.value
  config.num_steps = _STEPS.value
  config.global_batch_size = 512
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
  with config.ignore_type():  # 'auto' by default
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
    figures["planted_pipelined_auc"] - figures["planted_sequential_auc"]
  )
  return figures


def demo(root: str) -> dict[str, object]:
  workdir = os.path.join(root, "demo")
  train_and_evaluate(_load("demo"), workdir)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    aucs = [r["auc"] for r in map(json.loads, f) if r.get("event") == "eval"]
  return {"demo_eval_aucs": aucs, "demo_auc_rises": all(b > a for a, b in zip(aucs, aucs[1:]))}


def movielens_csv(wheel: str, path: str) -> str:
  """ml-100k from the recbole wheel as one CSV: ratings joined with users and movies."""
  import zipfile  # pylint: disable=g-import-not-at-top

  def table(name):
    with zipfile.ZipFile(wheel) as z:
      text = z.read(f"recbole/dataset_example/ml-100k/ml-100k.{name}").decode("latin-1")
    rows = [line.split("\t") for line in text.splitlines()]
    return [h.split(":")[0] for h in rows[0]], rows[1:]

  _, ratings = table("inter")
  _, users = table("user")
  _, items = table("item")
  user = {r[0]: r[1:4] for r in users}  # age, gender, occupation
  genres = {r[0]: "|".join(r[3].split()) for r in items}
  with open(path, "w") as f:
    f.write("user,movie,rating,age,gender,occupation,genres\n")
    for u, m, rating, _ in ratings:
      f.write(",".join([u, m, rating, *user[u], genres[m]]) + "\n")
  return path


def _columns(batch: data.ExampleBatch, names, offsets):
  """(example index, global one-hot column) of every id of every feature."""
  rows, cols = [], []
  for name, offset in zip(names, offsets):
    ragged = batch.sparse[name]
    rows.append(np.repeat(np.arange(len(ragged.row_lengths)), ragged.row_lengths))
    cols.append(ragged.values.astype(np.int64) + offset)
  return np.concatenate(rows), np.concatenate(cols)


def logistic_regression_auc(
  train: data.ExampleBatch, evals: data.ExampleBatch, epochs: int = 300
) -> float:
  """Logistic regression on one-hot (multi-hot) sparse features, full-batch Adagrad."""
  names = sorted(train.sparse)
  sizes = [int(max(train.sparse[n].values.max(), evals.sparse[n].values.max())) + 1 for n in names]
  offsets = np.cumsum([0] + sizes[:-1])
  rows, cols = _columns(train, names, offsets)
  y, n = train.labels.astype(np.float64), len(train.labels)
  w, b = np.zeros(sum(sizes)), 0.0
  g2w, g2b, lr, l2 = np.full(w.size, 1e-8), 1e-8, 0.5, 1e-4
  for _ in range(epochs):
    logit = np.bincount(rows, w[cols], minlength=n) + b
    err = 1 / (1 + np.exp(-logit)) - y
    grad = np.bincount(cols, err[rows], minlength=w.size) / n + l2 * w
    g2w += grad**2
    w -= lr * grad / np.sqrt(g2w)
    g2b += err.mean() ** 2
    b -= lr * err.mean() / np.sqrt(g2b)
  rows, cols = _columns(evals, names, offsets)
  logit = np.bincount(rows, w[cols], minlength=len(evals.labels)) + b
  return pipeline.auc(evals.labels, 1 / (1 + np.exp(-logit)))


RATINGS_BATCHES = 1000


def ratings(root: str, wheel: str) -> dict[str, float]:
  train_dir, eval_dir = os.path.join(root, "ratings"), os.path.join(root, "ratings_eval")
  data.convert_csv(
    [movielens_csv(wheel, os.path.join(root, "ml-100k.csv"))],
    train_dir,
    label_column="rating",
    label_threshold=4.0,
    sparse_columns=["user", "movie", "age", "gender", "occupation", "genres"],
    multivalent_columns=["genres"],
    integer_id_columns=["user", "movie"],
    vocab_sizes=4096,
    eval_output=eval_dir,
    eval_fraction=0.1,
    overwrite=True,
  )
  aucs = {}
  for model in ("dlrm", "dcn_v2"):
    config = _load("dataset")
    config.data.dir, config.eval.data_dir = train_dir, eval_dir
    config.model.name = model
    # 1,000 batches (about 2.8 epochs), as measured before the dataset config's
    # default became 10 epochs of the data, so its figures stay comparable.
    config.num_steps = RATINGS_BATCHES
    result = train_and_evaluate(config, os.path.join(root, f"ratings_{model}"))
    aucs[f"ratings_{model}_auc"] = result.last_eval.auc
  lr_auc = logistic_regression_auc(_read_all(train_dir), _read_all(eval_dir))
  return {
    **aucs,
    "ratings_logistic_regression_auc": lr_auc,
    "ratings_train_examples": data.read_manifest(train_dir).num_examples,
    "ratings_batches": RATINGS_BATCHES,
  }


def _check_flags() -> None:
  """Refuses unknown --parts, and figure (c) without the wheel, before any run."""
  unknown = sorted(set(_PARTS.value) - {"planted", "demo", "ratings"})
  if unknown or not _PARTS.value:
    raise app.UsageError(f"--parts={','.join(_PARTS.value)}: one or more of planted, demo, ratings")
  wheel = _RATINGS.value
  if "ratings" in _PARTS.value and not (wheel and os.path.isfile(wheel)):
    what = f"--ratings_wheel={wheel} is no file" if wheel else "not given"
    raise app.UsageError(
      f"--parts ratings (figure (c)) needs --ratings_wheel, the recbole wheel ({what}):"
      " pip download recbole==1.2.1 --no-deps -d /tmp/recbole, then"
      " --ratings_wheel /tmp/recbole/recbole-1.2.1-py3-none-any.whl; or leave (c) out with"
      " --parts planted,demo"
    )


def main(argv):
  del argv
  _check_flags()
  root = outputs.runs_folder(_WORKDIR.value, "quality", "--workdir")
  logging.set_verbosity(logging.WARNING)
  figures = {}
  try:
    if "planted" in _PARTS.value:
      figures.update(planted(root))
    if "demo" in _PARTS.value:
      figures.update(demo(root))
    if "ratings" in _PARTS.value:
      figures.update(ratings(root, _RATINGS.value))
  finally:
    if not _WORKDIR.value:  # our temp dir; a --workdir is the user's to keep
      shutil.rmtree(root, ignore_errors=True)
  rows = [(k, f"{v:.4f}" if isinstance(v, float) else str(v)) for k, v in figures.items()]
  width = max(len(k) for k, _ in rows)
  for k, v in rows:
    print(f"{k:<{width}}  {v}")
  if _JSON.value:
    outputs.write(_JSON.value, figures)


if __name__ == "__main__":
  app.run(main)

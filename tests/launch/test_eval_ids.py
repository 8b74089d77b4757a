"""Eval data with more ids per example than the train data: the eval's limits are the
worst case of the eval data, and no id is dropped (data.allow_id_dropping or not)."""

import csv

import jax
import numpy as np
import pytest

from sparsepipe import checkpointing
from sparsepipe import core
from sparsepipe import data
from sparsepipe import pipeline
from sparsepipe import serving
from sparsepipe.launch import train_and_evaluate
from sparsepipe.launch.evaluate import evaluate_checkpoint
from sparsepipe.launch.export import export_checkpoint
from sparsepipe.launch.job import checkpoints
from sparsepipe.launch.job.evaluation import JobEval
from sparsepipe.launch.job.model import JobModel
from sparsepipe.serving import score_dataset

import launch_testing  # pylint: disable=g-bad-import-order

GENRES = tuple(f"genre {i}" for i in range(96))


def _convert(root, name, rows, genres_of):
  path = str(root / f"{name}.csv")
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["user_id", "movie_id", "genres", "rating"])
    for i, (user, movie, rating) in enumerate(rows):
      writer.writerow([user, movie, "|".join(genres_of(i)), rating])
  data.convert_csv(
    [path],
    str(root / name),
    label_column="rating",
    label_threshold=4.0,
    sparse_columns=["user_id", "movie_id", "genres"],
    multivalent_columns=["genres"],
    integer_id_columns=["user_id", "movie_id"],
    vocab_sizes=["user_id=64", "movie_id=128", "genres=128"],
  )
  return str(root / name)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
  """A dataset-config job trained on one genre per example, evaluated on examples of
  90 to 96 genres (the eval manifest records 96, the train manifest 1), exported."""
  root = tmp_path_factory.mktemp("eval_ids")
  rng = np.random.default_rng(5)
  rows = [(rng.integers(0, 64), rng.integers(0, 128), rng.integers(1, 6)) for _ in range(356)]
  train = _convert(root, "train", rows[:256], lambda i: GENRES[i % 96 : i % 96 + 1])
  evaluation = _convert(root, "eval", rows[256:], lambda i: GENRES[: 90 + i % 7])
  assert data.read_manifest(train).info["ids_per_example"]["genres"]["max"] == 1
  assert data.read_manifest(evaluation).info["ids_per_example"]["genres"]["max"] == 96
  config = launch_testing.shipped_config(
    "dataset", data__dir=train, eval__data_dir=evaluation, num_steps=4, eval__every_steps=0
  )
  workdir = str(root / "job")
  # Its final eval once failed: "15 ids in partition 11 ... exceed max_ids_per_partition=6".
  result = train_and_evaluate(config, workdir)
  export_checkpoint(workdir, str(root / "export"))
  return workdir, evaluation, result, serving.Predictor.load(str(root / "export"))


def _eval_step_scores(workdir, eval_dir, **overrides):
  """(scores, EvalMetrics) of the job's eval step over every example of `eval_dir`,
  from the job's checkpoint, its model made with the saved config changed by
  `overrides` (dotted keys)."""
  saved_job = checkpoints.saved_job(workdir, None)
  directory, saved = saved_job.directory, saved_job.config
  config = saved.copy_and_resolve_references()
  for key, value in overrides.items():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  mesh = core.make_mesh()
  model = JobModel(config, data.read_manifest(config.data.dir), mesh)
  run = checkpointing.RunInfo.create(saved, mesh, data_worker_count=0)
  restored = checkpoints.restore_saved_model(directory, model, run, None)
  evaluation = JobEval(model, data_dir=eval_dir)
  scores = []
  for batch in evaluation.dataset:
    out = np.asarray(jax.device_get(evaluation.step(restored.train_state, batch)))
    scores.append(out[np.asarray(batch.mask) == 1])
  return np.concatenate(scores), evaluation.run(restored.train_state)


def test_the_eval_scores_every_id_of_examples_with_more_ids_than_the_train_data(job):
  workdir, eval_dir, result, predictor = job
  want, labels = score_dataset(predictor, eval_dir)  # every id, outside the job's COO path
  assert want.size == 100 and result.last_eval.examples == 100
  scores, metrics = _eval_step_scores(workdir, eval_dir)
  np.testing.assert_allclose(scores, want, atol=1e-5, rtol=0)
  assert metrics == result.last_eval == pipeline.compute_metrics(labels, scores)
  assert evaluate_checkpoint(workdir)[2] == result.last_eval


def test_the_eval_drops_no_ids_with_allow_id_dropping(job):
  """The rerun the limit error advised (data.allow_id_dropping) evaluated without some
  of the ids, and said nothing; the eval's limits hold every batch, with it or not."""
  workdir, eval_dir, result, predictor = job
  scores, metrics = _eval_step_scores(workdir, eval_dir, **{"data.allow_id_dropping": True})
  np.testing.assert_allclose(scores, score_dataset(predictor, eval_dir)[0], atol=1e-5, rtol=0)
  assert metrics == result.last_eval

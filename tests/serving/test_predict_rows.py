"""predict_rows: raw CSV rows score as the converted rows do (same hashing and id rules)."""

import csv
import os
import subprocess
import sys

import numpy as np
import pytest

from sparsepipe import data
from sparsepipe import serving
from sparsepipe.launch import train_and_evaluate
from sparsepipe.launch.export import export_checkpoint
from sparsepipe.serving.scoring import score_dataset

import launch_testing  # pylint: disable=g-bad-import-order
import paths  # pylint: disable=g-bad-import-order

GENRES = ("Action", "Comedy", "Drama", "Romance", "Thriller")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """A ratings CSV (integer user ids, hashed titles, multivalent genres), converted,
  trained on with the dataset config, exported."""
  root = tmp_path_factory.mktemp("rows")
  rng = np.random.default_rng(3)
  path = str(root / "ratings.csv")
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["userId", "title", "genres", "age", "rating"])
    for _ in range(512):
      genres = "|".join(rng.choice(GENRES, rng.integers(0, 3), replace=False))
      title = f"Movie {rng.integers(0, 300)}, The ({rng.integers(1950, 2020)})"
      writer.writerow(
        [rng.integers(0, 50), title, genres, rng.integers(18, 70), rng.integers(1, 6)]
      )
  data.convert_csv(
    [path],
    str(root / "data"),
    label_column="rating",
    label_threshold=4.0,
    dense_columns=["age"],
    sparse_columns=["userId", "title", "genres"],
    multivalent_columns=["genres"],
    integer_id_columns=["userId"],
    vocab_sizes=["1000", "userId=50", "genres=16"],
  )
  config = launch_testing.shipped_config(
    "dataset", data__dir=str(root / "data"), num_steps=4, eval__every_steps=0
  )
  train_and_evaluate(config, str(root / "job"))
  export_checkpoint(str(root / "job"), str(root / "export"))
  return root, path


def test_raw_rows_score_like_their_converted_examples(exported):
  root, path = exported
  predictor = serving.Predictor.load(str(root / "export"))
  with open(path, newline="") as f:
    rows = list(csv.DictReader(f))
  converted, labels = score_dataset(predictor, str(root / "data"))
  raw = predictor.predict_rows(rows)
  np.testing.assert_array_equal(raw, converted)
  # Rows to score have no label: the same scores without the rating column.
  unlabeled = [{k: v for k, v in row.items() if k != "rating"} for row in rows[:20]]
  np.testing.assert_array_equal(
    predictor.predict_rows(unlabeled), predictor.predict_rows(rows[:20])
  )
  np.testing.assert_allclose(predictor.predict_rows(unlabeled), converted[:20], atol=1e-6)
  assert labels.shape == (512,)


def test_a_bad_raw_row_names_the_row_and_column(exported):
  root, _ = exported
  predictor = serving.Predictor.load(str(root / "export"))
  good = {"userId": "3", "title": "Heat (1995)", "genres": "Action", "age": "30"}
  with pytest.raises(
    data.InputFormatError, match=r"'rows' line 2: column userId id 77 out of range"
  ):
    predictor.predict_rows([good, {**good, "userId": "77"}])
  with pytest.raises(
    data.InputFormatError,
    match=(
      r"^'rows' line 2: a str, not a \{column: text\} mapping \(e.g. dict\(zip\(header,"
      r" fields\)\)\)$"
    ),
  ):
    predictor.predict_rows([good, "3,Heat (1995),Action,30"])


def test_the_predict_command_writes_the_scores_in_the_dataset_order(exported, tmp_path):
  root, _ = exported
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "sparsepipe.serving.predict",
      f"--export={root / 'export'}",
      f"--data={root / 'data'}",
      f"--output={tmp_path / 'scores.npy'}",
      "--batch_size=100",
    ],
    capture_output=True,
    text=True,
    env={**os.environ, "PYTHONPATH": paths.REPO_ROOT},
    check=False,
  )
  assert out.returncode == 0, out.stderr
  predictor = serving.Predictor.load(str(root / "export"))
  want, _ = score_dataset(predictor, str(root / "data"), batch_size=100)
  np.testing.assert_array_equal(np.load(tmp_path / "scores.npy"), want)
  assert out.stdout.startswith(f"512 scores: {tmp_path / 'scores.npy'}; AUC ")
  assert "predict: 512/512 examples (100.0%)" in out.stderr

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
from sparsepipe.serving import score_dataset

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
  # Any iterable of rows: a reader or a generator once scored nothing (an empty array).
  with open(path, newline="") as f:
    np.testing.assert_array_equal(predictor.predict_rows(csv.DictReader(f)), converted)
  np.testing.assert_array_equal(
    predictor.predict_rows(r for r in rows[:20]), predictor.predict_rows(rows[:20])
  )


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


def test_a_float_for_a_hashed_column_is_refused_not_hashed_as_other_text(exported):
  """A float (a pandas column of ints with a NaN) was hashed as its str(): title 1995.0 is
  "1995.0", another id than the file's "1995", and scored silently."""
  root, _ = exported
  predictor = serving.Predictor.load(str(root / "export"))
  good = {"userId": "3", "title": "1995", "genres": "Action", "age": "30"}
  for bad, shown in (({"title": 1995.0}, "1995.0"), ({"genres": ["Drama", np.float32(2)]}, "2.0")):
    with pytest.raises(data.InputFormatError) as refused:
      predictor.predict_rows([good, {**good, **bad}])
    column, value = next(iter(bad.items()))
    value = value if column == "title" else value[1]
    assert str(refused.value) == (
      f"'rows' line 2: column {column} value {value!r} is a float, but the column is hashed"
      f" from its text ({shown!r} is not the id of the training file's text, e.g. '4' for"
      " 4.0): give the text as the file has it, or an int"
    )
  # Dense values are numbers, integer ids and ints are their decimal text: unchanged.
  numbers = {"userId": np.int64(3), "title": 1995, "genres": "Action", "age": 30.0}
  np.testing.assert_array_equal(predictor.predict_rows([numbers]), predictor.predict_rows([good]))


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


def _rows(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def test_none_and_lists_score_as_the_converter_read_the_fields(exported):
  root, path = exported
  predictor = serving.Predictor.load(str(root / "export"))
  rows = _rows(path)
  converted, _ = score_dataset(predictor, str(root / "data"))
  # A multivalent column as a list: the converter's split of the field on "|".
  listed = [{**row, "genres": row["genres"].split("|")} for row in rows]
  np.testing.assert_array_equal(predictor.predict_rows(listed), converted)
  # None: a missing value, as an empty field or the column left out.
  some = rows[:20]
  for column in ("userId", "title", "genres", "age"):
    none = predictor.predict_rows([{**row, column: None} for row in some])
    empty = predictor.predict_rows([{**row, column: ""} for row in some])
    absent = predictor.predict_rows([{k: v for k, v in row.items() if k != column} for row in some])
    np.testing.assert_array_equal(none, empty)
    np.testing.assert_array_equal(none, absent)


def test_predict_rows_of_no_rows_is_an_empty_array(exported):
  root, _ = exported
  scores = serving.Predictor.load(str(root / "export")).predict_rows([])
  assert (scores.dtype, scores.shape) == (np.float32, (0,))


def test_a_column_the_converter_never_read_is_an_error_naming_the_known_ones(exported):
  root, _ = exported
  predictor = serving.Predictor.load(str(root / "export"))
  good = {"userId": "3", "title": "Heat (1995)", "genres": "Action", "age": "30"}
  assert predictor.columns == ("rating", "age", "userId", "title", "genres")
  with pytest.raises(data.InputFormatError) as e:
    predictor.predict_rows([good, {**good, "titel": "Heat (1995)"}])
  assert str(e.value) == (
    "'rows' line 2: column(s) ['titel'] are not among the training data's columns ['age',"
    " 'genres', 'rating', 'title', 'userId'] (correct the name, or pass ignore_columns= to leave"
    " a column out)"
  )
  np.testing.assert_array_equal(
    predictor.predict_rows([{**good, "timestamp": "881250949"}], ignore_columns=["timestamp"]),
    predictor.predict_rows([good]),
  )


def test_examples_of_another_dense_width_name_both_widths(exported):
  root, _ = exported
  predictor = serving.Predictor.load(str(root / "export"))
  batch = data.ExampleBatch(
    labels=np.zeros(2, np.float32),
    dense=np.zeros((2, 2), np.float32),
    sparse={
      name: data.RaggedBatch(np.zeros(0, np.int32), np.zeros(2, np.int32))
      for name in ("userId", "title", "genres")
    },
  )
  with pytest.raises(
    ValueError,
    match=rf"^the examples have 2 dense values per example, export '{root / 'export'}' takes 1"
    r" \(dense_dim\)$",
  ):
    predictor.predict(batch)


def _convert(root, path, name, **changes):
  columns = dict(
    label_column="rating",
    label_threshold=4.0,
    dense_columns=["age"],
    sparse_columns=["userId", "title", "genres"],
    multivalent_columns=["genres"],
    integer_id_columns=["userId"],
    vocab_sizes=["1000", "userId=50", "genres=16"],
  )
  data.convert_csv([path], str(root / name), **{**columns, **changes})
  return str(root / name)


def test_a_dataset_converted_otherwise_is_refused_naming_the_differences(exported, tmp_path):
  root, path = exported
  predictor = serving.Predictor.load(str(root / "export"))
  other = _convert(
    tmp_path,
    path,
    "other",
    sparse_columns=["userId", "title"],
    multivalent_columns=[],
    vocab_sizes=["2000", "userId=50"],
  )
  with pytest.raises(serving.DatasetMismatchError) as e:
    score_dataset(predictor, other)
  assert str(e.value) == (
    f"dataset '{other}' was not converted as the training data of export '{root / 'export'}':"
    " features the other lacks: [] (dataset), ['genres'] (export); feature 'title'"
    " vocab_size: 2000 (dataset), 1000 (export); multivalent_columns: [] (dataset),"
    " ['genres'] (export); convert it with the same columns and options"
  )
  hashed = _convert(tmp_path, path, "hashed", integer_id_columns=[])
  with pytest.raises(
    serving.DatasetMismatchError,
    match=r"was not converted as the training data of export '.*': integer_id_columns: \[\]"
    r" \(dataset\), \['userId'\] \(export\); convert it with the same columns and options$",
  ):
    score_dataset(predictor, hashed)
  # An export's path for the predictor was "'str' object has no attribute 'info'".
  with pytest.raises(
    TypeError,
    match=r"^score_dataset takes a Predictor \(serving.Predictor.load\(export\)\), got str '",
  ):
    score_dataset(str(root / "export"), other)
  # The same options on other inputs (here: the same file again) score.
  again = _convert(tmp_path, path, "again")
  np.testing.assert_array_equal(
    score_dataset(predictor, again)[0], score_dataset(predictor, str(root / "data"))[0]
  )


def test_the_predict_command_names_a_dataset_of_another_dense_width(exported, tmp_path):
  root, path = exported
  wide = _convert(tmp_path, path, "wide", dense_columns=["age", "userId"])
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "sparsepipe.serving.predict",
      f"--export={root / 'export'}",
      f"--data={wide}",
      f"--output={tmp_path / 'scores.npy'}",
    ],
    capture_output=True,
    text=True,
    env={**os.environ, "PYTHONPATH": paths.REPO_ROOT},
    check=False,
  )
  assert out.returncode == 1, out.stderr
  assert out.stderr.splitlines() == [
    f"error: dataset '{wide}' was not converted as the training data of export"
    f" '{root / 'export'}': dense columns: ['age', 'userId'] (dataset), ['age'] (export);"
    " convert it with the same columns and options"
  ]
  assert not os.path.exists(tmp_path / "scores.npy")


def test_ignore_columns_and_rows_given_otherwise_than_as_lists_are_named(exported):
  """Before: ignore_columns="timestamp" was read letter by letter (and the column called
  unknown), ignore_columns naming a feature silently kept it, a label that is not a
  number failed although ignored, and one row given alone was "line 1: a str"."""
  root, _ = exported
  predictor = serving.Predictor.load(str(root / "export"))
  good = {"userId": "3", "title": "Heat (1995)", "genres": "Action", "age": "30"}
  with pytest.raises(TypeError) as e:
    predictor.predict_rows([{**good, "timestamp": "1"}], ignore_columns="timestamp")
  assert str(e.value) == (
    "ignore_columns must be a list, not the string 'timestamp': e.g. ignore_columns=['timestamp']"
  )
  with pytest.raises(ValueError) as e:
    predictor.predict_rows([good], ignore_columns=["userId", "age"])
  assert str(e.value) == (
    "ignore_columns names column(s) ['age', 'userId'] that the model reads: they cannot be"
    " left out (a missing value is None, or the column left out of the row)"
  )
  np.testing.assert_array_equal(
    predictor.predict_rows([{**good, "rating": "?"}], ignore_columns=["rating"]),
    predictor.predict_rows([good]),
  )
  with pytest.raises(TypeError) as e:
    predictor.predict_rows(good)
  assert str(e.value) == (
    "rows must be an iterable of {column: value} mappings, not a dict: give one row as [row]"
  )
  with pytest.raises(TypeError) as e:
    predictor.predict_rows(None)
  assert str(e.value) == "rows must be an iterable of {column: value} mappings, not a NoneType"
  with pytest.raises(TypeError) as e:
    serving.Predictor.load(str(root / "export"), deltas=str(root / "export"))
  assert str(e.value).startswith("deltas must be a list, not the string '")

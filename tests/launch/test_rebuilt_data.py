"""A dataset converted again under the same path with other options is not the job's.

It has the same schema, shards and counts, so the data iterator's fingerprint
took it for the job's data: a resumed job trained on dense values transformed
otherwise, and an export of an older checkpoint carried the new conversion's
rules, scoring raw rows otherwise than the model was trained, all without a
word. The iterator now also records the conversion's rules.
"""

import csv

import numpy as np
import pytest

from sparsepipe import checkpointing
from sparsepipe import data
from sparsepipe import serving
from sparsepipe.launch import train_and_evaluate
from sparsepipe.launch.evaluate import evaluate_checkpoint
from sparsepipe.launch.export import export_checkpoint

import launch_testing  # pylint: disable=g-bad-import-order


def _convert(path, output, eval_output, **options):
  data.convert_csv(
    [path],
    output,
    eval_output=eval_output,
    eval_fraction=0.25,
    overwrite=True,
    label_column="rating",
    label_threshold=4.0,
    dense_columns=["age"],
    sparse_columns=["userId", "genre"],
    integer_id_columns=["userId"],
    vocab_sizes=["64"],
    **options,
  )


def test_a_dataset_converted_again_otherwise_is_refused_by_resume_export_and_evaluate(tmp_path):
  rng = np.random.default_rng(5)
  path = str(tmp_path / "ratings.csv")
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["userId", "genre", "age", "rating"])
    for _ in range(400):
      row = [rng.integers(0, 50), f"g{rng.integers(0, 9)}", rng.integers(18, 70)]
      writer.writerow([*row, rng.integers(1, 6)])
  train, held_out = str(tmp_path / "data"), str(tmp_path / "data_eval")
  _convert(path, train, held_out)
  workdir = str(tmp_path / "job")
  config = lambda steps: launch_testing.shipped_config(  # noqa: E731
    "dataset", data__dir=train, eval__data_dir=held_out, num_steps=steps, eval__every_steps=0
  )
  train_and_evaluate(config(4), workdir)
  export_checkpoint(workdir, str(tmp_path / "before"))

  _convert(path, train, held_out, dense_transform="log1p")  # same rows, other dense values
  refused = (
    f"^the training data '{train}' is not the dataset checkpoint 4 was trained on"
    r" \(fingerprints: conversion [0-9a-f]{16} there, [0-9a-f]{16} in the checkpoint\):"
    " it was converted or generated again since. Put the job's dataset back there"
    r" \(same inputs and options\)$"
  )
  with pytest.raises(ValueError, match=refused):
    export_checkpoint(workdir, str(tmp_path / "after"))
  with pytest.raises(ValueError, match=refused):
    evaluate_checkpoint(workdir)
  with pytest.raises(
    checkpointing.IncompatibleCheckpointError,
    match=r"data iterator state was saved with conversion='[0-9a-f]{16}', but this pipeline has"
    r" conversion='[0-9a-f]{16}'",
  ):
    train_and_evaluate(config(8), workdir)

  _convert(path, train, held_out)  # the job's conversion again: all of it goes on
  export_checkpoint(workdir, str(tmp_path / "again"))
  rows = [{"userId": "3", "genre": "g1", "age": "40"}]
  np.testing.assert_array_equal(
    serving.Predictor.load(str(tmp_path / "again")).predict_rows(rows),
    serving.Predictor.load(str(tmp_path / "before")).predict_rows(rows),
  )
  train_and_evaluate(config(8), workdir)

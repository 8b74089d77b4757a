"""Export and evaluate a job whose training data is gone.

Both read the training data's description (features, dense width, the
conversion's rules for `Predictor.predict_rows`) from the checkpoint's copy
of its manifest: a finished job stays exportable once its data is deleted.
Steps saved before the copy existed still read the dataset.
"""

import os
import shutil

import numpy as np
import pytest

from sparsepipe import checkpointing
from sparsepipe import data
from sparsepipe import serving
from sparsepipe.launch import train_and_evaluate
from sparsepipe.launch.evaluate import evaluate_checkpoint
from sparsepipe.launch.export import export_checkpoint

import launch_testing  # pylint: disable=g-bad-import-order

ROWS = [{"userId": "3", "genre": "g1", "age": "40"}, {"userId": "7", "genre": "g4", "age": "22"}]


def _trained(tmp_path):
  path = launch_testing.write_ratings_csv(str(tmp_path / "ratings.csv"), seed=9)
  train, held_out = str(tmp_path / "data"), str(tmp_path / "data_eval")
  launch_testing.convert_ratings(path, train, held_out, dense_transform="log1p")
  workdir = str(tmp_path / "job")
  config = launch_testing.shipped_config(
    "dataset", data__dir=train, eval__data_dir=held_out, num_steps=4, eval__every_steps=0
  )
  train_and_evaluate(config, workdir)
  return workdir, train


def _info_but_its_id(directory):
  """export.json but its id and the serialized predict function's sha256 (its
  bytes differ between two lowerings of one function; its scores are compared)."""
  info = serving.read_info(directory).to_json()
  del info["export_id"], info["files"]["predict.jaxexport"]
  return info


def test_export_and_evaluate_of_a_job_whose_training_data_was_deleted(tmp_path):
  workdir, train = _trained(tmp_path)
  export_checkpoint(workdir, str(tmp_path / "with_data"))
  evaluated = evaluate_checkpoint(workdir)

  shutil.rmtree(train)
  export_checkpoint(workdir, str(tmp_path / "without_data"))
  # The same export (export.json lists every array file's sha256): features,
  # dense width, the converter's rules (log1p) and every array.
  assert _info_but_its_id(str(tmp_path / "without_data")) == _info_but_its_id(
    str(tmp_path / "with_data")
  )
  np.testing.assert_array_equal(
    serving.Predictor.load(str(tmp_path / "without_data")).predict_rows(ROWS),
    serving.Predictor.load(str(tmp_path / "with_data")).predict_rows(ROWS),
  )
  step, trained, metrics = evaluate_checkpoint(workdir)
  assert (step, trained, metrics.as_dict()) == (
    evaluated[0],
    evaluated[1],
    evaluated[2].as_dict(),
  )
  assert not os.path.exists(train)  # nothing made it again


def test_a_generated_dataset_deleted_is_not_generated_again_to_export(tmp_path):
  workdir = str(tmp_path / "job")
  train_and_evaluate(launch_testing.tiny_config(num_steps=2, synthetic__eval_examples=64), workdir)
  export_checkpoint(workdir, str(tmp_path / "with_data"))
  shutil.rmtree(os.path.join(workdir, "data"))
  export_checkpoint(workdir, str(tmp_path / "without_data"))
  assert _info_but_its_id(str(tmp_path / "without_data")) == _info_but_its_id(
    str(tmp_path / "with_data")
  )
  held_out = os.path.join(workdir, "data_eval")
  np.testing.assert_array_equal(
    *[
      serving.score_dataset(serving.Predictor.load(str(tmp_path / name)), held_out)[0]
      for name in ("without_data", "with_data")
    ]
  )
  assert not os.path.exists(os.path.join(workdir, "data"))


def test_a_step_without_a_copy_of_the_manifest_needs_its_dataset(tmp_path, monkeypatch):
  # Steps saved before the copy existed: the metadata has no "training_data".
  to_json = checkpointing.CheckpointMetadata.to_json

  def without_copy(self):
    out = to_json(self)
    del out["training_data"]
    return out

  monkeypatch.setattr(checkpointing.CheckpointMetadata, "to_json", without_copy)
  workdir, train = _trained(tmp_path)
  monkeypatch.undo()
  export_checkpoint(workdir, str(tmp_path / "with_data"))  # read from the dataset
  converter = serving.read_info(str(tmp_path / "with_data")).converter
  assert converter["info"]["dense_transform"] == {"age": "log1p"}
  shutil.rmtree(train)
  gone = (
    f"^config.data.dir='{train}': no manifest.json in '{train}' \\(not a finished dataset\\):"
    " checkpoint 4 holds no copy of the training data's manifest \\(steps saved by sparsepipe"
    " 0.3 and earlier\\), so the job's dataset must be there$"
  )
  with pytest.raises(data.ManifestError, match=gone):
    export_checkpoint(workdir, str(tmp_path / "without_data"))
  with pytest.raises(data.ManifestError, match=gone):
    evaluate_checkpoint(workdir)


def test_a_generated_dataset_of_a_step_without_a_copy_is_not_generated_to_export(
  tmp_path, monkeypatch
):
  """`launch.export` changes nothing in the workdir: it generated <workdir>/data again."""
  to_json = checkpointing.CheckpointMetadata.to_json
  monkeypatch.setattr(
    checkpointing.CheckpointMetadata,
    "to_json",
    lambda self: {k: v for k, v in to_json(self).items() if k != "training_data"},
  )
  workdir = str(tmp_path / "job")
  train_and_evaluate(launch_testing.tiny_config(num_steps=2), workdir)
  monkeypatch.undo()
  shutil.rmtree(os.path.join(workdir, "data"))
  with pytest.raises(
    data.ManifestError,
    match=f"^no manifest.json in '{workdir}/data' \\(not a finished dataset\\): checkpoint 2"
    " holds no copy",
  ):
    export_checkpoint(workdir, str(tmp_path / "export"))
  assert not os.path.exists(os.path.join(workdir, "data"))


def test_an_eval_set_converted_otherwise_names_the_jobs_options_when_its_data_is_gone(tmp_path):
  workdir, train = _trained(tmp_path)
  path = str(tmp_path / "ratings.csv")
  other = str(tmp_path / "other_eval")
  launch_testing.convert_ratings(path, str(tmp_path / "other"), other)  # no log1p
  shutil.rmtree(train)
  with pytest.raises(ValueError) as refused:
    evaluate_checkpoint(workdir, eval_data_dir=other)
  assert str(refused.value).endswith(
    f"(the train data at '{train}' is gone or converted again since the job trained on it,"
    " so --like cannot take its rules from there: convert the eval data with"
    " --vocab_sizes=userId=64,genre=64 and the dense transforms {'age': 'log1p'}, or put the"
    " train data back)"
  )

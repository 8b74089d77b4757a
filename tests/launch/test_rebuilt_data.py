"""A dataset converted again under the same path with other options is not the job's.

It has the same schema, shards and counts, so the data iterator's fingerprint
took it for the job's data: a resumed job trained on dense values transformed
otherwise, and an export of an older checkpoint carried the new conversion's
rules, scoring raw rows otherwise than the model was trained, all without a
word. The iterator now also records the conversion's rules, and export and
evaluate read the training data's rules from the checkpoint's copy of its
manifest, not from the dataset.
"""

import numpy as np
import pytest

from sparsepipe import checkpointing
from sparsepipe import serving
from sparsepipe.launch import train_and_evaluate
from sparsepipe.launch.evaluate import evaluate_checkpoint
from sparsepipe.launch.export import export_checkpoint

import launch_testing  # pylint: disable=g-bad-import-order


def test_a_dataset_converted_again_otherwise_is_refused_by_resume_and_not_read_by_export(
  tmp_path,
):
  path = launch_testing.write_ratings_csv(str(tmp_path / "ratings.csv"), seed=5)
  train, held_out = str(tmp_path / "data"), str(tmp_path / "data_eval")
  launch_testing.convert_ratings(path, train, held_out)
  workdir = str(tmp_path / "job")
  config = lambda steps: launch_testing.shipped_config(  # noqa: E731
    "dataset", data__dir=train, eval__data_dir=held_out, num_steps=steps, eval__every_steps=0
  )
  train_and_evaluate(config(4), workdir)
  export_checkpoint(workdir, str(tmp_path / "before"))
  rows = [{"userId": "3", "genre": "g1", "age": "40"}]
  before = serving.Predictor.load(str(tmp_path / "before")).predict_rows(rows)

  # The same rows, other dense values.
  launch_testing.convert_ratings(path, train, held_out, dense_transform="log1p")
  # The export carries the job's own rules (no transform), from its checkpoint.
  export_checkpoint(workdir, str(tmp_path / "after"))
  after = serving.Predictor.load(str(tmp_path / "after"))
  assert after.info.converter["info"]["dense_transform"] == {"age": "none"}
  np.testing.assert_array_equal(after.predict_rows(rows), before)
  # The eval set converted again too: not the training data's rules. --like of the
  # rebuilt train data would not mend that (it was the advice, and went round).
  with pytest.raises(ValueError) as refused:
    evaluate_checkpoint(workdir)
  assert str(refused.value) == (
    f"train data '{train}' and eval data '{held_out}' disagree: dense_transform:"
    " {'age': 'log1p'} (eval), {'age': 'none'} (train) (the train data"
    f" at '{train}' is gone or converted again since the job trained on it, so --like cannot"
    " take its rules from there: convert the eval data with --vocab_sizes=userId=64,genre=64"
    " and the dense transforms {'age': 'none'}, or put the train data back)"
  )
  # A resume names what differs (it named two fingerprints of the conversion).
  with pytest.raises(checkpointing.IncompatibleCheckpointError) as refused:
    train_and_evaluate(config(8), workdir)
  assert str(refused.value) == (
    f"the data at '{train}' is not the dataset the job in {workdir} trained on (checkpoint"
    " 4): it was converted or generated again since: dense_transform: {'age': 'log1p'} (now),"
    " {'age': 'none'} (trained on). Put the job's dataset back there (same inputs and"
    " options), or train on this data in a new --workdir (the checkpoints are left as they"
    " are)"
  )

  # The job's conversion again: all of it goes on.
  launch_testing.convert_ratings(path, train, held_out)
  evaluate_checkpoint(workdir)
  train_and_evaluate(config(8), workdir)

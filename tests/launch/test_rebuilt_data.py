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
  # The eval set converted again too: not the training data's rules.
  with pytest.raises(
    ValueError,
    match=f"^train data '{train}' and eval data '{held_out}' disagree: dense_transform"
    " {'age': 'log1p'} in the eval data, {'age': 'none'} in the train data",
  ):
    evaluate_checkpoint(workdir)
  with pytest.raises(
    checkpointing.IncompatibleCheckpointError,
    match=r"data iterator state was saved with conversion='[0-9a-f]{16}', but this pipeline has"
    r" conversion='[0-9a-f]{16}'",
  ):
    train_and_evaluate(config(8), workdir)

  # The job's conversion again: all of it goes on.
  launch_testing.convert_ratings(path, train, held_out)
  evaluate_checkpoint(workdir)
  train_and_evaluate(config(8), workdir)

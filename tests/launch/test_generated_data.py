"""A workdir's generated data is reused only with the settings it was generated with."""

import os
import re

import pytest

import launch_testing
from sparsepipe.data import convert_csv
from sparsepipe.data import read_manifest
from sparsepipe.launch.job.training_data import ensure_dataset


@pytest.fixture()
def workdir(tmp_path):
  ensure_dataset(launch_testing.tiny_config(), str(tmp_path), show_progress=False)
  return str(tmp_path)


def test_same_settings_reuse_the_data(workdir):
  data_dir = os.path.join(workdir, "data")
  mtime = os.path.getmtime(os.path.join(data_dir, "manifest.json"))
  assert ensure_dataset(launch_testing.tiny_config(), workdir, show_progress=False) == data_dir
  assert os.path.getmtime(os.path.join(data_dir, "manifest.json")) == mtime


@pytest.mark.parametrize(
  "overrides, change",
  [
    (dict(synthetic__num_examples=2048), "synthetic.num_examples was 1024, the config says 2048"),
    (dict(synthetic__num_dense=5), "synthetic.num_dense was 3, the config says 5"),
    (
      dict(synthetic__examples_per_record=2),
      "synthetic.examples_per_record was 128, the config says 2",
    ),
    (
      dict(synthetic__records_per_shard=4),
      "synthetic.records_per_shard: the shards hold [8] records, the config says 4",
    ),
    (dict(seed=3), "seed was 0, the config says 3"),
    (dict(features__history__max_ids=5), "features.history.max_ids was 8, the config says 5"),
    (dict(features__user__vocab_size=7), "features.user.vocab_size was 5000, the config says 7"),
  ],
)
def test_changed_settings_are_refused_naming_them(workdir, overrides, change):
  data_dir = os.path.join(workdir, "data")
  message = (
    f"'{data_dir}' holds synthetic data generated with other settings ({change}): use a"
    f" new --workdir, or delete '{data_dir}' to generate the data again"
  )
  with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
    ensure_dataset(launch_testing.tiny_config(**overrides), workdir, show_progress=False)
  assert read_manifest(data_dir).num_examples == 1024  # the old data is untouched


def test_a_converted_dataset_in_the_workdir_is_named_as_such(tmp_path):
  """Before: "holds synthetic data generated with other settings (synthetic.num_examples
  was 4, ...)" for a CSV conversion the user had put there."""
  data_dir = tmp_path / "data"
  (tmp_path / "in.csv").write_text("u,label\na,1\nb,0\nc,1\nd,0\n")
  convert_csv([str(tmp_path / "in.csv")], str(data_dir), label_column="label", sparse_columns=["u"])
  with pytest.raises(ValueError) as refused:
    ensure_dataset(launch_testing.tiny_config(), str(tmp_path), show_progress=False)
  assert str(refused.value) == (
    f"'{data_dir}' holds a dataset converted by sparsepipe.data.csv, not data this job"
    " generates: give it as --config.data.dir, or use a new --workdir"
  )

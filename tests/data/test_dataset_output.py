"""Where a converter may write a dataset: never into, over or above a workdir, a dataset
or an export. A converter pointed at a workdir, its checkpoints, an export or the folder
holding them once wrote its dataset among their files, with status 0."""

import os
import subprocess
import sys

import pytest

from sparsepipe.data.convert.output_path import check_dataset_output
from sparsepipe.data import convert_csv

import paths
import saved_work_trees  # pylint: disable=g-bad-import-order

CSV = "user,item,age,label\nu1,i1,30,1\nu2,i2,40,0\nu3,i1,50,1\n"
CSV_ARGS = dict(label_column="label", dense_columns=["age"], sparse_columns=["user", "item"])


@pytest.fixture
def saved(tmp_path):
  return saved_work_trees.saved_work(tmp_path / "saved")


def test_saved_work_and_what_holds_it_are_refused_as_an_output(saved):
  for kind, what in (
    ("workdir", "a workdir (it has job.json)"),
    ("old_workdir", "a workdir (it has checkpoints/)"),
    ("export", "an export (it has export.json)"),
  ):
    with pytest.raises(ValueError) as refused:
      check_dataset_output(saved[kind])
    assert str(refused.value) == (
      f"--output '{saved[kind]}' is {what}: a dataset never replaces or writes into one;"
      " give another --output"
    )
  checkpoints = os.path.join(saved["workdir"], "checkpoints")
  with pytest.raises(ValueError) as refused:
    check_dataset_output(checkpoints, "--eval_output")
  assert str(refused.value) == (
    f"--eval_output '{checkpoints}' is inside workdir '{saved['workdir']}' (it has job.json):"
    " write the dataset outside any workdir, dataset or export"
  )
  inside = os.path.join(saved["dataset"], "eval")
  with pytest.raises(ValueError, match=r"^--output '.*/d/eval' is inside dataset '.*/d' \(it"):
    check_dataset_output(inside)
  parent = os.path.dirname(saved["workdir"])
  with pytest.raises(ValueError) as refused:
    check_dataset_output(parent)
  assert str(refused.value) == (
    f"--output '{parent}' holds dataset 'd' and 3 more: a dataset goes in a folder of its own;"
    " give another --output"
  )


def test_a_new_folder_a_dataset_and_a_folder_of_other_files_are_outputs(saved, tmp_path):
  check_dataset_output(str(tmp_path / "new"))
  check_dataset_output(saved["dataset"])  # replaced only with --overwrite (the writer's check)
  check_dataset_output(saved_work_trees.tree(tmp_path / "notes", {"README": "mine"}))


def test_a_file_is_never_replaced_by_a_dataset(tmp_path):
  (tmp_path / "in.csv").write_text(CSV)
  (tmp_path / "scores.npy").write_text("keep me")
  with pytest.raises(FileExistsError) as refused:
    convert_csv(
      [str(tmp_path / "in.csv")], str(tmp_path / "scores.npy"), overwrite=True, **CSV_ARGS
    )
  assert str(refused.value) == (
    f"'{tmp_path / 'scores.npy'}' is a file, not a directory: a dataset is a directory of its"
    " own; choose another output"
  )
  assert sorted(os.listdir(tmp_path)) == ["in.csv", "scores.npy"]  # no temporary folder left
  assert (tmp_path / "scores.npy").read_text() == "keep me"


def test_the_converter_command_refuses_a_workdir_and_leaves_it_as_it_was(saved, tmp_path):
  (tmp_path / "in.csv").write_text(CSV)
  before = saved_work_trees.digests(tmp_path / "saved")
  out = subprocess.run(
    [sys.executable, "-m", "sparsepipe.data.csv", "--input", str(tmp_path / "in.csv")]
    + ["--output", saved["workdir"], "--overwrite", "--label_column", "label"]
    + ["--sparse_columns", "user,item", "--dense_columns", "age"],
    capture_output=True,
    text=True,
    check=False,
    timeout=120,
    cwd=paths.REPO_ROOT,
  )
  assert (out.returncode, out.stdout) == (1, "")
  assert out.stderr == (
    f"error: --output '{saved['workdir']}' is a workdir (it has job.json): a dataset never"
    " replaces or writes into one; give another --output\n"
  )
  assert saved_work_trees.digests(tmp_path / "saved") == before

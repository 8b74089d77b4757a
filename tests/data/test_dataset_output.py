"""Where a converter may write a dataset: never into, over or above a workdir, a dataset
or an export. A converter pointed at a workdir, its checkpoints, an export or the folder
holding them once wrote its dataset among their files, with status 0."""

import os
import subprocess
import sys

import pytest

from sparsepipe.data.convert.outputs import check_dataset_output
from sparsepipe.core import saved_work
from sparsepipe.data import convert_csv

import paths
import saved_work_trees  # pylint: disable=g-bad-import-order
import subprocess_harness as harness  # pylint: disable=g-bad-import-order

CSV = "user,item,age,label\nu1,i1,30,1\nu2,i2,40,0\nu3,i1,50,1\n"
MANY_ROWS = CSV + "".join(f"u{i},i{i % 3},{i},{i % 2}\n" for i in range(60))
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


def _convert(tmp_path, *args):
  return harness.run_module(
    "sparsepipe.data.csv",
    *["--input", str(tmp_path / "in.csv"), "--label_column", "label"],
    *["--sparse_columns", "user,item", "--dense_columns", "age", *args],
  )


def test_an_overwrite_through_a_symbolic_link_is_refused_and_both_splits_stay(tmp_path):
  """--overwrite onto a link to an eval split once published the new eval split in place
  of the link and then failed ('Cannot call rmtree on a symbolic link'): a new eval split
  beside the old train split, sharing examples with it."""
  (tmp_path / "in.csv").write_text(MANY_ROWS)
  tr, real_ev, ev = (str(tmp_path / n) for n in ("tr", "real_ev", "ev"))
  first = _convert(tmp_path, "--output", tr, "--eval_output", real_ev, "--eval_fraction", "0.2")
  assert first.returncode == 0, first.stderr
  os.symlink(real_ev, ev)
  before = saved_work_trees.digests(tmp_path)
  again = [tmp_path, "--output", tr, "--eval_output", ev, "--eval_fraction", "0.5", "--overwrite"]
  out = _convert(*again)
  assert (out.returncode, out.stdout) == (1, "")
  assert out.stderr == (
    f"error: --eval_output '{ev}' is a symbolic link (to '{real_ev}'): give the folder itself\n"
  )
  assert saved_work_trees.digests(tmp_path) == before
  assert os.path.islink(ev) and sorted(os.listdir(tmp_path)) == ["ev", "in.csv", "real_ev", "tr"]


def test_two_outputs_one_inside_the_other_are_refused_before_anything_is_written(tmp_path):
  (tmp_path / "in.csv").write_text(MANY_ROWS)
  for output, eval_output, message in (
    ("tr", "tr/ev", "the eval output '{1}' is inside the train output '{0}'"),
    ("ev2/tr", "ev2", "the train output '{0}' is inside the eval output '{1}'"),
  ):
    output, eval_output = str(tmp_path / output), str(tmp_path / eval_output)
    out = _convert(tmp_path, "--output", output, "--eval_output", eval_output)
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == (
      f"error: {message.format(output, eval_output)}: give two folders, neither inside the other\n"
    )
    assert sorted(os.listdir(tmp_path)) == ["in.csv"]
  os.symlink(str(tmp_path), str(tmp_path / "here"))
  with pytest.raises(ValueError) as refused:
    convert_csv(
      [str(tmp_path / "in.csv")],
      str(tmp_path / "a"),
      eval_output=str(tmp_path / "here" / "a"),
      eval_fraction=0.5,
      **CSV_ARGS,
    )
  assert str(refused.value) == (
    f"the eval output '{tmp_path / 'here' / 'a'}' is the train output '{tmp_path / 'a'}'"
  )


def test_a_library_writer_refuses_a_symbolic_link(tmp_path):
  (tmp_path / "in.csv").write_text(CSV)
  os.mkdir(tmp_path / "target")
  os.symlink(str(tmp_path / "target"), str(tmp_path / "link"))
  with pytest.raises(ValueError) as refused:
    convert_csv([str(tmp_path / "in.csv")], str(tmp_path / "link"), **CSV_ARGS)
  assert str(refused.value) == (
    f"the output '{tmp_path / 'link'}' is a symbolic link (to '{tmp_path / 'target'}'):"
    " give the folder itself"
  )
  assert os.listdir(tmp_path / "target") == []


def test_saved_work_at_any_depth_below_an_output_is_found(tmp_path, monkeypatch):
  """Before: only the output's own entries were looked at, so a converter wrote its
  dataset into a folder with an export two levels down (and `rm -r` of it would
  have taken the export)."""
  deep = saved_work_trees.tree(
    tmp_path / "deep",
    {"a/b/export.json": saved_work_trees.EXPORT, "a/notes.txt": "", "z/x/y/job.json": "{}"},
  )
  with pytest.raises(ValueError) as refused:
    check_dataset_output(deep)
  assert str(refused.value) == (
    f"--output '{deep}' holds export 'a/b' and 1 more: a dataset goes in a folder of its own;"
    " give another --output"
  )
  # A folder too large to search is refused, not searched for minutes.
  monkeypatch.setattr(saved_work, "SEARCH_LIMIT", 3)
  many = saved_work_trees.tree(tmp_path / "many", {"f1/x.txt": "", "f2/y.txt": ""})
  with pytest.raises(ValueError, match=r"holds more than 3 entries \(not all searched for saved"):
    check_dataset_output(many)
  check_dataset_output(saved_work_trees.tree(tmp_path / "few", {"f1/x.txt": "", "f2": ""}))

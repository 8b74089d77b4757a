"""A job's workdir is never a dataset or an export, nor inside saved work. Pointed at
its own dataset, an export or another job's checkpoints/, a launch once trained and
wrote job.json, checkpoints/ and metrics there, with status 0."""

import os
import sys

import pytest

from sparsepipe import launch
from sparsepipe.launch.workdir.location import check_workdir

import launch_testing  # pylint: disable=g-bad-import-order
import saved_work_trees  # pylint: disable=g-bad-import-order
import subprocess_harness as harness  # pylint: disable=g-bad-import-order


@pytest.fixture
def saved(tmp_path):
  return saved_work_trees.saved_work(tmp_path / "saved")


def test_a_dataset_an_export_and_what_is_inside_saved_work_are_refused(saved):
  for kind, what in (
    ("dataset", "a dataset (it has manifest.json)"),
    ("export", "an export (it has export.json)"),
  ):
    with pytest.raises(ValueError) as refused:
      check_workdir(saved[kind])
    assert str(refused.value) == (
      f"--workdir '{saved[kind]}' is {what}: a job never replaces or writes into one;"
      " give another --workdir"
    )
  checkpoints = os.path.join(saved["old_workdir"], "checkpoints")
  with pytest.raises(ValueError) as refused:
    check_workdir(checkpoints)
  assert str(refused.value) == (
    f"--workdir '{checkpoints}' is inside workdir '{saved['old_workdir']}' (it has"
    " checkpoints/): write the job's files outside any workdir, dataset or export"
  )
  with pytest.raises(ValueError, match=r"^--workdir '.*/d/job' is inside dataset '.*/d' \(it"):
    check_workdir(os.path.join(saved["dataset"], "job"))


def test_a_workdir_a_new_folder_and_a_folder_of_its_own_data_are_workdirs(saved, tmp_path):
  check_workdir(saved["workdir"])
  check_workdir(saved["old_workdir"])
  check_workdir(str(tmp_path / "new"))
  # The data a job generates there (e.g. left by a start killed before job.json).
  generated = {"data/manifest.json": saved_work_trees.DATASET, "data_eval/manifest.json": ""}
  check_workdir(saved_work_trees.tree(tmp_path / "k", generated), ("data", "data_eval"))
  # Another framework's checkpoints/ beside the jobs does not make their folder a workdir.
  project = saved_work_trees.tree(tmp_path / "project", {"checkpoints/epoch=0.ckpt": ""})
  check_workdir(os.path.join(project, "workdir", "demo"))


def test_a_job_pointed_at_its_dataset_writes_nothing_there(tmp_path):
  config = launch_testing.tiny_config(num_steps=2)
  dataset = saved_work_trees.tree(tmp_path / "d", {"manifest.json": saved_work_trees.DATASET})
  before = saved_work_trees.digests(dataset)
  with pytest.raises(ValueError, match=r"^--workdir '.*/d' is a dataset \(it has manifest.json\)"):
    launch.train_and_evaluate(config, dataset)
  assert saved_work_trees.digests(dataset) == before and os.listdir(dataset) == ["manifest.json"]


def test_the_launcher_names_the_dataset_in_one_line(tmp_path):
  dataset = saved_work_trees.tree(tmp_path / "d", {"manifest.json": saved_work_trees.DATASET})
  command = [sys.executable, "-m", "sparsepipe.launch", f"--workdir={dataset}"]
  out = harness.run(command, env=harness.cpu_env(1), timeout_s=300)
  assert out.returncode == 1, out.stderr
  assert out.stderr.splitlines()[-1] == (
    f"error: --workdir '{dataset}' is a dataset (it has manifest.json): a job never replaces"
    " or writes into one; give another --workdir"
  )
  assert os.listdir(dataset) == ["manifest.json"]


def test_a_new_job_is_refused_a_folder_holding_saved_work_and_writes_nothing(saved, tmp_path):
  """`--workdir=workdir` (for workdir/demo) trained there with status 0, and its
  job.json then put every job inside it inside a workdir, where none resumed."""
  root = os.path.dirname(saved["dataset"])
  before = saved_work_trees.digests(root)
  with pytest.raises(ValueError) as refused:
    launch.train_and_evaluate(launch_testing.tiny_config(num_steps=2), root)
  assert str(refused.value) == (
    f"--workdir '{root}' holds dataset 'd' and 3 more: a job keeps its files in a folder of"
    " its own; give another --workdir"
  )
  assert saved_work_trees.digests(root) == before
  assert sorted(os.listdir(root)) == ["d", "e", "notes.txt", "w", "w02"]
  # Its own generated data does not count; anything else named so does.
  project = saved_work_trees.tree(tmp_path / "p", {"data/manifest.json": saved_work_trees.DATASET})
  check_workdir(project, ("data",))
  with pytest.raises(ValueError, match=r"^--workdir '.*/p' holds dataset 'data': a job keeps"):
    check_workdir(project)


def test_a_new_job_is_refused_a_folder_with_saved_work_deeper_down(tmp_path):
  """Before: a job trained in `deep` with an export at deep/a/exp, which then sat
  inside a workdir (and `rm -r` of the workdir would have taken it)."""
  deep = saved_work_trees.tree(tmp_path / "deep", {"a/exp/export.json": saved_work_trees.EXPORT})
  with pytest.raises(ValueError) as refused:
    check_workdir(deep)
  assert str(refused.value) == (
    f"--workdir '{deep}' holds export 'a/exp': a job keeps its files in a folder of its own;"
    " give another --workdir"
  )


def test_a_file_is_never_a_workdir(tmp_path):
  """Before: "error: [Errno 17] File exists", naming neither the flag nor why."""
  (tmp_path / "notes").write_text("mine")
  with pytest.raises(ValueError) as refused:
    check_workdir(str(tmp_path / "notes"))
  assert str(refused.value) == (
    f"--workdir '{tmp_path / 'notes'}' is a file: a job keeps its files in a folder; give"
    " another --workdir"
  )

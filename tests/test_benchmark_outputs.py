"""The benchmarks' outputs (their --json, the folders they keep runs in) never write
into or over saved work, and say so before the benchmark runs (benchmarks/outputs.py)."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
from absl import app

import paths  # pylint: disable=g-bad-import-order
import saved_work_trees  # pylint: disable=g-bad-import-order

BENCHMARKS = os.path.join(paths.REPO_ROOT, "benchmarks")
sys.path.insert(0, BENCHMARKS)
import outputs  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

_CHECKED = ("outputs.json_flag(", "type=outputs.argparse_path", "type=_figures_path")


def _scripts_with_json() -> list[str]:
  names = sorted(n for n in os.listdir(BENCHMARKS) if n.endswith(".py") and n != "outputs.py")
  out = []
  for name in names:
    with open(os.path.join(BENCHMARKS, name)) as f:
      if "--json" in f.read():
        out.append(name)
  return out


@pytest.mark.parametrize("name", _scripts_with_json())
def test_every_benchmark_json_flag_is_checked_and_written_whole(name):
  """Before: 16 scripts wrote --json with open(path, "w") after minutes of work,
  over a dataset's manifest.json or a job's job.json alike."""
  with open(os.path.join(BENCHMARKS, name)) as f:
    source = f.read()
  assert any(checked in source for checked in _CHECKED), name
  assert not re.search(r"open\([^)]*json[^)]*\"w\"\)", source, re.IGNORECASE), name


def _run(script, *args, cwd):
  return subprocess.run(
    [sys.executable, os.path.join(BENCHMARKS, script), *args],
    cwd=cwd,
    capture_output=True,
    text=True,
    timeout=120,
  )


def test_an_absl_benchmark_refuses_a_json_inside_a_dataset_before_it_runs(tmp_path):
  work = saved_work_trees.saved_work(tmp_path)
  before = saved_work_trees.digests(tmp_path)
  done = _run("step.py", "--json", "d/manifest.json", cwd=tmp_path)
  assert done.returncode == 1
  assert (
    f"flag --json=d/manifest.json: --json '{work['dataset']}/manifest.json' is inside dataset"
    f" '{work['dataset']}' (it has manifest.json): write the figures outside any workdir,"
    " dataset or export"
  ) in done.stderr
  assert saved_work_trees.digests(tmp_path) == before


def test_an_argparse_benchmark_refuses_a_json_in_a_workdir_before_it_runs(tmp_path):
  work = saved_work_trees.saved_work(tmp_path)
  before = saved_work_trees.digests(tmp_path)
  done = _run("checkpoint.py", "--json", "w/job.json", cwd=tmp_path)
  assert done.returncode == 2
  assert done.stderr.splitlines()[-1] == (
    f"checkpoint.py: error: argument --json: --json '{work['workdir']}/job.json' is inside"
    f" workdir '{work['workdir']}' (it has job.json): write the figures outside any workdir,"
    " dataset or export"
  )
  assert saved_work_trees.digests(tmp_path) == before


def test_json_output_refuses_a_folder_and_a_missing_folder_and_replaces_a_file(tmp_path):
  with pytest.raises(ValueError, match=r"^--json '.*/out' is a folder: give the path"):
    os.mkdir(tmp_path / "out")
    outputs.check(str(tmp_path / "out"))
  with pytest.raises(ValueError, match=r"its folder '.*/nowhere' does not exist$"):
    outputs.check(str(tmp_path / "nowhere" / "f.json"))
  path = tmp_path / "f.json"
  path.write_text("old")
  outputs.check(str(path))  # a rerun replaces its figures
  outputs.write(str(path), {"a": [1, 2]}, sort_keys=True)
  assert json.loads(path.read_text()) == {"a": [1, 2]}
  assert sorted(os.listdir(tmp_path)) == ["f.json", "out"]


def test_torchrec_benchmark_replaces_only_its_own_figures(tmp_path):
  """torchrec_dlrm.py runs without sparsepipe: it takes a new file or its own figures."""
  spec = importlib.util.spec_from_file_location(
    "torchrec_dlrm", os.path.join(BENCHMARKS, "torchrec_dlrm.py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  ours, theirs = tmp_path / "ours.json", tmp_path / "manifest.json"
  ours.write_text(json.dumps({"benchmark": "torchrec_dlrm"}))
  theirs.write_text(saved_work_trees.DATASET)
  assert module._figures_path(str(ours)) == str(ours)
  assert module._figures_path(str(tmp_path / "new.json")) == str(tmp_path / "new.json")
  with pytest.raises(Exception, match=r"exists and is not this benchmark's figures: give a new"):
    module._figures_path(str(theirs))
  with pytest.raises(Exception, match=r"its folder '.*/nowhere' does not exist$"):
    module._figures_path(str(tmp_path / "nowhere" / "f.json"))


def test_a_runs_folder_is_new_empty_or_kept_by_the_same_benchmark(tmp_path):
  work = saved_work_trees.saved_work(tmp_path / "saved")
  with pytest.raises(app.UsageError) as refused:
    outputs.runs_folder(work["dataset"], "resize", "--workdir")
  assert str(refused.value) == (
    f"--workdir '{work['dataset']}' is a dataset (it has manifest.json): resize.py never replaces"
    " or writes into one; give another --workdir"
  )
  inside = os.path.join(work["workdir"], "runs")
  with pytest.raises(
    app.UsageError, match=r"^--data_root '.*/w/runs' is inside workdir '.*/w' \(it"
  ):
    outputs.runs_folder(inside, "startup", "--data_root")
  new = str(tmp_path / "new")
  assert outputs.runs_folder(new, "quality", "--workdir") == new
  assert json.loads((tmp_path / "new" / outputs.MARKER).read_text()) == {"benchmark": "quality"}
  (tmp_path / "new" / "ratings").mkdir()
  assert outputs.runs_folder(new, "quality", "--workdir") == new  # a rerun
  with pytest.raises(app.UsageError) as refused:
    outputs.runs_folder(new, "resize", "--workdir")
  assert str(refused.value) == (
    f"--workdir '{new}' is kept by quality.py: give a new or empty folder, or one resize.py kept"
    " before"
  )
  assert not os.path.exists(inside)


def test_quality_refuses_a_workdir_holding_a_dataset_it_did_not_make(tmp_path):
  """Before: --workdir R replaced the dataset R/ratings (and R/ml-100k.csv)."""
  saved_work_trees.tree(tmp_path / "R", {"ratings/manifest.json": saved_work_trees.DATASET})
  before = saved_work_trees.digests(tmp_path)
  done = _run("quality.py", "--workdir", "R", "--parts", "demo", cwd=tmp_path)
  assert done.returncode == 1
  assert (
    f"--workdir '{tmp_path / 'R'}' holds dataset 'ratings', not kept by quality.py: give a new"
    " or empty folder, or one quality.py kept before"
  ) in done.stderr
  assert saved_work_trees.digests(tmp_path) == before

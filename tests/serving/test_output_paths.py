"""Where an export or a scores file may be written: never into or over a workdir, a dataset,
an export or the command's inputs (the commands' refusals are in test_export.py)."""

import os

import pytest

from sparsepipe import serving

import saved_work_trees  # pylint: disable=g-bad-import-order


@pytest.fixture
def saved(tmp_path):
  return saved_work_trees.saved_work(tmp_path)


def test_saved_work_is_recognised_by_the_file_that_makes_it(saved, tmp_path):
  assert serving.saved_work(saved["workdir"]) == ("workdir", "job.json")
  assert serving.saved_work(saved["old_workdir"]) == ("workdir", "checkpoints/")
  assert serving.saved_work(saved["dataset"]) == ("dataset", "manifest.json")
  assert serving.saved_work(saved["export"]) == ("export", "export.json")
  assert serving.saved_work(saved["file"]) is None
  assert serving.saved_work(str(tmp_path)) is None
  # Another program's manifest.json (e.g. a web app's) is not a dataset; a damaged one is.
  other = saved_work_trees.tree(tmp_path / "app", {"manifest.json": '{"name": "app"}'})
  assert serving.saved_work(other) is None
  serving.check_export_output(os.path.join(other, "model"), overwrite=False)
  damaged = saved_work_trees.tree(
    tmp_path / "damaged", {"manifest.json": '{"format": "sparsepipe.arr'}
  )
  assert serving.saved_work(damaged) == ("dataset", "manifest.json")


@pytest.mark.parametrize(
  "kind, inside, marker",
  [
    ("workdir", "checkpoints", "job.json"),
    ("workdir", "", "job.json"),
    ("old_workdir", "checkpoints/4", "checkpoints/"),
    ("dataset", "new", "manifest.json"),
    ("export", "tables", "export.json"),
  ],
)
def test_an_export_inside_saved_work_is_refused_with_or_without_overwrite(
  saved, kind, inside, marker
):
  top = saved[kind]
  output = os.path.join(top, inside, "export") if inside else os.path.join(top, "export")
  noun = "workdir" if kind.endswith("workdir") else kind
  for overwrite in (False, True):
    with pytest.raises(serving.OutputPathError) as e:
      serving.check_export_output(output, overwrite=overwrite)
    assert str(e.value) == (
      f"--output '{output}' is inside {noun} '{top}' (it has {marker}): write the export"
      " outside any workdir, dataset or export"
    )


@pytest.mark.parametrize(
  "kind, marker",
  [("workdir", "job.json"), ("old_workdir", "checkpoints/"), ("dataset", "manifest.json")],
)
def test_an_export_never_replaces_a_workdir_or_a_dataset(saved, kind, marker):
  noun = "workdir" if kind.endswith("workdir") else kind
  for overwrite in (False, True):
    with pytest.raises(serving.OutputPathError) as e:
      serving.check_export_output(saved[kind], overwrite=overwrite)
    assert str(e.value) == (
      f"--output '{saved[kind]}' is a {noun} (it has {marker}): an export never replaces or"
      " writes into one; give another --output"
    )


def test_overwrite_replaces_only_an_export_that_holds_only_its_own_files(saved, tmp_path):
  serving.check_export_output(saved["export"], overwrite=True)
  with pytest.raises(FileExistsError) as e:
    serving.check_export_output(saved["export"], overwrite=False)
  assert str(e.value) == (
    f"'{saved['export']}' exists: give --overwrite to replace it, or another --output"
  )
  saved_work_trees.tree(saved["export"], {"README": "", "run/job.json": "{}"})
  with pytest.raises(serving.OutputPathError) as e:
    serving.check_export_output(saved["export"], overwrite=True)
  assert str(e.value) == (
    f"--output '{saved['export']}' is an export that also holds workdir 'run' and 1 more:"
    " --overwrite replaces only an export and what it wrote; give another --output"
  )
  with pytest.raises(serving.OutputPathError, match=r"is a file, not an export: --overwrite"):
    serving.check_export_output(saved["file"], overwrite=True)
  # A folder above saved work (holding it) is not an export.
  with pytest.raises(serving.OutputPathError) as e:
    serving.check_export_output(str(tmp_path), overwrite=True)
  assert str(e.value) == (
    f"--output '{tmp_path}' is a folder, not an export: it holds dataset 'd' and 4 more:"
    " --overwrite replaces only an export and what it wrote; give another --output"
  )
  empty = tmp_path / "empty"
  empty.mkdir()
  serving.check_export_output(str(empty), overwrite=True)
  serving.check_export_output(str(tmp_path / "new"), overwrite=False)


def test_an_export_is_never_one_of_the_commands_inputs(saved, tmp_path):
  inputs = [("the --since export", saved["export"])]
  with pytest.raises(serving.OutputPathError) as e:
    serving.check_export_output(saved["export"], overwrite=True, inputs=inputs)
  assert str(e.value) == (
    f"--output '{saved['export']}' is also the --since export: an output never replaces or"
    " writes into the command's inputs; give another --output"
  )
  plain = saved_work_trees.tree(tmp_path / "plain", {"a": ""})
  inputs = [("the --base export", os.path.join(plain, "base"))]
  with pytest.raises(serving.OutputPathError, match=r"' holds the --base export '.*/plain/base':"):
    serving.check_export_output(plain, overwrite=True, inputs=inputs)


def test_a_symbolic_link_is_not_replaced(saved, tmp_path):
  link = tmp_path / "link"
  link.symlink_to(saved["export"])
  with pytest.raises(serving.OutputPathError) as e:
    serving.check_export_output(str(link), overwrite=True)
  assert str(e.value) == (
    f"--output '{link}' is a symbolic link (to '{saved['export']}'): give the folder itself"
  )
  inside = tmp_path / "into_workdir"
  inside.symlink_to(saved["workdir"])
  with pytest.raises(serving.OutputPathError, match=r"is inside workdir '.*/w' \(it has job"):
    serving.check_export_output(str(inside / "export"), overwrite=True)


def test_a_scores_file_is_never_written_into_saved_work(saved, tmp_path):
  for kind in ("workdir", "dataset", "export"):
    output = os.path.join(saved[kind], "scores.npy")
    with pytest.raises(serving.OutputPathError, match=rf"^--output '{output}' is inside {kind} "):
      serving.check_file_output(output, overwrite=True)
  output = os.path.join(saved["export"], "params.npz")
  with pytest.raises(serving.OutputPathError) as e:
    serving.check_file_output(output, overwrite=True)
  assert str(e.value) == (
    f"--output '{output}' is inside export '{saved['export']}' (it has export.json): write the"
    " scores outside any workdir, dataset or export"
  )
  for kind, what in (
    ("dataset", "a dataset (it has manifest.json)"),
    ("export", "an export (it has export.json)"),
  ):
    with pytest.raises(serving.OutputPathError) as e:
      serving.check_file_output(saved[kind], overwrite=True)
    assert str(e.value) == f"--output '{saved[kind]}' is {what}: give the path of the file to write"
  with pytest.raises(FileExistsError) as e:
    serving.check_file_output(saved["file"], overwrite=False)
  assert str(e.value) == (
    f"'{saved['file']}' exists: give --overwrite to replace it, or another --output"
  )
  serving.check_file_output(saved["file"], overwrite=True)
  missing = tmp_path / "no" / "scores.npy"
  with pytest.raises(serving.OutputPathError) as e:
    serving.check_file_output(str(missing), overwrite=False)
  assert str(e.value) == f"--output '{missing}': its folder '{tmp_path / 'no'}' does not exist"
  # Before: "scores/" (a folder, not yet made) got a file named "scores".
  with pytest.raises(serving.OutputPathError) as e:
    serving.check_file_output(f"{tmp_path}/scores/", overwrite=True)
  assert str(e.value) == (
    f"--output '{tmp_path}/scores/' names a folder: give the path of the file to write"
  )

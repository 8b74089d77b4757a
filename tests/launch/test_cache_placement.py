"""The compilation cache never goes into, or inside, saved work or the job's workdir.
`--config.compilation_cache_dir` naming a dataset, an export or a workdir once wrote
jax/ and numba-v2/ there, and a dataset or export with them was then refused to
--overwrite as one "with other files"."""

import os

import pytest

from sparsepipe import launch
from sparsepipe.core import compile_cache

import launch_testing  # pylint: disable=g-bad-import-order
import saved_work_trees  # pylint: disable=g-bad-import-order

FLAG = "config.compilation_cache_dir"


@pytest.fixture
def saved(tmp_path):
  return saved_work_trees.saved_work(tmp_path / "saved")


def test_a_cache_in_or_inside_saved_work_is_refused(saved, tmp_path):
  for kind, what in (
    ("dataset", "a dataset (it has manifest.json)"),
    ("export", "an export (it has export.json)"),
    ("workdir", "a workdir (it has job.json)"),
  ):
    with pytest.raises(ValueError) as refused:
      compile_cache.check_root(saved[kind])
    assert str(refused.value) == (
      f"{FLAG} '{saved[kind]}' is {what}: the compilation cache never replaces or writes into"
      f" one; give another {FLAG}"
    )
  inside = os.path.join(saved["export"], "cache")
  with pytest.raises(ValueError) as refused:
    compile_cache.check_root(inside)
  assert str(refused.value) == (
    f"{FLAG} '{inside}' is inside export '{saved['export']}' (it has export.json): write the"
    " compiled programs outside any workdir, dataset or export"
  )
  new_job = tmp_path / "new_job"  # not saved work before its first start
  with pytest.raises(ValueError) as refused:
    compile_cache.check_root(str(new_job / "cache"), str(new_job))
  assert str(refused.value) == (
    f"{FLAG} '{new_job / 'cache'}' is inside the job's workdir '{new_job}': write the compiled"
    " programs outside any workdir, dataset or export"
  )
  compile_cache.check_root(str(tmp_path / "cache"), str(new_job))
  # The commands that read a saved job's setting go on without the cache.
  assert compile_cache.enable(saved["dataset"], refused="warn") is None


def test_a_job_with_its_cache_in_a_dataset_is_refused_before_anything_is_made(saved, tmp_path):
  before = saved_work_trees.digests(tmp_path)
  config = launch_testing.tiny_config(num_steps=2, compilation_cache_dir=saved["dataset"])
  with pytest.raises(ValueError, match=rf"^{FLAG} '.*/d' is a dataset \(it has manifest.json\)"):
    launch.train_and_evaluate(config, str(tmp_path / "job"))
  assert saved_work_trees.digests(tmp_path) == before
  assert not os.path.exists(tmp_path / "job")

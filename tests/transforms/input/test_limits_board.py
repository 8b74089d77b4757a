"""The input switches COO limits at an FDO retune point without restarting its workers."""

import os
import subprocess
import sys
import tempfile

import datasets
import jax
import numpy as np
import pytest

from sparsepipe import data
from sparsepipe import transforms as T
from sparsepipe.transforms.input import limits_board

S = 2
FEATURES = (data.SyntheticFeature("a", 40, 1, 3), data.SyntheticFeature("b", 24, 0, 4))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("board") / "ds")
  datasets.write_numbered(path, FEATURES, 93, 5, max_records_per_shard=6)
  return path


def make_input(path, specs, *, workers=0, last_retune=None):
  return T.make_host_input(
    # Limits from 4 batches' statistics: a later batch may exceed them (drops counted).
    T.InputConfig(
      path, 12, seed=7, num_sc_per_device=S, num_workers=workers, allow_id_dropping=True
    ),
    specs,
    local_device_count=2,
    global_device_count=2,
    last_retune=last_retune,
  )


def retune_after_4(index):
  return 4 if index >= 4 else None


def arrays(batch):
  return [np.asarray(x) for x in jax.tree.leaves(batch)]


def same(got, want):
  """Equal arrays (the COO padding is NaN: assert_array_equal takes NaN == NaN)."""
  for a, b in zip(arrays(got), arrays(want), strict=True):
    np.testing.assert_array_equal(a, b)
  return True


@pytest.mark.parametrize("workers", [0, 1])
def test_batches_after_the_retune_point_take_the_published_limits(dataset, workers):
  specs = datasets.feature_specs(FEATURES, 12, 2, S, limit=64)
  live = make_input(dataset, specs, workers=workers, last_retune=retune_after_4)
  first = [next(live) for _ in range(4)]  # the workers read ahead past the retune point
  state = live.get_state()
  tuned = T.update_preprocessing_parameters(specs, live.stats_totals().as_stats(), S, 2)
  assert T.get_stack_limits(tuned) != T.get_stack_limits(specs)
  live.publish_limits(4, tuned)
  after = [next(live) for _ in range(3)]
  assert live.pipeline_starts == 1
  # The same batches from an input made for each set of limits.
  before_ref = make_input(dataset, specs)
  for got in first:
    want = next(before_ref)
    assert same(got.batch, want.batch)
  after_ref = make_input(dataset, tuned)
  after_ref.set_state(state)
  for got in after:
    want = next(after_ref)
    assert same(got.batch, want.batch)
  assert [x.shape for x in arrays(after[0].batch)] != [x.shape for x in arrays(first[0].batch)]
  assert same(live.batch_at(5).batch, after[1].batch)
  live.close()


def test_limits_published_late_or_off_a_retune_point_are_errors(dataset):
  specs = datasets.feature_specs(FEATURES, 12, 2, S, limit=64)
  live = make_input(dataset, specs, last_retune=retune_after_4)
  with pytest.raises(
    ValueError,
    match=r"^batch 5 is preprocessed with the limits of the FDO"
    r" retune after batch 4, which are not published yet$",
  ):
    live.batch_at(5)
  with pytest.raises(ValueError, match=r"after batch 3, which is not a retune point"):
    live.publish_limits(3, specs)
  for _ in range(4):
    next(live)
  live.publish_limits(4, specs)
  next(live)
  with pytest.raises(ValueError, match=r"^limits after batch 4 published after batch 5 was"):
    live.publish_limits(4, specs)
  live.close()
  fixed = make_input(dataset, specs)
  with pytest.raises(ValueError, match=r"not a retune point of this input"):
    fixed.publish_limits(4, specs)


def test_a_killed_runs_board_directory_is_removed_by_the_next_board(tmp_path, monkeypatch):
  """A run killed with SIGKILL cannot remove its directory: the next board opened removes
  it, and keeps a live run's, one without an owner lock (an older version's) and others."""
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  script = (
    "import sys, tempfile, time; tempfile.tempdir = sys.argv[1];"
    " from sparsepipe.transforms.input.limits_board import LimitsBoard;"
    " board = LimitsBoard(None); board.open(); print(board.directory, flush=True);"
    " time.sleep(600)"
  )
  killed = subprocess.Popen(
    [sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True
  )
  dead = killed.stdout.readline().strip()
  killed.kill()
  killed.wait()
  killed.stdout.close()
  assert os.path.isdir(dead) and os.path.dirname(dead) == str(tmp_path)
  live = limits_board.LimitsBoard(None)
  live.open()
  (tmp_path / "sparsepipe_limits_older").mkdir()
  (tmp_path / "other").mkdir()
  board = limits_board.LimitsBoard(None)
  board.open()
  kept = {os.path.basename(b.directory) for b in (live, board)}
  assert set(os.listdir(tmp_path)) == kept | {"sparsepipe_limits_older", "other"}
  assert limits_board.remove_abandoned_boards() == []
  board.close()
  live.close()
  assert sorted(os.listdir(tmp_path)) == ["other", "sparsepipe_limits_older"]

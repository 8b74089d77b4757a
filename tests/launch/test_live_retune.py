"""An FDO retune changes the limits without stopping the input or the pipeline."""

import jax
import pytest

from sparsepipe import transforms
from sparsepipe.launch import train_and_evaluate
from sparsepipe.transforms.input import host_input

import launch_testing  # pylint: disable=g-bad-import-order
import subprocess_harness as harness  # pylint: disable=g-bad-import-order

_DEADLINE_S = 480  # generous: the tests share two busy cores


class _InputWatch:
  """Counts the starts of the input's workers and records each batch's COO buffer size."""

  def __init__(self, monkeypatch):
    self.worker_starts = 0
    self.sizes: dict[int, int] = {}
    start_workers, take = host_input.prefetch_in_workers, transforms.InputIterator.__next__

    def counting(*args, **kwargs):
      self.worker_starts += 1
      return start_workers(*args, **kwargs)

    def recording(iterator):
      index = iterator.next_batch
      batch = take(iterator)
      self.sizes[index] = sum(leaf.size for leaf in jax.tree.leaves(batch.unpacked().sparse))
      return batch

    monkeypatch.setattr(host_input, "prefetch_in_workers", counting)
    monkeypatch.setattr(transforms.InputIterator, "__next__", recording)


@pytest.mark.parametrize("pipelining", [False, True])
def test_a_retune_changes_the_limits_without_restarting_the_input(
  tmp_path, monkeypatch, pipelining
):
  """Retunes after batches 2, 4 and 8 of 10, two data workers: the workers start once, the
  batches from index 2 on have the smaller tuned buffers, and the losses are bitwise those
  of the job with limits that FDO leaves at the worst case (a headroom past what a batch
  can fill) and of the job without FDO: pipelined, the batches in flight at a retune are
  handed to the next segment, re-laid out for its limits, so nothing drains."""
  common = dict(num_steps=10, data__num_workers=2, pipelining=pipelining, fdo__first_after=2)
  watch = _InputWatch(monkeypatch)
  fixed = str(tmp_path / "fixed")
  train_and_evaluate(launch_testing.tiny_config(fdo__headroom=100.0, **common), fixed)
  assert [e["batch"] for e in launch_testing.events(fixed, "fdo")] == [2, 4, 8]
  worst_case = watch.sizes[0]
  assert set(watch.sizes.values()) == {worst_case}  # FDO left the limits as they were
  watch.sizes, watch.worker_starts = {}, 0
  tuned = str(tmp_path / "tuned")
  train_and_evaluate(launch_testing.tiny_config(**common), tuned)
  assert [e["batch"] for e in launch_testing.events(tuned, "fdo")] == [2, 4, 8]
  assert watch.worker_starts == 1
  assert sorted(watch.sizes) == list(range(10))
  assert watch.sizes[0] == watch.sizes[1] == worst_case > watch.sizes[2]
  assert launch_testing.batch_losses(tuned) == launch_testing.batch_losses(fixed)
  off = str(tmp_path / "off")
  train_and_evaluate(launch_testing.tiny_config(**{**common, "fdo__every_steps": 0}), off)
  assert launch_testing.events(off, "fdo") == []
  assert launch_testing.batch_losses(tuned) == launch_testing.batch_losses(off)


@pytest.mark.parametrize("pipelining", [False, True])
def test_a_job_resumed_with_other_fdo_fields_retunes_at_their_next_point(tmp_path, pipelining):
  """FDO every 8, stopped after batch 10, resumed with fdo.every_steps=4 (a field a
  resumed job may change): the segment of batches 9-16 is cut at 12, where the input's
  workers switch limits. It kept its planned end 16 while the workers waited for the
  limits of 12, and the job hung for good at batch 12 (SIGTERM did not end it): run as a
  subprocess here, with a deadline."""
  config = dict(
    num_steps=16,
    fdo__first_after=0,
    pipelining=pipelining,
    data__num_workers=2,
    checkpoint__every_steps=2,
    checkpoint__keep=10,
  )
  workdir = str(tmp_path / "job")
  train_and_evaluate(launch_testing.tiny_config(fdo__every_steps=8, **config), workdir)
  first = launch_testing.batch_losses(workdir)
  launch_testing.remove_checkpoints_after(workdir, 10)  # as if stopped after batch 10
  command = launch_testing.launch_command(workdir, fdo__every_steps=4, **config)
  # On the deadline its process group is killed and a TimeoutError names the hang.
  result = harness.run(command, env=harness.cpu_env(8), timeout_s=_DEADLINE_S)
  assert result.returncode == 0, result.describe()
  assert any("resumed after batch 10" in line for line in result.lines), result.describe()
  assert [e["batch"] for e in launch_testing.events(workdir, "fdo")] == [8, 12]
  resumed = launch_testing.batch_losses(workdir)
  assert sorted(resumed) == list(range(1, 17))
  assert [resumed[b] for b in range(1, 11)] == [first[b] for b in range(1, 11)]

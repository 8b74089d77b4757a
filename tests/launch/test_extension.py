"""Extending a job (raising num_steps): what is trained stays, the added batches follow it.

In process, with the input's batch indices recorded: a job of N batches
raised to N2 and then to M reads exactly batches 0..M-1, once each, in
order (an M-batch job's sequence), FDO off (the dataset config) or on.
"""

import pytest

from sparsepipe.launch import train_and_evaluate
from sparsepipe.launch.job.training_data import ensure_dataset

import launch_testing  # pylint: disable=g-bad-import-order


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("extension")
  return ensure_dataset(launch_testing.tiny_config(), str(root), show_progress=False)


def dataset_config(data_dir, num_steps):
  """The shipped dataset config (FDO off: one segment to the end) on the tiny data."""
  return launch_testing.shipped_config(
    "dataset", data__dir=data_dir, num_steps=num_steps, eval__every_steps=0
  )


@pytest.mark.slow
@pytest.mark.parametrize("fdo", [False, True])
def test_raising_num_steps_twice_reads_the_batches_of_the_longer_job(
  data_dir, tmp_path, monkeypatch, fdo
):
  def config(num_steps):
    if fdo:
      return launch_testing.tiny_config(data__dir=data_dir, num_steps=num_steps)
    return dataset_config(data_dir, num_steps)

  recorder = launch_testing.BatchRecorder(monkeypatch)
  train_and_evaluate(config(11), str(tmp_path / "long"))
  assert recorder.indices == list(range(11))
  recorder.indices.clear()
  workdir = str(tmp_path / "extended")
  for num_steps in (5, 8, 11):
    result = train_and_evaluate(config(num_steps), workdir)
    assert result.batches_trained == num_steps
  assert recorder.indices == list(range(11))
  losses = launch_testing.batch_losses(workdir)
  assert sorted(losses) == list(range(1, 12))
  resumes = launch_testing.events(workdir, "resume")
  assert [(r["batch"], r["step"]) for r in resumes] == [(5, 5), (8, 8)]


def test_raising_num_steps_mid_segment_lengthens_it_without_fdo(data_dir, tmp_path, monkeypatch):
  """Stopped mid-segment and raised: it trains on to the new end as the longer job.

  The shipped dataset config retunes after batch 4 (fdo.first_after): the
  checkpoint after batch 4 comes after that retune, with batch 5 read and in
  flight, so the resumed job reads from batch 5 (index 4) on."""
  recorder = launch_testing.BatchRecorder(monkeypatch)
  uninterrupted = str(tmp_path / "uninterrupted")
  train_and_evaluate(dataset_config(data_dir, 9), uninterrupted)
  workdir = str(tmp_path / "raised")
  config = dataset_config(data_dir, 6)
  config.checkpoint.every_steps = 4  # a mid-segment checkpoint after batch 4
  train_and_evaluate(config, workdir)
  launch_testing.remove_checkpoints_after(workdir, 4)
  recorder.indices.clear()
  train_and_evaluate(dataset_config(data_dir, 9), workdir)
  assert recorder.indices == list(range(5, 9))
  # The 6-batch job's last segment, cut at 6, hands over at 6 instead of draining: the
  # same losses as the 9-batch job, bit for bit.
  assert launch_testing.batch_losses(workdir) == launch_testing.batch_losses(uninterrupted)


@pytest.mark.parametrize("pipelining", [False, True])
def test_extending_a_job_that_stopped_mid_fdo_segment_keeps_its_retune_batches(
  data_dir, tmp_path, pipelining
):
  """FDO every 4: stopped after batch 6, raised to 12, it retunes after 8 as a 12-batch job.

  Sequential: batches 7-12 equal the 12-batch job's bit for bit. Pipelined, the
  6-batch job drained at its end (its final model holds batch 6's embedding
  update), so batch 7's lookup sees that update one batch earlier than in the
  uninterrupted run: the losses after batch 6 differ by float rounding only.
  """

  def config(num_steps):
    return launch_testing.tiny_config(
      data__dir=data_dir, num_steps=num_steps, pipelining=pipelining
    )

  uninterrupted, extended = str(tmp_path / "uninterrupted"), str(tmp_path / "extended")
  train_and_evaluate(config(12), uninterrupted)
  train_and_evaluate(config(6), extended)
  train_and_evaluate(config(12), extended)

  def retunes(workdir):
    return [(e["batch"], e["limits"]) for e in launch_testing.events(workdir, "fdo")]

  assert [batch for batch, _ in retunes(extended)] == [4, 8]
  assert retunes(extended) == retunes(uninterrupted)
  ours, theirs = launch_testing.batch_losses(extended), launch_testing.batch_losses(uninterrupted)
  assert sorted(ours) == list(range(1, 13))
  if not pipelining:
    assert ours == theirs
  else:
    assert [ours[b] for b in range(1, 7)] == [theirs[b] for b in range(1, 7)]
    assert [ours[b] for b in range(7, 13)] == pytest.approx(
      [theirs[b] for b in range(7, 13)], rel=1e-3
    )


def test_a_dataset_job_saved_with_a_num_steps_trains_on_to_them(data_dir, tmp_path, capsys):
  """The dataset config's num_steps is unset (a new job trains 10 epochs of its data,
  here 320 batches): a job saved with one (before: the config's 1,000) resumes to it."""
  workdir = str(tmp_path / "job")
  train_and_evaluate(dataset_config(data_dir, 6), workdir)
  launch_testing.remove_checkpoints_after(workdir, 3)  # as if stopped there
  capsys.readouterr()
  result = train_and_evaluate(dataset_config(data_dir, None), workdir)
  assert (result.resumed_from, result.batches_trained) == (3, 6)
  resumed = [line for line in capsys.readouterr().out.splitlines() if "resumed" in line]
  assert len(resumed) == 1 and resumed[0].endswith("; 3 batches to go of 6"), resumed

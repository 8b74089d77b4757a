"""train_and_evaluate in process: trains, retunes FDO, checkpoints, resumes."""

import os
import re
import shutil
import signal

import numpy as np
import pytest

from sparsepipe import core
from sparsepipe import pipeline
from sparsepipe.launch import Position
from sparsepipe.launch import NonFiniteLossError
from sparsepipe.launch import train_and_evaluate
from sparsepipe.launch.evaluate import evaluate_checkpoint

import launch_testing  # pylint: disable=g-bad-import-order


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("job"))
  result = train_and_evaluate(launch_testing.tiny_config(), workdir)
  return workdir, result


def test_job_trains_every_batch_once_and_checkpoints(first_run):
  workdir, result = first_run
  assert not result.preempted and result.resumed_from is None
  # 8 batches in 2 FDO segments of 4: the first (a fill step and 3 more) hands
  # its last two batches to the second, which drains at the job's end (6 steps).
  assert result.batches_trained == 8
  assert result.position == Position(1, 4, 4, False, pipeline_step=6, carried_in=True)
  assert result.checkpoint_step == 8
  losses = launch_testing.batch_losses(workdir)
  assert sorted(losses) == list(range(1, 9))
  assert all(0.0 < loss < 5.0 for loss in losses.values())
  assert result.last_loss == losses[8]
  # Saved after every 3rd batch and at the end; the newest 2 are kept.
  assert [e["batch"] for e in launch_testing.events(workdir, "checkpoint")] == [3, 6, 8]
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["6", "8"]


def test_fdo_retunes_the_limits_between_segments(first_run):
  workdir, _ = first_run
  (fdo,) = launch_testing.events(workdir, "fdo")
  assert fdo["batch"] == 4
  (limits,) = fdo["limits"].values()
  # The first segment ran with the worst-case limit: 32 samples / 16 SCs *
  # 13 ids per sample = 26 -> 32 (rounded to 8); FDO measured less.
  assert 1 <= limits["max_ids_per_partition"] < 32
  assert limits["suggested_coo_buffer_size_per_device"] is not None


def test_each_retune_records_its_stall(first_run):
  """The retune after batch 4: the gap to batch 5 less one steady batch, in metrics.jsonl."""
  workdir, _ = first_run
  records = launch_testing.events(workdir, "phase")
  (stall,) = [r for r in records if r["phase"] == "retune_stall"]
  assert stall["batch"] == 4
  # The limits changed (test above): the gap holds the new step's compilation.
  assert 0 < stall["steady_batch_s"] < stall["gap_s"]
  assert stall["seconds"] == pytest.approx(stall["gap_s"] - stall["steady_batch_s"], abs=2e-6)


def test_an_early_first_fdo_pass_retunes_after_first_after_batches_and_resumes_exactly(tmp_path):
  """fdo.first_after=2, every_steps=4: retunes after batches 2 and 4 (8 is the end); a job
  resumed at any boundary trains the same: at the end of a segment that hands its batches
  in flight over (batches 1 and 3), or after the retune, in the segment they were
  handed to (2, 4 and 5)."""
  config = launch_testing.tiny_config(
    fdo__first_after=2, checkpoint__every_steps=1, checkpoint__keep=100
  )
  reference = str(tmp_path / "reference")
  train_and_evaluate(config, reference)
  retunes = launch_testing.events(reference, "fdo")
  assert [e["batch"] for e in retunes] == [2, 4]
  (early,) = retunes[0]["limits"].values()
  assert 1 <= early["max_ids_per_partition"] < 32  # tuned: 32 is the worst case
  for stopped in (1, 2, 3, 4, 5):
    workdir = str(tmp_path / f"stopped_{stopped}")
    shutil.copytree(reference, workdir)
    launch_testing.remove_checkpoints_after(workdir, stopped)
    result = train_and_evaluate(config, workdir)
    assert result.resumed_from == stopped
    assert launch_testing.batch_losses(workdir) == launch_testing.batch_losses(reference)
    assert launch_testing.events(workdir, "fdo") == retunes
    ours = launch_testing.checkpoint_arrays(workdir, 8)
    for path, value in launch_testing.checkpoint_arrays(reference, 8).items():
      assert ours[path].tobytes() == value.tobytes(), (stopped, path)


def test_rerunning_a_finished_job_trains_nothing(first_run):
  workdir, _ = first_run
  before = launch_testing.batch_losses(workdir)
  result = train_and_evaluate(launch_testing.tiny_config(), workdir)
  assert result.resumed_from == 8 and result.batches_trained == 8
  assert launch_testing.batch_losses(workdir) == before


@pytest.fixture(scope="module")
def run_with_eval(tmp_path_factory):
  """The first_run's config plus a generated eval split of 100 examples
  (not a multiple of the batch of 32) and an eval every 4 batches."""
  workdir = str(tmp_path_factory.mktemp("job_eval"))
  config = launch_testing.tiny_config(synthetic__eval_examples=100, eval__every_steps=4)
  return workdir, train_and_evaluate(config, workdir)


def test_eval_runs_every_n_batches_and_at_the_end_over_every_example(run_with_eval):
  workdir, result = run_with_eval
  evals = launch_testing.events(workdir, "eval")
  assert [e["batch"] for e in evals] == [4, 8]
  assert all(e["examples"] == 100 for e in evals)
  assert sorted(evals[0]) == ["auc", "batch", "calibration", "event", "examples", "logloss", "ne"]
  assert 0.0 <= evals[-1]["auc"] <= 1.0 and evals[-1]["logloss"] > 0.0
  assert result.last_eval.auc == evals[-1]["auc"]
  assert os.listdir(os.path.join(workdir, "tensorboard"))


def test_a_saved_checkpoint_evaluates_like_the_job_did(run_with_eval):
  workdir, result = run_with_eval
  before = sorted(os.listdir(workdir))
  step, trained, metrics = evaluate_checkpoint(workdir)
  assert (step, trained) == (8, 8)
  assert metrics == result.last_eval
  assert sorted(os.listdir(workdir)) == before
  with pytest.raises(
    ValueError,
    match=r"^'/nonexistent' does not exist \(give the --workdir the job trained in\)$",
  ):
    evaluate_checkpoint("/nonexistent")
  with pytest.raises(
    ValueError,
    match=f"^'{workdir}/checkpoints' is the checkpoints folder of the job in '{workdir}': give"
    " that as --workdir$",
  ):
    evaluate_checkpoint(os.path.join(workdir, "checkpoints"))
  os.makedirs(os.path.join(workdir, "empty"))
  with pytest.raises(ValueError, match=f"^no checkpoints in '{workdir}/empty' \\(no "):
    evaluate_checkpoint(os.path.join(workdir, "empty"))
  os.rmdir(os.path.join(workdir, "empty"))


def test_evaluating_leaves_a_running_jobs_save_alone(run_with_eval, tmp_path):
  # Regression: evaluate opened the checkpoints writable, and a writable Orbax
  # manager deletes `*.orbax-checkpoint-tmp` directories when it opens: the
  # running job's save in progress was deleted and the job failed.
  workdir = str(tmp_path / "job")
  shutil.copytree(run_with_eval[0], workdir)
  in_progress = os.path.join(workdir, "checkpoints", "9.orbax-checkpoint-tmp", "arrays")
  os.makedirs(in_progress)
  with open(os.path.join(in_progress, "part"), "w") as f:
    f.write("written by the job")
  assert evaluate_checkpoint(workdir)[:2] == (8, 8)
  with open(os.path.join(in_progress, "part")) as f:
    assert f.read() == "written by the job"


def test_a_rerun_runs_the_final_eval_a_kill_cut_short(run_with_eval, tmp_path, capsys):
  """A job killed during its final eval (after its last save) was done: its rerun said
  "nothing to train" and the final eval never ran."""
  workdir = str(tmp_path / "job")
  shutil.copytree(run_with_eval[0], workdir)
  metrics = os.path.join(workdir, "metrics.jsonl")
  with open(metrics, encoding="utf-8") as f:
    lines = f.readlines()
  ended = ('"event": "eval", "batch": 8', '"event": "done"')
  with open(metrics, "w", encoding="utf-8") as f:  # as if killed before the eval's line
    f.writelines(line for line in lines if not any(e in line for e in ended))
  assert [e["batch"] for e in launch_testing.events(workdir, "eval")] == [4]
  capsys.readouterr()
  train_and_evaluate(launch_testing.tiny_config(synthetic__eval_examples=100), workdir)
  out = capsys.readouterr().out.splitlines()
  assert out[-3] == (
    f"sparsepipe: the job in {workdir} has trained its 8 batches; its final eval did not"
    " finish before it stopped: evaluating"
  )
  assert out[-2].startswith("eval after batch 8: AUC "), out
  evals = launch_testing.events(workdir, "eval")
  assert [e["batch"] for e in evals] == [4, 8]
  assert evals[-1]["auc"] == run_with_eval[1].last_eval.auc
  assert out[-1] == (  # the summary, without a loss: this run trained nothing
    f"sparsepipe: done: 8 batches, eval AUC {evals[-1]['auc']:.4f}; checkpoint 8 in"
    f" {workdir}/checkpoints; metrics in {metrics}"
  )
  assert launch_testing.events(workdir, "done") == [{"event": "done", "batch": 8}]
  train_and_evaluate(launch_testing.tiny_config(synthetic__eval_examples=100), workdir)
  assert "nothing to train" in capsys.readouterr().out.splitlines()[-1]
  assert len(launch_testing.events(workdir, "eval")) == 2  # once


def _stop_signal_during_eval(monkeypatch, at_batch):
  """SIGTERM to this process after the first batch of the eval after batch `at_batch`."""
  evaluate = pipeline.evaluate

  def signalled(step, train_state, batches, **kwargs):
    def batches_then_stop():
      for i, batch in enumerate(batches):
        if i == 1 and int(train_state.step) == at_batch:
          os.kill(os.getpid(), signal.SIGTERM)
        yield batch

    return evaluate(step, train_state, batches_then_stop(), **kwargs)

  monkeypatch.setattr(pipeline, "evaluate", signalled)


@pytest.mark.parametrize("at_batch", [4, 8])
def test_a_stop_during_an_eval_abandons_it_and_the_rerun_evaluates(
  run_with_eval, tmp_path, monkeypatch, capsys, at_batch
):
  """A stop signal waited for the eval's whole pass (one that outlasts a preemption's
  grace period loses the job's work since the last save); after the final eval's last
  save, the job even ended with status 0 as if no stop had come."""
  workdir = str(tmp_path / "job")
  config = launch_testing.tiny_config(synthetic__eval_examples=100, eval__every_steps=4)
  _stop_signal_during_eval(monkeypatch, at_batch)
  stopped = train_and_evaluate(config, workdir)
  assert stopped.preempted and stopped.batches_trained == at_batch
  assert stopped.checkpoint_step == at_batch
  assert capsys.readouterr().out.splitlines()[-1] == (
    f"sparsepipe: preempted during the eval after batch {at_batch}; checkpoint after batch"
    f" {at_batch} saved, exiting"
  )
  assert [e["batch"] for e in launch_testing.events(workdir, "eval")] == [4, 8][: at_batch // 4 - 1]
  monkeypatch.undo()
  train_and_evaluate(config, workdir)
  evals = launch_testing.events(workdir, "eval")
  assert evals == launch_testing.events(run_with_eval[0], "eval")
  assert launch_testing.batch_losses(workdir) == launch_testing.batch_losses(run_with_eval[0])
  assert launch_testing.events(workdir, "done") == [{"event": "done", "batch": 8}]


def test_eval_does_not_change_training(first_run, run_with_eval):
  (plain, _), (evaluated, _) = first_run, run_with_eval
  assert launch_testing.batch_losses(evaluated) == launch_testing.batch_losses(plain)
  with_eval = launch_testing.checkpoint_arrays(evaluated, 8)
  without = launch_testing.checkpoint_arrays(plain, 8)
  assert sorted(with_eval) == sorted(without)
  for path, array in without.items():
    np.testing.assert_array_equal(with_eval[path], array, err_msg=path)


def test_more_steps_continue_from_the_last_checkpoint(first_run):
  workdir, _ = first_run
  before = launch_testing.batch_losses(workdir)
  result = train_and_evaluate(launch_testing.tiny_config(num_steps=10), workdir)
  assert result.resumed_from == 8 and result.batches_trained == 10
  losses = launch_testing.batch_losses(workdir)
  assert sorted(losses) == list(range(1, 11))
  assert {b: losses[b] for b in before} == before
  (resume,) = launch_testing.events(workdir, "resume")
  assert resume == {"event": "resume", "batch": 8, "step": 8}


def test_fewer_steps_than_trained_say_the_job_is_done(first_run, capsys):
  workdir, _ = first_run
  before = launch_testing.batch_losses(workdir)
  result = train_and_evaluate(launch_testing.tiny_config(num_steps=5), workdir)
  trained = max(before)
  assert result.batches_trained == trained and result.last_loss is None
  assert launch_testing.batch_losses(workdir) == before
  assert capsys.readouterr().out.splitlines()[-1] == (
    f"sparsepipe: the job in {workdir} has trained {trained} batches (num_steps {trained}"
    f" saved; checkpoint {trained}); this run's num_steps is 5: nothing to train. To train"
    f" more, raise --config.num_steps above {trained}"
  )


def test_a_rerun_without_the_raised_epochs_names_what_the_job_has(first_run, tmp_path, capsys):
  """num_epochs raised a job past its config's num_steps; a plain rerun says so."""
  workdir = str(tmp_path / "job")
  shutil.copytree(first_run[0], workdir)
  # 0.375 epochs of 1,024 examples in batches of 32: 12 batches.
  raised = train_and_evaluate(launch_testing.tiny_config(num_epochs=0.375), workdir)
  assert raised.batches_trained == 12
  capsys.readouterr()
  train_and_evaluate(launch_testing.tiny_config(), workdir)
  assert capsys.readouterr().out.splitlines()[-1] == (
    f"sparsepipe: the job in {workdir} has trained 12 batches (num_steps 12 saved, from"
    " num_epochs 0.375; checkpoint 12); this run's num_steps is 8: nothing to train. To train"
    " more, raise --config.num_steps above 12"
  )
  # Rerun by the same epochs: raising num_steps would change nothing, so it is not the hint.
  train_and_evaluate(launch_testing.tiny_config(num_epochs=0.375), workdir)
  assert (
    capsys.readouterr()
    .out.splitlines()[-1]
    .endswith(
      "this run's num_steps is 12: nothing to train. To train more, raise --config.num_epochs"
      " above 0.375"
    )
  )
  # By fewer epochs than the job trained: the hint once named this run's 0.25, which
  # trains nothing either.
  train_and_evaluate(launch_testing.tiny_config(num_epochs=0.25), workdir)
  assert (
    capsys.readouterr()
    .out.splitlines()[-1]
    .endswith(
      "this run's num_steps is 8: nothing to train. To train more, raise --config.num_epochs"
      " above 0.375"
    )
  )


def test_non_finite_training_stops_before_saving_it(tmp_path):
  """A dense step so large that float32 overflows: the job stops naming the
  batch, and no checkpoint holds the non-finite model."""
  workdir = str(tmp_path)
  config = launch_testing.tiny_config(
    dense_optimizer__name="sgd",
    dense_optimizer__learning_rate=1e38,
    fdo__every_steps=0,
    checkpoint__every_steps=1,
    checkpoint__keep=100,
    log_every_steps=100,  # losses are read only when a checkpoint is due
  )
  with pytest.raises(
    NonFiniteLossError,
    match=r"^batch (\d+): the loss is \S+ or an update is not finite; training stopped"
    r" before saving it \(the newest checkpoint predates this batch\)\.",
  ) as info:
    train_and_evaluate(config, workdir)
  bad = int(re.match(r"batch (\d+)", str(info.value)).group(1))
  assert bad >= 1
  saved = [e["batch"] for e in launch_testing.events(workdir, "checkpoint")]
  on_disk = sorted(int(name) for name in os.listdir(os.path.join(workdir, "checkpoints")))
  assert saved == on_disk == list(range(1, len(saved) + 1))
  assert all(step < bad for step in saved)
  for step in saved:
    for path, array in launch_testing.checkpoint_arrays(workdir, step).items():
      assert np.all(np.isfinite(array)), (step, path)
  # Losses were logged only for the batches before it.
  assert sorted(launch_testing.batch_losses(workdir)) == list(range(1, bad))


def test_the_freed_heap_is_released_after_each_compilation(tmp_path, monkeypatch):
  assert core.release_freed_heap() is True  # glibc (Linux): malloc_trim is there
  steps, trims = [0], []
  run_step = pipeline.Trainer.run_pipeline_step

  def counted(self, *args, **kwargs):
    steps[0] += 1
    return run_step(self, *args, **kwargs)

  monkeypatch.setattr(pipeline.Trainer, "run_pipeline_step", counted)
  monkeypatch.setattr(core, "release_freed_heap", lambda: trims.append(steps[0]))
  config = launch_testing.tiny_config()
  config.checkpoint.async_save = False
  train_and_evaluate(config, str(tmp_path / "job"))
  # Two segments of 4 batches: 4 pipeline steps (fill, 3), then 6 (4, drain).
  # Before the first step (the state made), after each of the first two steps
  # of each segment, which compile its programs (0, 1, 2, 5, 6), and after
  # each (synchronous) save: batches 3 and 6 (every 3; steps 4 and 7) and 8
  # (the end, step 10).
  assert steps[0] == 10 and trims == [0, 1, 2, 4, 5, 6, 7, 10]


def test_relative_dataset_paths_are_saved_absolute(tmp_path, monkeypatch):
  """A job given relative data.dir / eval.data_dir saves them absolute, so that
  launch.evaluate (and export) read its checkpoints from any directory."""
  from sparsepipe.launch.job import checkpoints  # pylint: disable=g-import-not-at-top

  train_and_evaluate(launch_testing.tiny_config(num_steps=1), str(tmp_path / "maker"))
  monkeypatch.chdir(tmp_path)
  config = launch_testing.tiny_config(num_steps=3, data__dir="maker/data")
  config.eval.data_dir = "maker/data"
  train_and_evaluate(config, "job")
  saved = checkpoints.saved_job(str(tmp_path / "job"), None).config
  assert (saved.data.dir, saved.eval.data_dir) == (str(tmp_path / "maker" / "data"),) * 2
  (tmp_path / "elsewhere").mkdir()
  monkeypatch.chdir(tmp_path / "elsewhere")
  step, trained, metrics = evaluate_checkpoint(str(tmp_path / "job"))
  assert (step, trained, metrics.examples) == (3, 3, 1024)

"""What a new user meets through the launcher: epochs instead of batches, a limit
error that says what to do, a step no longer kept named as such."""

import os
import sys

import launch_testing  # pylint: disable=g-bad-import-order
import subprocess_harness as harness  # pylint: disable=g-bad-import-order


def _run(module, *flags):
  command = [sys.executable, "-m", module, *flags]
  return harness.run(command, env=harness.cpu_env(1), timeout_s=300)


def test_num_epochs_sets_the_batches_and_evaluate_names_the_steps_kept(tmp_path):
  workdir = str(tmp_path / "job")
  overrides = launch_testing.flag_overrides(fdo__every_steps=0, num_steps=1000)
  trained = _run("sparsepipe.launch", f"--workdir={workdir}", *overrides, "--config.num_epochs=0.3")
  assert trained.returncode == 0, trained.describe()
  # ceil(0.3 * 1024 / 32) = 10 batches, not num_steps.
  assert trained.lines[0] == (
    "sparsepipe: training 10 batches of 32 (0.31 epochs of 1,024 examples) on 1 device"
    f" (1 process); workdir {workdir}"
  )
  assert launch_testing.events(workdir, "done") == [{"event": "done", "batch": 10}]
  kept = sorted(int(p) for p in os.listdir(os.path.join(workdir, "checkpoints")) if p.isdigit())
  assert kept == [9, 10]

  missing = _run("sparsepipe.launch.evaluate", f"--workdir={workdir}", "--step=3")
  assert (missing.returncode, missing.stderr) == (
    1,
    f"error: {workdir}/checkpoints holds no step 3: the steps kept are 9, 10 (a job keeps its"
    " newest checkpoint.keep steps)\n",
  )


def test_a_batch_over_the_limits_is_one_line_saying_what_to_do(tmp_path):
  workdir = str(tmp_path / "job")
  out = _run(
    "sparsepipe.launch",
    f"--workdir={workdir}",
    *launch_testing.flag_overrides(),
    "--config.limits.max_ids_per_partition=2",
    "--config.limits.max_unique_ids_per_partition=2",
  )
  assert out.returncode == 1, out.describe()
  *generating, line = out.stderr.splitlines()  # the data generator's progress, the error
  assert all(g.startswith("synthetic ") for g in generating), out.stderr
  assert line.startswith("error: features 'category', 'history', 'item', 'user'"), line
  assert line.endswith(
    " exceed max_ids_per_partition=2; raise config.limits.max_ids_per_partition and"
    " max_unique_ids_per_partition (0: the worst case of the batch, always enough; FDO then"
    " tunes them), or let the input drop and count such ids with"
    " --config.data.allow_id_dropping=true"
  ), line

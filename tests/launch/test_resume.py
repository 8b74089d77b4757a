"""A launched job that is SIGTERMed or SIGKILLed and restarted is exact.

Real subprocesses (`python -m sparsepipe.launch`): the interrupted runs and
the uninterrupted reference end with bit-identical dense params, ZeRO
optimizer shards, embedding tables and slots, and per-batch losses.
"""

import os
import signal
import sys

import numpy as np
import pytest

from sparsepipe.launch.job.training_data import ensure_dataset

import launch_testing  # pylint: disable=g-bad-import-order
import subprocess_harness as harness  # pylint: disable=g-bad-import-order

NUM_STEPS = 8
FINAL_STEP = 8  # checkpoint steps count batches


def _command(workdir: str, data_dir: str, *extra: str) -> list[str]:
  return [
    sys.executable,
    "-m",
    "sparsepipe.launch",
    f"--workdir={workdir}",
    f"--config={launch_testing.DEMO_CONFIG}",
    *launch_testing.flag_overrides(data__dir=data_dir),
    *extra,
  ]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
  root = tmp_path_factory.mktemp("resume")
  data_dir = ensure_dataset(launch_testing.tiny_config(), str(root), show_progress=False)
  env = harness.cpu_env(8, compilation_cache_dir=harness.SESSION_JAX_CACHE)
  reference = str(root / "reference")
  result = harness.run(_command(reference, data_dir), env=env, timeout_s=300)
  assert result.returncode == 0, result.describe()
  return root, data_dir, env, reference


def _assert_same_as_reference(workdir: str, reference: str) -> None:
  assert launch_testing.batch_losses(workdir) == launch_testing.batch_losses(reference)
  ours = launch_testing.checkpoint_arrays(workdir, FINAL_STEP)
  theirs = launch_testing.checkpoint_arrays(reference, FINAL_STEP)
  assert sorted(ours) == sorted(theirs)
  for path, value in theirs.items():
    assert ours[path].tobytes() == value.tobytes(), path


def test_sigterm_and_ctrl_c_save_exit_42_and_resume_exactly(shared):
  root, data_dir, env, reference = shared
  workdir = str(root / "sigterm")
  runs = harness.run_interrupted(
    _command(workdir, data_dir),
    [
      # Mid-segment (pipeline full), then Ctrl-C (SIGINT to the process
      # group, as a terminal sends it) right after the FDO switch.
      harness.Interruption(signal.SIGTERM, rf"batch 2/{NUM_STEPS} .*"),
      harness.Interruption(signal.SIGINT, rf"batch 5/{NUM_STEPS} .*"),
    ],
    env=env,
    timeout_s=300,
  )
  assert len(runs) == 3
  for interrupted in runs[:2]:
    assert any(
      line.startswith("sparsepipe: preempted; checkpoint after batch")
      for line in interrupted[0].lines
    )
  assert [e["batch"] for e in launch_testing.events(workdir, "resume")] != []
  _assert_same_as_reference(workdir, reference)


def test_sigkill_also_during_an_async_save_resumes_exactly(shared):
  root, data_dir, env, reference = shared
  workdir = str(root / "sigkill")
  harness.run_interrupted(
    _command(workdir, data_dir),
    [
      # Killed while step 6 is being written in the background: the
      # half-written step is ignored and step 3 is restored.
      harness.Interruption(signal.SIGKILL, r"checkpoint after batch 6 saving"),
      harness.Interruption(signal.SIGKILL, rf"batch 7/{NUM_STEPS} .*"),
    ],
    env=env,
    timeout_s=300,
  )
  _assert_same_as_reference(workdir, reference)
  leftovers = [n for n in os.listdir(os.path.join(workdir, "checkpoints")) if "tmp" in n]
  assert leftovers == []
  # TensorBoard shows each batch's loss once, as metrics.jsonl has it: the points
  # before a checkpoint reach the event file before it is saved (a resume replays
  # only the checkpoint's step; the killed writers' buffered points were lost).
  view = launch_testing.tensorboard_view(os.path.join(workdir, "tensorboard"))
  losses = {batch: value for (batch, tag), value in view.items() if tag == "train/loss"}
  assert losses == pytest.approx(launch_testing.batch_losses(workdir))
  assert sorted(losses) == list(range(1, NUM_STEPS + 1))


def _assert_close_to_reference(workdir: str, reference: str, rtol: float) -> None:
  ours, theirs = launch_testing.batch_losses(workdir), launch_testing.batch_losses(reference)
  assert sorted(ours) == sorted(theirs)
  np.testing.assert_allclose(
    [ours[b] for b in sorted(ours)], [theirs[b] for b in sorted(ours)], rtol=rtol
  )
  ours = launch_testing.checkpoint_arrays(workdir, FINAL_STEP)
  theirs = launch_testing.checkpoint_arrays(reference, FINAL_STEP)
  assert sorted(ours) == sorted(theirs)
  for path, value in theirs.items():
    np.testing.assert_allclose(ours[path], value, rtol=rtol, atol=rtol * 1e-2, err_msg=path)


@pytest.mark.slow
def test_two_processes_preempted_and_restarted_are_exact(shared):
  """2 processes x 4 CPU devices (jax.distributed on 127.0.0.1).

  SIGTERM reaches process 0 only; JAX's preemption service makes both save
  the same step and exit 42; the restarted job equals an uninterrupted
  2-process job bit for bit. Each host reads its contiguous block of every
  global batch, so the batches are those of the 1-process 8-device run; the
  values match it up to float summation order (cross-process reductions
  run in gloo, in another order than the in-process all-reduce).
  """
  root, data_dir, _, reference = shared
  env = harness.cpu_env(4, compilation_cache_dir=harness.SESSION_JAX_CACHE)

  def commands(workdir):
    port = harness.free_port()
    return [
      _command(
        workdir,
        data_dir,
        "--config.per_host_batch_size=16",
        f"--coordinator_address=127.0.0.1:{port}",
        "--num_processes=2",
        f"--process_id={i}",
      )
      for i in range(2)
    ]

  uninterrupted = str(root / "two_hosts_reference")
  results = harness.run_many(commands(uninterrupted), env=env, timeout_s=400)
  assert [r.returncode for r in results] == [0, 0], "\n".join(r.describe() for r in results)
  workdir = str(root / "two_hosts")
  runs = harness.run_interrupted(
    commands(workdir),
    # Early: JAX agrees on the preemption step ~0.5 s later; the job must
    # still be running then.
    [harness.Interruption(signal.SIGTERM, rf"batch 1/{NUM_STEPS} .*", target=0)],
    env=env,
    timeout_s=400,
  )
  assert [r.returncode for r in runs[0]] == [42, 42]
  _assert_same_as_reference(workdir, uninterrupted)
  _assert_close_to_reference(workdir, reference, rtol=2e-6)


@pytest.mark.slow
def test_two_processes_extended_from_an_evaluated_end_train_on(shared):
  """A 2-process job extended from its end, where it had evaluated, once hung:
  only process 0 reads metrics.jsonl, so process 1 ran the eval process 0 had
  skipped as done, and each waited for the other."""
  root, data_dir, _, _ = shared
  env = harness.cpu_env(2, compilation_cache_dir=harness.SESSION_JAX_CACHE)
  workdir = str(root / "two_hosts_extended")
  evaluated = ("--config.eval.every_steps=4", f"--config.eval.data_dir={data_dir}")

  def run(num_steps):
    port = harness.free_port()
    commands = [
      _command(workdir, data_dir, *evaluated, f"--config.num_steps={num_steps}")
      + [f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"]
      for i in range(2)
    ]
    results = harness.run_many(commands, env=env, timeout_s=300)
    assert [r.returncode for r in results] == [0, 0], "\n".join(r.describe() for r in results)

  run(4)
  run(6)
  evals = [e["batch"] for e in launch_testing.events(workdir, "eval")]
  assert evals == [4, 6]
  assert sorted(launch_testing.batch_losses(workdir)) == [1, 2, 3, 4, 5, 6]

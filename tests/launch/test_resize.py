"""A launched job resumes on another device or process count (issue 9).

Real subprocesses (`python -m sparsepipe.launch`), the tiny demo config with
a global batch of 32 (the same on any process count):
* 8 -> 4 devices after an FDO retune: the saved limits are carried to the new
  layout (they would exceed its theoretical buffer maximum), FDO retunes;
* 2 processes -> 1 mid-segment (SIGTERM) and 1 -> 2 at a segment boundary.
Per-batch losses equal an uninterrupted 8-device 1-process run up to float
summation order (other device or process counts reduce in another order).
"""

import signal
import sys

import numpy as np
import pytest

from sparsepipe.launch.job.dataset import ensure_dataset

import launch_testing  # pylint: disable=g-bad-import-order
import subprocess_harness as harness  # pylint: disable=g-bad-import-order

BATCH = ("--config.global_batch_size=32", "--config.per_host_batch_size=0")


def _command(workdir, data_dir, num_steps, *extra):
  return [
    sys.executable,
    "-m",
    "sparsepipe.launch",
    f"--workdir={workdir}",
    f"--config={launch_testing.DEMO_CONFIG}",
    *launch_testing.flag_overrides(data__dir=data_dir),
    *BATCH,
    f"--config.num_steps={num_steps}",
    *extra,
  ]


def _two_processes(workdir, data_dir, num_steps):
  port = harness.free_port()
  return [
    _command(
      workdir,
      data_dir,
      num_steps,
      f"--coordinator_address=127.0.0.1:{port}",
      "--num_processes=2",
      f"--process_id={i}",
    )
    for i in range(2)
  ]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
  root = tmp_path_factory.mktemp("resize")
  data_dir = ensure_dataset(launch_testing.tiny_config(), str(root), show_progress=False)
  env8 = harness.cpu_env(8, compilation_cache_dir=root / "jax_cache_8")
  env4 = harness.cpu_env(4, compilation_cache_dir=root / "jax_cache_4")
  reference = str(root / "reference")
  result = harness.run(_command(reference, data_dir, 12), env=env8, timeout_s=300)
  assert result.returncode == 0, result.describe()
  return root, data_dir, env8, env4, reference


def _assert_close_to_reference(workdir, reference):
  ours, theirs = launch_testing.batch_losses(workdir), launch_testing.batch_losses(reference)
  assert sorted(ours) == sorted(theirs) == list(range(12))
  np.testing.assert_allclose(
    [ours[b] for b in range(12)], [theirs[b] for b in range(12)], rtol=1e-3
  )


def test_eight_to_four_devices_after_an_fdo_retune(shared):
  root, data_dir, env8, env4, reference = shared
  workdir = str(root / "eight_to_four")
  first = harness.run(_command(workdir, data_dir, 8), env=env8, timeout_s=300)
  assert first.returncode == 0, first.describe()
  assert len(launch_testing.events(workdir, "fdo")) == 1  # retuned after batch 4
  second = harness.run(_command(workdir, data_dir, 12), env=env4, timeout_s=300)
  assert second.returncode == 0, second.describe()
  assert any("resumed from checkpoint step" in line for line in second.lines), second.lines
  _assert_close_to_reference(workdir, reference)


def test_two_processes_to_one_mid_segment_and_back(shared):
  root, data_dir, env8, env4, reference = shared
  workdir = str(root / "two_to_one")
  runs = harness.run_many(
    _two_processes(workdir, data_dir, 12),
    env=env4,
    timeout_s=400,
    # Early (mid-segment 0): JAX agrees on the preemption step ~0.5 s later
    # (more on a loaded machine); the job must still be running then.
    interruption=harness.Interruption(signal.SIGTERM, r"batch 1/12 .*", target=0),
  )
  assert [r.returncode for r in runs] == [42, 42], "\n".join(r.describe() for r in runs)
  final = harness.run(_command(workdir, data_dir, 12), env=env8, timeout_s=300)
  assert final.returncode == 0, final.describe()
  _assert_close_to_reference(workdir, reference)


def test_one_process_to_two_at_a_segment_boundary(shared):
  root, data_dir, env8, env4, reference = shared
  workdir = str(root / "one_to_two")
  first = harness.run(_command(workdir, data_dir, 8), env=env8, timeout_s=300)
  assert first.returncode == 0, first.describe()
  runs = harness.run_many(_two_processes(workdir, data_dir, 12), env=env4, timeout_s=400)
  assert [r.returncode for r in runs] == [0, 0], "\n".join(r.describe() for r in runs)
  _assert_close_to_reference(workdir, reference)

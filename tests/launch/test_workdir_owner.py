"""A workdir names its job: job.json at the first start, the same job id on every
process, and a run of another config is told whose workdir it is."""

import json
import os
import re
import sys

import pytest

from sparsepipe import checkpointing
from sparsepipe import launch
from sparsepipe.launch.workdir.owner import JOB_FILENAME
from sparsepipe.launch.workdir import lock
from sparsepipe.launch.workdir.owner import JobRecord
from sparsepipe.launch.workdir.owner import new_job_record
from sparsepipe.launch.workdir.owner import read_job_record

import launch_testing  # pylint: disable=g-bad-import-order
import subprocess_harness as harness  # pylint: disable=g-bad-import-order


def _launch(workdir, *flags):
  command = [
    sys.executable,
    "-m",
    "sparsepipe.launch",
    f"--workdir={workdir}",
    *launch_testing.flag_overrides(num_steps=2, checkpoint__every_steps=2),
    *flags,
  ]
  return harness.run(command, env=harness.cpu_env(1), timeout_s=300)


def test_another_config_in_a_workdir_is_told_whose_workdir_it_is(tmp_path):
  workdir = str(tmp_path / "job")
  first = _launch(workdir)
  assert first.returncode == 0, first.describe()
  record = read_job_record(workdir)
  assert record is not None and record.config == "demo" and len(record.job_id) == 32
  with open(os.path.join(workdir, JOB_FILENAME)) as f:
    assert json.load(f) == {"job_id": record.job_id, "config": "demo", "started": record.started}

  other = _launch(
    workdir,
    "--config.model.top_mlp_dims=(16,)",
    "--config.model.embedding_dim=8",
    "--config.embedding_optimizer.learning_rate=0.5",
    "--config.dense_optimizer.learning_rate=0.5",
  )
  assert other.returncode == 1, other.describe()
  assert other.stderr == (
    f"error: workdir {workdir} holds another job (config 'demo', started {record.started}):"
    " config.dense_optimizer.learning_rate=0.001, current run has 0.5;"
    " config.embedding_optimizer.learning_rate=0.05, current run has 0.5;"
    " config.model.embedding_dim=4, current run has 8 (and 1 more); continue that job with"
    f" its own config, or give this run another --workdir (or delete {workdir} to start"
    " over)\n"
  )
  assert read_job_record(workdir) == record  # the refused run changed nothing


def test_a_jobs_start_and_a_lock_holders_are_both_utc():
  # job.json said "GMT" (strftime's %Z of a UTC time on glibc), the lock's holder "UTC".
  stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
  assert re.fullmatch(stamp, new_job_record("ab" * 16, "demo").started)
  assert re.fullmatch(stamp, json.loads(lock._owner())["started"])  # pylint: disable=protected-access


def test_a_job_record_reads_back_and_a_damaged_one_is_none(tmp_path):
  record = JobRecord("ab" * 16, "criteo", "2026-11-26 08:01:02 UTC")
  assert record.describe() == "config 'criteo', started 2026-11-26 08:01:02 UTC"
  assert JobRecord("ab" * 16, "", "T").describe() == "started T"
  (tmp_path / JOB_FILENAME).write_text('{"job_id": "x"')
  assert read_job_record(str(tmp_path)) is None
  assert read_job_record(str(tmp_path / "missing")) is None


def test_another_config_makes_no_data_in_the_workdir_before_it_is_refused(tmp_path):
  """The demo pointed at a --config=dataset job's workdir once generated 20,480
  examples in it before the configs were compared."""
  workdir = tmp_path / "job"
  workdir.mkdir()
  record = {"job_id": "ab" * 16, "config": "dataset", "started": "2026-11-26 08:01:02 UTC"}
  (workdir / JOB_FILENAME).write_text(json.dumps(record))
  config = launch_testing.tiny_config(num_steps=2)
  with pytest.raises(checkpointing.IncompatibleCheckpointError) as refused:
    launch.train_and_evaluate(config, str(workdir), config_name="demo")
  assert str(refused.value) == (
    f"workdir {workdir} holds another job (config 'dataset', started 2026-11-26 08:01:02"
    " UTC): this run's config is 'demo'; continue that job with its own config, or give this"
    f" run another --workdir (or delete {workdir} to start over)"
  )
  assert os.listdir(workdir) == [JOB_FILENAME]

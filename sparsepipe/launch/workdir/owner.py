"""The job a workdir holds: `<workdir>/job.json`, written once at the job's first start.

It names the job for people, e.g. when a run of another config is pointed
at the workdir ("workdir W holds another job (config 'demo', started
2026-11-26 08:01:02 UTC)"), and carries the job's id, the same id every
checkpoint of the job records (an incremental export checks it). JSON:
{"job_id", "config", "started"}; process 0 writes it atomically.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid

import jax
import numpy as np
from jax.experimental import multihost_utils

from sparsepipe import checkpointing
from sparsepipe.checkpointing import JOB_FILENAME


@dataclasses.dataclass(frozen=True)
class JobRecord:
  """Who a workdir belongs to.

  Attributes:
    job_id: 32 hex digits, made at the job's first start, kept in every
      checkpoint of the job.
    config: the config's name as given to the launcher (a shipped name or
      a config file's stem; "" when the job was started from Python).
    started: when the job first started, e.g. "2026-11-26 08:01:02 UTC".
  """

  job_id: str
  config: str
  started: str

  def describe(self) -> str:
    """ "config 'demo', started 2026-11-26 08:01:02 UTC" (the config when known)."""
    config = f"config '{self.config}', " if self.config else ""
    return f"{config}started {self.started}"


def new_job_id() -> str:
  """A fresh job id, process 0's, the same on every process."""
  digits = np.frombuffer(uuid.uuid4().bytes, np.uint8)
  if jax.process_count() > 1:
    digits = np.asarray(multihost_utils.broadcast_one_to_all(digits), np.uint8)
  return digits.tobytes().hex()


def utc_now() -> str:
  """Now as "2026-11-26 08:01:02 UTC" (strftime's %Z of a UTC time says "GMT" on glibc)."""
  return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def new_job_record(job_id: str, config_name: str) -> JobRecord:
  return JobRecord(job_id, config_name, utc_now())


def write_job_record(workdir: str, record: JobRecord) -> None:
  """Writes `<workdir>/job.json` (process 0 only; beside, then renamed)."""
  if jax.process_index() != 0:
    return
  path = os.path.join(workdir, JOB_FILENAME)
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(dataclasses.asdict(record), f)
    f.write("\n")
  os.replace(tmp, path)


def read_job_record(workdir: str) -> JobRecord | None:
  """The workdir's JobRecord; None if it has none or it cannot be read."""
  try:
    with open(os.path.join(workdir, JOB_FILENAME), encoding="utf-8") as f:
      data = json.load(f)
    return JobRecord(str(data["job_id"]), str(data["config"]), str(data["started"]))
  except (OSError, ValueError, KeyError, TypeError):
    return None


def another_job_error(
  workdir: str, error: checkpointing.ConfigMismatchError
) -> checkpointing.IncompatibleCheckpointError:
  """The error for a run whose config is not the config of the job in `workdir`."""
  return _another_job(workdir, read_job_record(workdir), error.summary())


def refuse_another_config(workdir: str, config_name: str) -> None:
  """Raises the another-job error when `workdir`'s job was started with another config.

  The launcher calls it before it writes generated data into the workdir:
  the full check (the configs compared, key by key) comes with the
  checkpoints, after the data, so a run of another config used to make its
  data in the other job's workdir first. Names are compared only where both
  are known.
  """
  record = read_job_record(workdir)
  if record and record.config and config_name and record.config != config_name:
    why = f"this run's config is '{config_name}'"
    raise _another_job(workdir, record, why)


def _another_job(
  workdir: str, record: JobRecord | None, why: str
) -> checkpointing.IncompatibleCheckpointError:
  who = f" ({record.describe()})" if record else ""
  return checkpointing.IncompatibleCheckpointError(
    f"workdir {workdir} holds another job{who}: {why}; continue that job with its"
    f" own config, or give this run another --workdir (or delete {workdir} to start over)"
  )

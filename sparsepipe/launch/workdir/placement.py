"""Where a job may live: a workdir is never a dataset or an export, nor inside saved work.

A job writes job.json, checkpoints/, metrics.jsonl and TensorBoard files
into its workdir. Pointed at a dataset (even its own --config.data.dir),
an export or another job's checkpoints/, it used to train and write them
there. So the workdir is refused, before it is made or locked, when it is a
dataset or an export, or lies inside saved work (a workdir, a dataset or an
export: core.saved_work); an existing workdir is resumed as before.
"""

from __future__ import annotations

import os

from sparsepipe.core.saved_work import refuse_inside_saved_work
from sparsepipe.core.saved_work import refuse_other_saved_work


def check_workdir(workdir: str) -> None:
  """Raises OutputPathError unless a job may keep its files in `workdir`."""
  given, real = os.path.abspath(workdir), os.path.realpath(workdir)
  refuse_inside_saved_work(given, real, "job's files", "--workdir")
  refuse_other_saved_work(given, real, "--workdir", "workdir", "a job")

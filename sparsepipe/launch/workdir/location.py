"""Where a job may live: a workdir is never a dataset or an export, nor inside saved work.

A job writes job.json, checkpoints/, metrics.jsonl and TensorBoard files
into its workdir. Pointed at a dataset (even its own --config.data.dir),
an export or another job's checkpoints/, it used to train and write them
there. So the workdir is refused, before it is made or locked, when it is a
dataset or an export, or lies inside saved work (a workdir, a dataset or an
export: core.saved_work); an existing workdir is resumed as before. A new
job is also refused a folder that holds saved work other than the data it
generates there itself (e.g. `--workdir=workdir` for `workdir/demo`): its
job.json would put the jobs inside it inside a workdir, where no launch
resumes them.
"""

from __future__ import annotations

import os
from typing import Sequence

from sparsepipe.core.saved_work import OutputPathError
from sparsepipe.core.saved_work import refuse_holding_saved_work
from sparsepipe.core.saved_work import refuse_inside_saved_work
from sparsepipe.core.saved_work import refuse_other_saved_work


def check_workdir(workdir: str, generated: Sequence[str] = ()) -> None:
  """Raises OutputPathError unless a job may keep its files in `workdir`.

  `generated`: the entries a job generates in its workdir (its datasets),
  which a new job's workdir may already hold (e.g. from a killed start).
  """
  given, real = os.path.abspath(workdir), os.path.realpath(workdir)
  refuse_inside_saved_work(given, real, "job's files", "--workdir")
  if os.path.exists(real) and not os.path.isdir(real):
    raise OutputPathError(
      f"--workdir '{given}' is a file: a job keeps its files in a folder; give another --workdir"
    )
  if not refuse_other_saved_work(given, real, "--workdir", "workdir", "a job"):
    refuse_holding_saved_work(given, real, "--workdir", "a job keeps its files", generated)

"""A job's workdir as the launcher lays it out: the names every command shares.

`<workdir>/job.json` names the job (written at its first start, since 0.3)
and `<workdir>/checkpoints/` holds its Orbax checkpoints (every version).
The launcher makes them; the commands that read a job from outside
(evaluate, export) find them by these names, and the commands that write
an output (export, apply, predict) recognise a workdir by them, so as never
to write into one or replace it.
"""

from __future__ import annotations

import os

JOB_FILENAME = "job.json"
CHECKPOINTS_DIRNAME = "checkpoints"


def workdir_marker(directory: str) -> str | None:
  """What makes `directory` a job's workdir ("job.json" or "checkpoints/"), or None."""
  if os.path.isfile(os.path.join(directory, JOB_FILENAME)):
    return JOB_FILENAME
  if os.path.isdir(os.path.join(directory, CHECKPOINTS_DIRNAME)):
    return f"{CHECKPOINTS_DIRNAME}/"
  return None

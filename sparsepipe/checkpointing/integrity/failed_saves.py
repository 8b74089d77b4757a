"""A save that fails (a full disk) is the job's one error line.

Orbax writes a step from background threads and asyncio tasks. When a write
fails, each thread logs the error with a traceback (absl, some 100 lines each),
asyncio logs the write tasks' and futures' exceptions as "never retrieved"
whenever they are collected, TensorStore callbacks report "Event loop is
closed", and the write coroutines never awaited are reported at exit; the
save's error itself reaches the job, which names it. `quiet_failed_saves`
holds all of those back for the rest of the process.
"""

from __future__ import annotations

import logging as std_logging
import os
import warnings

from sparsepipe.checkpointing.integrity.corrupt import drop_orbax_leftovers

# What marks an Orbax write in a record: its code's path in a task's repr, or what a
# TensorStore write error names: the step's temporary folder (local disks) or the
# OCDBT database Orbax writes arrays into (any storage).
_ORBAX_MARKERS = (f"{os.sep}orbax{os.sep}", ".orbax-checkpoint-tmp", " in OCDBT database at ")


class OrbaxWriteFailures(std_logging.Filter):
  """Drops the ERROR records of a failed Orbax write: absl's records logged from
  Orbax's code with a traceback, and asyncio's "Task/Future exception was never
  retrieved" for an Orbax task or a write into an Orbax temporary folder. Every
  other record passes."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    if record.levelno < std_logging.ERROR:
      return True
    if record.name == "asyncio":
      error = record.exc_info[1] if record.exc_info else None
      text = f"{record.getMessage()} {error}"
      return not any(marker in text for marker in _ORBAX_MARKERS)
    return not (_ORBAX_MARKERS[0] in record.pathname and record.exc_info)


def quiet_failed_saves() -> None:
  """From here on, a failed save leaves only the error it raises to the saver."""
  for name in ("absl", "asyncio"):
    logger = std_logging.getLogger(name)
    if not any(isinstance(f, OrbaxWriteFailures) for f in logger.filters):
      logger.addFilter(OrbaxWriteFailures())
  drop_orbax_leftovers()
  warnings.filterwarnings("ignore", r"coroutine '.*' was never awaited", RuntimeWarning)

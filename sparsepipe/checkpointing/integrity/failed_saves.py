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
import warnings

from sparsepipe.checkpointing.integrity.corrupt import ORBAX_CODE
from sparsepipe.checkpointing.integrity.corrupt import drop_orbax_leftovers
from sparsepipe.checkpointing.integrity.corrupt import drop_unretrieved_orbax_io


class OrbaxWriteFailures(std_logging.Filter):
  """Drops absl's ERROR records logged from Orbax's code with a traceback (each
  thread of a failed save logs one). Every other record passes."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    orbax_traceback = ORBAX_CODE in record.pathname and record.exc_info
    return record.levelno < std_logging.ERROR or not orbax_traceback


def quiet_failed_saves() -> None:
  """From here on, a failed save leaves only the error it raises to the saver."""
  absl_logger = std_logging.getLogger("absl")
  if not any(isinstance(f, OrbaxWriteFailures) for f in absl_logger.filters):
    absl_logger.addFilter(OrbaxWriteFailures())
  drop_unretrieved_orbax_io()
  drop_orbax_leftovers()
  warnings.filterwarnings("ignore", r"coroutine '.*' was never awaited", RuntimeWarning)

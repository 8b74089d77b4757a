"""Corrupt steps: short reasons, agreement between processes, quarantine.

A step that cannot be read is skipped; once an older step is restored, one
warning line per skipped step names the step, the item and the reason, and
the skipped directories are renamed `<step>.corrupt` (kept, never
deleted) so that new saves of those step numbers do not collide with them.
While a step is read, the long TensorStore specs Orbax logs for a failed read and the "Event loop is
closed" reports of TensorStore callbacks that outlive Orbax's event loop
are held back (`quiet_reads`): the warning says what matters.
"""

from __future__ import annotations

import contextlib
import logging as std_logging
import os
import sys
from typing import Any, Callable, Iterator

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from sparsepipe.checkpointing.checkpoint_errors import CorruptCheckpointError

CORRUPT_SUFFIX = ".corrupt"
# Orbax's code in a path: a coroutine's file, a log record's, a task's repr.
ORBAX_CODE = f"{os.sep}orbax{os.sep}"


_SPEC_DUMPS = (" [tensorstore_spec=", " See full TensorStore details")


def first_line(error: BaseException, limit: int = 400) -> str:
  """`Type: first line` of an error, without TensorStore's long spec dump."""
  lines = str(error).strip().splitlines()
  text = lines[0] if lines else ""
  for marker in _SPEC_DUMPS:
    text = text.split(marker)[0]
  if len(text) > limit:
    text = text[: limit - 3] + "..."
  return f"{type(error).__name__}: {text}"


def _is_orbax_leftover(unraisable: Any) -> bool:
  """A report of a failed read's or write's leftovers: a TensorStore callback aimed
  at Orbax's closed event loop, or an Orbax coroutine that failed while it was being
  discarded."""
  value = getattr(unraisable, "exc_value", None)
  if isinstance(value, RuntimeError) and "Event loop is closed" in str(value):
    return True
  code = getattr(getattr(unraisable, "object", None), "cr_code", None)
  return code is not None and ORBAX_CODE in code.co_filename


# What marks Orbax's TensorStore reads and writes in an error or a task's report:
# TensorStore's spec dump, the OCDBT database a step's arrays live in (any storage),
# a step's temporary folder (local disks), Orbax's code in a coroutine's repr.
_ORBAX_IO_MARKERS = (
  *_SPEC_DUMPS,
  " in OCDBT database at ",
  ".orbax-checkpoint-tmp",
  ORBAX_CODE,
)


class _UnretrievedOrbaxIO(std_logging.Filter):
  """Drops asyncio's "Task (or Future) exception was never retrieved" for Orbax's
  TensorStore reads and writes: the siblings of a failed read (reported as
  CorruptCheckpointError) or write (the save's error), logged whenever they are
  collected. Every other record passes."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    text = f"{record.getMessage()} {error}"
    return not any(marker in text for marker in _ORBAX_IO_MARKERS)


_UNRETRIEVED_ORBAX_IO = _UnretrievedOrbaxIO()


def drop_unretrieved_orbax_io() -> None:
  """From here on, asyncio's reports of Orbax reads and writes nobody awaited are dropped."""
  std_logging.getLogger("asyncio").addFilter(_UNRETRIEVED_ORBAX_IO)  # once: same object


@contextlib.contextmanager
def quiet_reads() -> Iterator[None]:
  """Holds back Orbax's logs and the leftovers of a failed read.

  Orbax logs a failed read at ERROR with the whole TensorStore spec (about
  140 lines); the failure is reported as a CorruptCheckpointError instead.
  TensorStore callbacks of a failed read may fire after Orbax closed its
  event loop, and its unfinished read coroutines fail when they are
  discarded; Python reports both as unraisable exceptions. They are dropped
  (after a failed read, also later), and so are asyncio's reports of the
  read tasks whose failure nobody retrieved; anything else passes through.
  """
  drop_unretrieved_orbax_io()
  logger = std_logging.getLogger("absl")
  level = logger.level
  logger.setLevel(max(level, std_logging.CRITICAL))
  previous = sys.unraisablehook

  def hook(unraisable: Any) -> None:
    if not _is_orbax_leftover(unraisable):
      previous(unraisable)

  sys.unraisablehook = hook
  failed = True
  try:
    yield
    failed = False
  finally:
    logger.setLevel(level)
    if sys.unraisablehook is hook:
      # Callbacks of a failed read may still fire after the read returned.
      late = failed and not isinstance(previous, _LateTeardownFilter)
      sys.unraisablehook = _LateTeardownFilter(previous) if late else previous


def drop_orbax_leftovers() -> None:
  """From here on, drops the unraisable-exception reports of failed Orbax reads and
  writes (`quiet_reads` does so while reading): a save that fails (a full disk)
  left some 30 "Event loop is closed" tracebacks, while its error is raised to
  the saver."""
  if not isinstance(sys.unraisablehook, _LateTeardownFilter):
    sys.unraisablehook = _LateTeardownFilter(sys.unraisablehook)


class _LateTeardownFilter:
  """Keeps dropping failed reads' and writes' leftovers; passes everything else."""

  def __init__(self, previous: Callable[[Any], None]):
    self._previous = previous

  def __call__(self, unraisable: Any) -> None:
    if not _is_orbax_leftover(unraisable):
      self._previous(unraisable)


def agree(attempt: Callable[[], Any]) -> Any:
  """Runs `attempt` on every process; corrupt anywhere means corrupt everywhere."""
  try:
    result, reason = attempt(), ""
  except CorruptCheckpointError as e:
    result, reason = None, str(e)
  if jax.process_count() > 1:
    ok = multihost_utils.process_allgather(np.int32(not reason))
    failed = [i for i, v in enumerate(np.asarray(ok).ravel()) if not v]
    if failed and not reason:
      reason = f"processes {failed} could not read the checkpoint"
  if reason:
    raise CorruptCheckpointError(reason)
  return result


def quarantine(directory: epath.Path, skipped: list[tuple[int, str]], *, rename: bool) -> None:
  """Renames skipped corrupt steps to `<step>.corrupt[.k]` (kept on disk).

  `skipped`: (step, reason) pairs; each gets one warning line (process 0).
  With `rename` False (a read-only reader) they only get the warning.
  """
  if jax.process_index() == 0:
    name_format = ocp.path.step.standard_name_format()
    for step, reason in skipped:
      source = ocp.path.step.build_step_path(directory, name_format, step)
      if not rename or not source.exists():
        logging.warning("Skipped %s", reason)
        continue
      target = source.parent / f"{source.name}{CORRUPT_SUFFIX}"
      k = 1
      while target.exists():
        k += 1
        target = source.parent / f"{source.name}{CORRUPT_SUFFIX}.{k}"
      source.rename(target)
      logging.warning("Skipped %s; moved it to %s", reason, target)
  multihost_utils.sync_global_devices("sparsepipe_checkpoint_quarantine")

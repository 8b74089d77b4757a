"""Checkpoint errors: each names the checkpoint (directory, step) and the reason."""

from __future__ import annotations


class CheckpointError(ValueError):
  """Base class of every checkpoint problem raised by sparsepipe."""


class UnwritableCheckpointDirectoryError(CheckpointError):
  """The checkpoint directory cannot be written (permissions, a read-only file
  system, a path through a file). Found when the manager opens, before any
  training: Orbax itself would fail only at the first save, in the background."""


class IncompatibleCheckpointError(CheckpointError):
  """The checkpoint is intact but was written by an incompatible run.

  Another config, process count, data worker count, mesh, or a state whose
  layout cannot follow a device-count change. Restore refuses it instead of
  falling back to an older step: an older step would be just as
  incompatible, and the user must decide.
  """


class CorruptCheckpointError(CheckpointError):
  """A step is unreadable: missing item, garbled or truncated file.

  While searching for the latest restorable step such a step is skipped
  with a warning; it is raised when no step can be restored or when an
  explicitly requested step is corrupt.
  """


class ConfigMismatchError(IncompatibleCheckpointError):
  """The checkpoint was written with another config (keys that may not change).

  `differences` holds every (dotted key, saved value, current value); the
  message names the first few (`MISMATCHES_SHOWN`) and how many more there are.
  """

  MISMATCHES_SHOWN = 3

  def __init__(self, where: str, differences: list[tuple[str, str, str]]):
    self.where = where
    self.differences = differences
    super().__init__(f"{where} was written with another config: {self.summary()}")

  def summary(self) -> str:
    """'config.a=1, current run has 2; ... (and 4 more)': the first few differences."""
    shown = self.differences[: self.MISMATCHES_SHOWN]
    text = "; ".join(f"{key}={saved}, current run has {now}" for key, saved, now in shown)
    more = len(self.differences) - len(shown)
    return text + (f" (and {more} more)" if more else "")


class StepNotKeptError(CheckpointError):
  """A step was asked for that the checkpoint directory does not hold."""

"""Checkpoint errors: each names the checkpoint (directory, step) and the reason."""

from __future__ import annotations


class CheckpointError(ValueError):
  """Base class of every checkpoint problem raised by sparsepipe."""


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

"""Exceptions of the per-host transforms: specs, stacking, COO preprocessing, FDO.

Every one is a ValueError, so callers that only know "bad input" can catch
that, and every message names the thing (feature, table, stack, file) and the
numbers involved (limit and observed value). Where jax-tpu-embedding aborts
the process or silently drops data, we raise one of these instead.
"""

from __future__ import annotations


class StackingError(ValueError):
  """Feature/table specs that cannot be stacked or prepared as asked."""


class PreprocessingError(ValueError):
  """Input that cannot be turned into COO buffers (shape, dtype, id range)."""


class LimitExceededError(PreprocessingError):
  """A partition or buffer limit was exceeded and id dropping is disabled."""


class FDOStatsError(ValueError):
  """An FDO statistics file or state that cannot be read or merged."""


class DataWorkerExitedError(ChildProcessError):
  """A data worker process ended while the input needed it (killed, or crashed)."""

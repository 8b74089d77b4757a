"""The launcher: `python -m sparsepipe.launch` and the job it runs.

The public names load on first use: `python -m sparsepipe.launch` imports
this package before its __main__ runs, and __main__ takes over SIGTERM and
Ctrl-C first thing (stopping.py); importing JAX, Orbax and Grain here would
leave a launch's first seconds to Python's default handlers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Public name -> the module that defines it.
_PUBLIC = {
  "JobResult": "sparsepipe.launch.job.context",
  "JobHook": "sparsepipe.launch.job.hooks",
  "NonFiniteLossError": "sparsepipe.launch.job.hooks",
  "MUTABLE_CONFIG_KEYS": "sparsepipe.launch.job.checkpoints",
  "train_and_evaluate": "sparsepipe.launch.job.run",
  "Position": "sparsepipe.launch.job.schedule",
  "Schedule": "sparsepipe.launch.job.schedule",
  "LOCK_FILENAME": "sparsepipe.launch.workdir.lock",
  "WorkdirInUseError": "sparsepipe.launch.workdir.lock",
  "WorkdirLease": "sparsepipe.launch.workdir.lock",
  "exclusive_workdir": "sparsepipe.launch.workdir.lock",
}
__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:
  from sparsepipe.launch.job.context import JobResult
  from sparsepipe.launch.job.hooks import JobHook
  from sparsepipe.launch.job.hooks import NonFiniteLossError
  from sparsepipe.launch.job.checkpoints import MUTABLE_CONFIG_KEYS
  from sparsepipe.launch.job.run import train_and_evaluate
  from sparsepipe.launch.job.schedule import Position
  from sparsepipe.launch.job.schedule import Schedule
  from sparsepipe.launch.workdir.lock import LOCK_FILENAME
  from sparsepipe.launch.workdir.lock import WorkdirInUseError
  from sparsepipe.launch.workdir.lock import WorkdirLease
  from sparsepipe.launch.workdir.lock import exclusive_workdir


def __getattr__(name: str) -> Any:
  """Imports a public name's module on first use (PEP 562)."""
  if name not in _PUBLIC:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  value = getattr(importlib.import_module(_PUBLIC[name]), name)
  globals()[name] = value
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_PUBLIC))

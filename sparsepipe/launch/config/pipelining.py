"""config.pipelining: true, false or "auto" (the default) -> the step a job runs.

"auto" takes the mode a resumed job was saved with (its checkpoints record a
bool), else `pipeline.pipelining_pays_off` for the job's devices: pipelined
on more than one GPU or TPU device, sequential on CPU and on one device.
The command line gives strings ("--config.pipelining=false"), a config file
may give bools; both are taken.
"""

from __future__ import annotations

from typing import Any

from sparsepipe import pipeline

AUTO = "auto"
_NAMED = {"true": True, "false": False, AUTO: None}


def pipelining_choice(value: Any) -> bool | None:
  """True or False as asked, None for "auto"; a clear error for anything else."""
  if isinstance(value, bool):
    return value
  if isinstance(value, str) and value.strip().lower() in _NAMED:
    return _NAMED[value.strip().lower()]
  raise ValueError(f"config.pipelining={value!r}: expected true, false or auto")


def resolve_pipelining(
  value: Any, platform: str, device_count: int, saved: bool | None = None
) -> bool:
  """The mode a job runs: `value` if true/false, else `saved` (a resumed job's), else the rule."""
  choice = pipelining_choice(value)
  if choice is not None:
    return choice
  if saved is not None:
    return saved
  return pipeline.pipelining_pays_off(platform, device_count)

"""Packed records by default: config.synthetic.examples_per_record and data.shuffle_window.

Both default to "what the job already has", so that a job saved with other
values resumes as it was saved:

* `synthetic.examples_per_record` = 0 (the default): a resumed job keeps its
  saved packing; a new one packs `NEW_EXAMPLES_PER_RECORD` examples per
  record, or takes the packing of the data already generated in its workdir.
* `data.shuffle_window` = -1 (the default): a resumed job keeps its saved
  window (0, whole records, for a job saved before the option); a new one
  shuffles the examples over windows of `NEW_SHUFFLE_WINDOW` records.

A job records the resolved values in its checkpoints, never the defaults, so
a later change of these constants leaves its batches as they were.
"""

from __future__ import annotations

from typing import Any

AUTO_EXAMPLES_PER_RECORD = 0
AUTO_SHUFFLE_WINDOW = -1
NEW_EXAMPLES_PER_RECORD = 128
NEW_SHUFFLE_WINDOW = 256


def _resolved(
  field: str, what: str, value: Any, auto: int, known: Any, new: int, others: str
) -> int:
  """`value` if above `auto`, else `known` (None: unknown), else `new`; `what`
  and `others` say in the error below `auto` what the default and the other
  values mean."""
  chosen = int(value)
  if chosen < auto:
    raise ValueError(
      f"config.{field}={chosen}: {auto} (the default: a resumed job's {what}, else {new}){others}"
    )
  if chosen != auto:
    return chosen
  return new if known is None else int(known)


def shuffle_window(value: Any, saved: Any = None) -> int:
  """The window a job runs with: `value` if >= 0, else `saved`, else a new job's."""
  return _resolved(
    "data.shuffle_window",
    "window",
    value,
    AUTO_SHUFFLE_WINDOW,
    saved,
    NEW_SHUFFLE_WINDOW,
    ", 0 (whole records) or a window of records",
  )


def examples_per_record(value: Any, known: Any = None) -> int:
  """The packing of generated data: `value` if > 0, else `known` (a resumed job's,
  or that of the data already generated in the workdir), else a new job's."""
  return _resolved(
    "synthetic.examples_per_record",
    "packing",
    value,
    AUTO_EXAMPLES_PER_RECORD,
    known,
    NEW_EXAMPLES_PER_RECORD,
    " or the examples per record",
  )


def resolve_saved_packing(config: Any, saved: Any) -> None:
  """Sets the defaults (-1, 0) of both fields of `config` to what the job runs with.

  `saved` is the resumed job's saved ConfigDict, None for a new job: then the
  window becomes a new job's and the packing stays 0 for `ensure_dataset`,
  which takes that of data already generated in the workdir, else a new
  job's.
  """
  window = packing = None
  if saved is not None:
    window = saved.get("data", {}).get("shuffle_window", 0)  # 0: saved before the option
    packing = saved.get("synthetic", {}).get("examples_per_record")
  config.data.shuffle_window = shuffle_window(config.data.shuffle_window, window)
  if packing is not None:
    config.synthetic.examples_per_record = examples_per_record(
      config.synthetic.examples_per_record, packing
    )

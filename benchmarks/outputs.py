"""What a benchmark writes: its `--json` figures and the folder it keeps its runs in.

A benchmark runs for minutes, then writes its figures. The path is checked
when the flags are read, as the launcher's own outputs are
(serving.check_file_output): never inside a workdir, a dataset or an export,
not a folder, in a folder that exists. An existing file is replaced, as a
rerun of the same command expects; the figures go to a temporary file beside
it that then replaces it, so the file is whole, the old one or the new one.

A benchmark given a folder for its runs (quality.py and resize.py's
--workdir, startup.py's --data_root) makes jobs and datasets there, reused or
replaced by a rerun. The folder must be new, empty, or one the same
benchmark kept before (its MARKER file says which): never saved work, inside
saved work, or a folder of other things, where a dataset of the same name
would have been replaced.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Any

from absl import app
from absl import flags

from sparsepipe import core
from sparsepipe import serving
from sparsepipe.core import saved_work

MARKER = ".sparsepipe-benchmark.json"


def check(path: str | None) -> None:
  """Raises, before the benchmark runs, unless its figures may go to `path`."""
  if path:
    serving.check_file_output(path, overwrite=True, what="figures", flag="--json")


def json_flag(help_text: str = "Write the figures to this JSON file.") -> flags.FlagHolder:
  """Defines the absl flag --json, checked (`check`) when the flags are parsed."""
  holder = flags.DEFINE_string("json", None, help_text)

  def valid(path: str | None) -> bool:
    try:
      check(path)
    except ValueError as error:  # serving's OutputPathError
      raise flags.ValidationError(str(error)) from error
    return True

  flags.register_validator("json", valid)
  return holder


def argparse_path(path: str) -> str:
  """argparse's type= for --json: `path`, checked (`check`)."""
  try:
    check(path)
  except ValueError as error:
    raise argparse.ArgumentTypeError(str(error)) from error
  return path


def write(path: str | None, figures: Any, what: str = "the figures", **json_args: Any) -> None:
  """Writes `figures` (`what`, for an error) as JSON to `path` (None: nothing),
  whole; `json_args` go to json.dump (default indent=1)."""
  if path:
    with core.written_whole(what, os.path.abspath(path)) as tmp:
      with open(tmp, "w") as f:
        json.dump(figures, f, **{"indent": 1, **json_args})


def _kept_by(folder: str) -> str | None:
  """The benchmark whose MARKER `folder` holds, or None."""
  try:
    with open(os.path.join(folder, MARKER)) as f:
      return json.load(f).get("benchmark")
  except (OSError, ValueError, AttributeError):
    return None


def runs_folder(path: str | None, benchmark: str, flag: str) -> str:
  """`path`, checked (module docstring), made and marked as `benchmark`'s; without
  `path`, a new temporary folder (the benchmark removes it at its end).

  Raises absl's app.UsageError naming `flag` before anything is made.
  """
  if not path:
    return tempfile.mkdtemp(prefix=f"sparsepipe_{benchmark}_")
  try:
    _check_runs_folder(path, benchmark, flag)
  except ValueError as error:  # serving's OutputPathError
    raise app.UsageError(str(error)) from error
  os.makedirs(path, exist_ok=True)
  write(os.path.join(path, MARKER), {"benchmark": benchmark}, what="the benchmark's marker")
  return os.path.abspath(path)


def _check_runs_folder(path: str, benchmark: str, flag: str) -> None:
  given, real = os.path.abspath(path), os.path.realpath(path)
  saved_work.refuse_inside_saved_work(given, real, "runs", flag)
  saved_work.refuse_other_saved_work(given, real, flag, "", f"{benchmark}.py")
  if os.path.exists(real) and not os.path.isdir(real):
    raise saved_work.OutputPathError(f"{flag} '{given}' is a file: give a folder")
  entries = sorted(os.listdir(real)) if os.path.isdir(real) else []
  kept = _kept_by(real)
  if entries and kept != benchmark:
    more = f" and {len(entries) - 1} more" if len(entries) > 1 else ""
    what = (
      f"is kept by {kept}.py"
      if kept
      else f"holds {saved_work.describe_entry(real, entries[0])}{more}, not kept by {benchmark}.py"
    )
    raise saved_work.OutputPathError(
      f"{flag} '{given}' {what}: give a new or empty folder, or one {benchmark}.py kept before"
    )

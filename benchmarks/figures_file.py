"""The benchmarks' `--json` file: checked before the run, written whole after it.

A benchmark runs for minutes, then writes its figures. The path is checked
when the flags are read, as the launcher's own outputs are
(serving.check_file_output): never inside a workdir, a dataset or an export,
not a folder, in a folder that exists. An existing file is replaced, as a
rerun of the same command expects; the figures go to a temporary file beside
it that then replaces it, so the file is whole, the old one or the new one.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from absl import flags

from sparsepipe import core
from sparsepipe import serving


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


def write(path: str | None, figures: Any, **json_args: Any) -> None:
  """Writes `figures` as JSON to `path` (None: nothing); `json_args` go to
  json.dump (default indent=1)."""
  if path:
    with core.written_whole("the figures", os.path.abspath(path)) as tmp:
      with open(tmp, "w") as f:
        json.dump(figures, f, **{"indent": 1, **json_args})

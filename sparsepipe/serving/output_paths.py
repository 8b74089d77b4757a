"""Where a command may write its output: never into, over or above saved work.

Saved work is what a command cannot make again cheaply. Each kind is
recognised by the file that makes a directory one (a manifest.json or
export.json that reads as another program's, with another "format", does
not count; an unreadable one does):

    workdir   job.json or checkpoints/   a training job (checkpointing.workdir_layout)
    dataset   manifest.json              a converted dataset (data.manifest)
    export    export.json                an export or a delta (export_format)

An export's output (launch.export, serving.apply) is refused inside saved
work, when it is, is inside or holds one of the command's inputs, and when
it exists and is anything but an export that holds only an export's own
files: `--overwrite` replaces an export, never a workdir, a dataset, a file
or a folder of other things. A scores file's output (serving.predict) is
refused inside saved work and when it is a folder; an existing file is
replaced only with `--overwrite`. Each refusal is an OutputPathError (or,
for an existing output without `--overwrite`, a FileExistsError) naming the
output and what it would have destroyed, raised before anything is written.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

from sparsepipe.checkpointing import workdir_marker
from sparsepipe.data.manifest import MANIFEST_FORMAT
from sparsepipe.data.manifest import MANIFEST_NAME
from sparsepipe.serving.export_format import EXPORT_FORMAT
from sparsepipe.serving.export_format import INFO_FILENAME
from sparsepipe.serving.export_format import PARAMS_FILENAME
from sparsepipe.serving.export_format import PREDICT_FILENAME

# What an export directory holds (export_format); anything else in it is not its own.
_EXPORT_FILES = (INFO_FILENAME, PARAMS_FILENAME, PREDICT_FILENAME)
_EXPORT_TABLES = "tables"


class OutputPathError(ValueError):
  """An --output that would write into or over saved work: names both."""


def _ours(path: str, file_format: str) -> bool:
  """Whether the JSON file at `path` may be sparsepipe's: another program's manifest.json
  (it reads, with another "format") is not; an unreadable one is (when in doubt, keep)."""
  if not os.path.isfile(path):
    return False
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, ValueError):
    return True
  return not isinstance(data, dict) or data.get("format") == file_format


def saved_work(directory: str) -> tuple[str, str] | None:
  """(kind, the entry that makes it one) of saved work, e.g. ("workdir", "job.json"); else None."""
  if not os.path.isdir(directory):
    return None
  marker = workdir_marker(directory)
  if marker:
    return "workdir", marker
  for kind, name, file_format in (
    ("dataset", MANIFEST_NAME, MANIFEST_FORMAT),
    ("export", INFO_FILENAME, EXPORT_FORMAT),
  ):
    if _ours(os.path.join(directory, name), file_format):
      return kind, name
  return None


def _enclosing(path: str) -> str | None:
  """The nearest folder above `path` that is saved work, described; None if there is none."""
  parent = os.path.dirname(path)
  while True:
    found = saved_work(parent)
    if found:
      return f"{found[0]} '{parent}' (it has {found[1]})"
    if os.path.dirname(parent) == parent:
      return None
    parent = os.path.dirname(parent)


def _check_inputs(given: str, real: str, inputs: Sequence[tuple[str, str]]) -> None:
  """Refuses an output that is, is inside or holds one of the command's `inputs`."""
  for label, path in inputs:
    source = os.path.realpath(path)
    if real == source:
      why = f"is also {label}"
    elif os.path.commonpath([real, source]) == source:
      why = f"is inside {label} '{source}'"
    elif os.path.commonpath([real, source]) == real:
      why = f"holds {label} '{source}'"
    else:
      continue
    raise OutputPathError(
      f"--output '{given}' {why}: an output never replaces or writes into the command's"
      " inputs; give another --output"
    )


def _check_not_inside_saved_work(given: str, real: str, what: str) -> None:
  around = _enclosing(real)
  if around:
    raise OutputPathError(
      f"--output '{given}' is inside {around}: write the {what} outside any workdir, dataset"
      " or export"
    )


def _foreign_entries(directory: str) -> list[str]:
  """The entries of an export directory that an export does not write, sorted."""
  foreign = []
  for name in sorted(os.listdir(directory)):
    path = os.path.join(directory, name)
    if name in _EXPORT_FILES and os.path.isfile(path) and not os.path.islink(path):
      continue
    if name == _EXPORT_TABLES and os.path.isdir(path) and not os.path.islink(path):
      tables = [
        t
        for t in sorted(os.listdir(path))
        if not (t.endswith(".npy") and os.path.isfile(os.path.join(path, t)))
      ]
      foreign.extend(os.path.join(name, t) for t in tables)
      continue
    foreign.append(name)
  return foreign


def _describe_entry(directory: str, name: str) -> str:
  found = saved_work(os.path.join(directory, name))
  return f"{found[0]} '{name}'" if found else f"'{name}'"


def check_export_output(
  output: str, *, overwrite: bool, inputs: Sequence[tuple[str, str]] = ()
) -> None:
  """Raises unless an export may be written at `output` (see the module docstring).

  Args:
    output: the export directory to write.
    overwrite: whether an existing export there may be replaced.
    inputs: (label, path) of what the command reads, e.g. ("the --since export", E).
  """
  given, real = os.path.abspath(output), os.path.realpath(output)
  _check_inputs(given, real, inputs)
  _check_not_inside_saved_work(given, real, "export")
  if os.path.islink(given):
    raise OutputPathError(
      f"--output '{given}' is a symbolic link (to '{real}'): give the folder itself"
    )
  if not os.path.lexists(given):
    return
  if not os.path.isdir(given):
    raise OutputPathError(
      f"--output '{given}' is a file, not an export: --overwrite replaces only an export;"
      " give another --output"
    )
  found = saved_work(given)
  if found and found[0] != "export":
    raise OutputPathError(
      f"--output '{given}' is a {found[0]} (it has {found[1]}): an export never replaces one;"
      " give another --output"
    )
  foreign = _foreign_entries(given) if found else sorted(os.listdir(given))
  # Name saved work first: it is what an --overwrite would have destroyed.
  foreign.sort(key=lambda name: saved_work(os.path.join(given, name)) is None)
  if foreign:
    what = "an export that also holds" if found else "a folder, not an export: it holds"
    raise OutputPathError(
      f"--output '{given}' is {what} {_describe_entry(given, foreign[0])}"
      f"{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}: --overwrite replaces"
      " only an export and what it wrote; give another --output"
    )
  if not overwrite:
    raise FileExistsError(f"'{given}' exists: give --overwrite to replace it, or another --output")


def check_file_output(output: str, *, overwrite: bool) -> None:
  """Raises unless a file (e.g. predict's scores) may be written at `output`."""
  given, real = os.path.abspath(output), os.path.realpath(output)
  _check_not_inside_saved_work(given, real, "scores")
  if os.path.isdir(real):
    found = saved_work(real)
    what = f"a {found[0]} (it has {found[1]})" if found else "a folder"
    raise OutputPathError(f"--output '{given}' is {what}: give the path of the file to write")
  if os.path.lexists(given) and not overwrite:
    raise FileExistsError(f"'{given}' exists: give --overwrite to replace it, or another --output")
  if not os.path.isdir(os.path.dirname(real)):
    raise OutputPathError(
      f"--output '{given}': its folder '{os.path.dirname(real)}' does not exist"
    )

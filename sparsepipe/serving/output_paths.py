"""Where a command may write its output: never into, over or above saved work.

Saved work (workdirs, datasets, exports) is recognised as core.saved_work says.
An export's output (launch.export, serving.apply) is refused inside saved
work, when it is, is inside or holds one of the command's inputs, and when
it exists and is anything but an export that holds only an export's own
files: `--overwrite` replaces an export, never a workdir, a dataset, a file
or a folder of other things. A scores file's output (serving.predict) is
refused inside saved work and when it is a folder; an existing file is
replaced only with `--overwrite` (so is a metrics file, launch.evaluate's
`--json`). Each refusal is an OutputPathError (or,
for an existing output without `--overwrite`, a FileExistsError) naming the
output and what it would have destroyed, raised before anything is written.
"""

from __future__ import annotations

import os
from typing import Sequence

from sparsepipe.core.saved_work import OutputPathError
from sparsepipe.core.saved_work import a_kind
from sparsepipe.core.saved_work import describe_entry
from sparsepipe.core.saved_work import refuse_inside_saved_work
from sparsepipe.core.saved_work import refuse_other_saved_work
from sparsepipe.core.saved_work import refuse_symbolic_link
from sparsepipe.core.saved_work import saved_work
from sparsepipe.serving.export_format import INFO_FILENAME
from sparsepipe.serving.export_format import PARAMS_FILENAME
from sparsepipe.serving.export_format import PREDICT_FILENAME

# What an export directory holds (export_format); anything else in it is not its own.
_EXPORT_FILES = (INFO_FILENAME, PARAMS_FILENAME, PREDICT_FILENAME)
_EXPORT_TABLES = "tables"


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
  refuse_inside_saved_work(given, real, "export")
  refuse_symbolic_link(given)
  if not os.path.lexists(given):
    return
  if not os.path.isdir(given):
    raise OutputPathError(
      f"--output '{given}' is a file, not an export: --overwrite replaces only an export;"
      " give another --output"
    )
  found = refuse_other_saved_work(given, given, "--output", "export", "an export")
  foreign = _foreign_entries(given) if found else sorted(os.listdir(given))
  # Name saved work first: it is what an --overwrite would have destroyed.
  foreign.sort(key=lambda name: saved_work(os.path.join(given, name)) is None)
  if foreign:
    what = "an export that also holds" if found else "a folder, not an export: it holds"
    raise OutputPathError(
      f"--output '{given}' is {what} {describe_entry(given, foreign[0])}"
      f"{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}: --overwrite replaces"
      " only an export and what it wrote; give another --output"
    )
  if not overwrite:
    raise FileExistsError(f"'{given}' exists: give --overwrite to replace it, or another --output")


def check_file_output(
  output: str, *, overwrite: bool, what: str = "scores", flag: str = "--output"
) -> None:
  """Raises unless a file of `what` (predict's scores, evaluate's metrics) may be
  written at `output`, the value of `flag`."""
  given, real = os.path.abspath(output), os.path.realpath(output)
  refuse_inside_saved_work(given, real, what, flag)
  if output.endswith(("/", os.sep)):
    raise OutputPathError(f"{flag} '{output}' names a folder: give the path of the file to write")
  if os.path.isdir(real):
    found = saved_work(real)
    kind = f"{a_kind(found[0])} (it has {found[1]})" if found else "a folder"
    raise OutputPathError(f"{flag} '{given}' is {kind}: give the path of the file to write")
  if os.path.lexists(given) and not overwrite:
    raise FileExistsError(f"'{given}' exists: give --overwrite to replace it, or another {flag}")
  if not os.path.isdir(os.path.dirname(real)):
    raise OutputPathError(f"{flag} '{given}': its folder '{os.path.dirname(real)}' does not exist")

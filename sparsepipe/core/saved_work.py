"""Saved work: the folders no command may write into, over or above by mistake.

Saved work is what a command cannot make again cheaply. Each kind is
recognised by the entry that makes a directory one (a manifest.json or
export.json that reads as another program's, with another "format", does
not count; an unreadable one does):

    workdir   job.json or checkpoints/   a training job (launch; checkpoints/ of steps)
    dataset   manifest.json              a converted dataset (data.manifest)
    export    export.json                an export or a delta (serving.export_format)

The names live here, below every subpackage, because every command that
writes an output checks it against all three: the converters
(data.convert.outputs), the launcher's --workdir
(launch.workdir.location) and the serving commands (serving.output_paths).
"""

from __future__ import annotations

import collections
import json
import os
from typing import Sequence


class OutputPathError(ValueError):
  """An output that would write into or over saved work: names both."""


JOB_FILENAME = "job.json"
CHECKPOINTS_DIRNAME = "checkpoints"
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "sparsepipe.arrayrecord"
EXPORT_INFO_FILENAME = "export.json"
EXPORT_FORMAT = "sparsepipe.export"


def a_kind(kind: str) -> str:
  """The kind with its article, for a message: "a workdir", "an export"."""
  return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def workdir_marker(directory: str) -> str | None:
  """What makes `directory` a job's workdir ("job.json" or "checkpoints/"), or None.

  A workdir of 0.1 or 0.2 has no job.json: its checkpoints/ holds step
  directories (`<step>/`, or `<step>.corrupt/`). Another program's
  checkpoints/ (e.g. of .ckpt files) does not make one.
  """
  if os.path.isfile(os.path.join(directory, JOB_FILENAME)):
    return JOB_FILENAME
  checkpoints = os.path.join(directory, CHECKPOINTS_DIRNAME)
  if os.path.isdir(checkpoints) and any(
    name.split(".")[0].isdigit() and os.path.isdir(os.path.join(checkpoints, name))
    for name in os.listdir(checkpoints)
  ):
    return f"{CHECKPOINTS_DIRNAME}/"
  return None


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
    ("export", EXPORT_INFO_FILENAME, EXPORT_FORMAT),
  ):
    if _ours(os.path.join(directory, name), file_format):
      return kind, name
  return None


def describe(directory: str) -> str | None:
  """ "workdir 'W' (it has job.json)" when `directory` is saved work, else None."""
  found = saved_work(directory)
  return f"{found[0]} '{directory}' (it has {found[1]})" if found else None


def enclosing_saved_work(path: str) -> str | None:
  """The nearest folder above `path` that is saved work, described; None if there is none."""
  parent = os.path.dirname(path)
  while True:
    around = describe(parent)
    if around:
      return around
    if os.path.dirname(parent) == parent:
      return None
    parent = os.path.dirname(parent)


def refuse_inside_saved_work(given: str, real: str, what: str, flag: str = "--output") -> None:
  """Raises OutputPathError if `real` (the resolved `given`) lies inside saved work."""
  around = enclosing_saved_work(real)
  if around:
    raise OutputPathError(
      f"{flag} '{given}' is inside {around}: write the {what} outside any workdir, dataset"
      " or export"
    )


def refuse_symbolic_link(given: str, flag: str = "--output") -> None:
  """Raises OutputPathError if the output `given` is a symbolic link.

  An output is built beside its place and renamed into it (core.work_directories):
  a link would be replaced by the new folder, its target left as it was.
  """
  if os.path.islink(given):
    raise OutputPathError(
      f"{flag} '{given}' is a symbolic link (to '{os.path.realpath(given)}'): give the folder"
      " itself"
    )


def refuse_other_saved_work(
  given: str, real: str, flag: str, own_kind: str, writer: str
) -> tuple[str, str] | None:
  """Raises OutputPathError if `real` is saved work of a kind other than `own_kind`.

  `writer` names what the command writes, for the message ("a job", "an
  export"). Returns what `real` is (saved_work), so a caller can go on.
  """
  found = saved_work(real)
  if found and found[0] != own_kind:
    raise OutputPathError(
      f"{flag} '{given}' is {a_kind(found[0])} (it has {found[1]}): {writer} never replaces or"
      f" writes into one; give another {flag}"
    )
  return found


def describe_entry(directory: str, name: str) -> str:
  """Entry `name` of `directory` for a message: "dataset 'x'" when it is saved work, else "'x'"."""
  found = saved_work(os.path.join(directory, name))
  return f"{found[0]} '{name}'" if found else f"'{name}'"


# Entries looked at below an output for saved work before giving up (and refusing).
SEARCH_LIMIT = 100_000


def saved_work_inside(directory: str, own: Sequence[str] = ()) -> list[str]:
  """The saved work anywhere below `directory`, described ("dataset 'a/x'"), in
  the order found (nearest first); entries of `directory` named in `own` (what
  the writer itself keeps there) are left out.

  Saved work is not looked into, nor are symbolic links followed below the
  first level (a link there to saved work counts, its target is not searched).
  Past SEARCH_LIMIT entries the search stops, and the last entry says so: a
  folder that large is not one an output should go into.
  """
  found, looked = [], 0
  queue = collections.deque(n for n in sorted(os.listdir(directory)) if n not in own)
  while queue:
    relative = queue.popleft()
    looked += 1
    if looked > SEARCH_LIMIT:
      found.append(f"more than {SEARCH_LIMIT:,} entries (not all searched for saved work)")
      break
    path = os.path.join(directory, relative)
    kind = saved_work(path)
    if kind:
      found.append(f"{kind[0]} '{relative}'")
    elif os.path.isdir(path) and not os.path.islink(path):
      try:
        queue.extend(os.path.join(relative, n) for n in sorted(os.listdir(path)))
      except OSError:  # a folder this user cannot read holds nothing this user can destroy
        pass
  return found


def refuse_holding_saved_work(
  given: str, real: str, flag: str, what: str, own: Sequence[str] = ()
) -> None:
  """Raises OutputPathError if the folder `real` holds saved work (saved_work_inside).

  `what` says what the command puts there, for the message ("a dataset
  goes", "a job keeps its files"): in a folder of its own, since saved work
  inside another's output is refused by every command that writes there.
  """
  inside = saved_work_inside(real, own) if os.path.isdir(real) else []
  if inside:
    more = f" and {len(inside) - 1} more" if len(inside) > 1 else ""
    raise OutputPathError(
      f"{flag} '{given}' holds {inside[0]}{more}: {what} in a folder of its own;"
      f" give another {flag}"
    )

"""Outputs built beside their place and moved in when complete, and what killed writers left.

A converter's dataset and an export are written into `.NAME.tmp-HOST-PID`
beside NAME and renamed into place once complete (`work_directory`,
`move_into_place`). One that replaces an existing NAME renames that to
`.NAME.old-HOST-PID` first, then the new one into place, then deletes the
old. A writer killed meanwhile (SIGKILL, or SIGTERM's default action) leaves
its temporary directory behind, or, between the two renames, the old output
under its .old name and no NAME. The next writer of NAME runs
`clean_up_after_killed_writers`: the temporary directories of this host's
writers whose process is gone are removed, and such a writer's .old
directory is put back as NAME when NAME is missing (the new one never got
there), else removed. A live writer's directories (or another host's, on a
shared file system) stay.
"""

from __future__ import annotations

import os
import shutil
import socket


def _name(output: str, kind: str) -> str:
  """This process's `.NAME.{kind}-HOST-PID` beside `output`."""
  parent, base = os.path.split(os.path.abspath(output))
  return os.path.join(parent, f".{base}.{kind}-{socket.gethostname()}-{os.getpid()}")


def work_directory(output: str) -> str:
  """Where this process builds `output` (made anew: one a crashed process of the
  same pid left is removed)."""
  work = _name(output, "tmp")
  if os.path.exists(work):
    shutil.rmtree(work)
  os.makedirs(work)
  return work


def move_into_place(work: str, output: str) -> None:
  """Renames the complete `work` to `output`, replacing an existing `output` (via
  its .old name, removed last)."""
  if not os.path.exists(output):
    os.rename(work, output)
    return
  old = _name(output, "old")
  os.rename(output, old)
  os.rename(work, output)
  shutil.rmtree(old)


def _process_gone(pid: int) -> bool:
  """Whether no process `pid` exists on this host (one of another user's exists)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return True
  except PermissionError:
    return False
  return False


def clean_up_after_killed_writers(output: str) -> list[str]:
  """Removes what killed writers of `output` left (module doc); returns the paths
  removed or put back."""
  output = os.path.abspath(output)
  parent, base = os.path.split(output)
  host, done = socket.gethostname(), []
  for name in sorted(os.listdir(parent)) if os.path.isdir(parent) else []:
    for kind in ("tmp", "old"):
      prefix = f".{base}.{kind}-"
      writer_host, _, pid = name[len(prefix) :].rpartition("-")
      if not name.startswith(prefix) or writer_host != host or not pid.isdigit():
        continue
      path = os.path.join(parent, name)
      if int(pid) == os.getpid() or not _process_gone(int(pid)) or not os.path.isdir(path):
        continue
      if kind == "old" and not os.path.lexists(output):
        os.rename(path, output)
      else:
        shutil.rmtree(path, ignore_errors=True)
      done.append(path)
  return done

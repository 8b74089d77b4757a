"""A failed write named: what was written, where, and why.

A full disk surfaced as numpy's "160000 requested and 104416 written" (an
export), a bare "[Errno 28] No space left on device" (the workdir's lock,
metrics.jsonl, a predict command's scores), or ArrayRecord's RuntimeError:
none said what was being written. `write_errors_named` re-raises an
OSError of its block as one line naming the output and the cause, and
removes the partial files it is given, so that a failed write leaves
nothing of its own behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Iterator

# Free bytes below which a failed write names the file system as full: numpy's
# short-write error does not say why the write was short.
_NEARLY_FULL = 1 << 20


def _free_bytes(path: str) -> int | None:
  folder = os.path.dirname(os.path.abspath(path))
  while folder and not os.path.isdir(folder):
    folder = os.path.dirname(folder)
  try:
    return shutil.disk_usage(folder).free
  except OSError:
    return None


def write_error(error: BaseException, what: str, path: str) -> OSError:
  """An OSError naming `what` at `path` and the cause of `error` (module docstring)."""
  cause = getattr(error, "strerror", None) or str(error)
  free = _free_bytes(path)
  if not getattr(error, "strerror", None) and free is not None and free < _NEARLY_FULL:
    cause += f" (its file system has {free:,} bytes free)"
  return OSError(f"cannot write {what} '{path}': {cause}")


@contextlib.contextmanager
def write_errors_named(
  what: str, path: str, *partial: str, errors: tuple[type[BaseException], ...] = (OSError,)
) -> Iterator[None]:
  """Re-raises an OSError of the block (or one of `errors`: a writer's own, e.g.
  ArrayRecord's RuntimeError) as `write_error`'s, after removing the files or folders
  `partial` (what the block was writing, not yet in place)."""
  try:
    yield
  except errors as error:
    for leftover in partial:
      if os.path.isdir(leftover) and not os.path.islink(leftover):
        shutil.rmtree(leftover, ignore_errors=True)
      else:
        with contextlib.suppress(OSError):
          os.unlink(leftover)
    raise write_error(error, what, path) from error


@contextlib.contextmanager
def written_whole(what: str, path: str, suffix: str = "") -> Iterator[str]:
  """Yields a temporary path beside `path` for the block to write `what` to, then
  moves it into place: `path` is the whole file or as it was. A failed write is
  `write_error`'s, and the temporary file goes (`suffix`: one the writer appends
  itself, e.g. numpy's ".npy")."""
  tmp = f"{path}.tmp-{os.getpid()}{suffix}"
  with write_errors_named(what, path, tmp):
    yield tmp
    os.replace(tmp, path)

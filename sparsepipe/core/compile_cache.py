"""The persistent cache of compiled programs: JAX's (XLA) and numba's (COO passes).

A job, `evaluate` and `export` compile the same programs at every start (the
step, the table initialisation, the eval step); the data workers compile the
numba passes of COO preprocessing, each in its own process. Both compilers
can keep what they compiled on disk and load it at the next start instead:

    <root>/jax/     JAX's persistent compilation cache (every program, however
                    small or quick to compile: both thresholds are off)
    <root>/numba-v2/  numba's cache of the compiled passes (NUMBA_CACHE_DIR;
                    its saves take turns, see _save_under_a_lock)

`root` is the config's `compilation_cache_dir`: "auto" (the default) is
$XDG_CACHE_HOME/sparsepipe, else ~/.cache/sparsepipe; "" turns the cache
off. A JAX_COMPILATION_CACHE_DIR in the environment is JAX's own setting and
wins for JAX's part. Entries are keyed by the program, the compiler and its
versions and the devices, so any number of jobs, hosts and processes share
one directory; a wrong entry is never used, a missing or unreadable one is
compiled again (JAX warns and goes on). Only the user who owns the
directory should be able to write to it: loading an entry runs its code.

Numba keeps the setting in the environment (NUMBA_CACHE_DIR), so the data
worker processes started after `enable` inherit it; the passes register
with `njit` here so that the ones already imported in this process cache
too.
"""

from __future__ import annotations

import fcntl
import os
from typing import Any, Callable

from absl import logging

from sparsepipe.core.saved_work import OutputPathError
from sparsepipe.core.saved_work import refuse_inside_saved_work
from sparsepipe.core.saved_work import refuse_other_saved_work

AUTO = "auto"
JAX_DIR_ENV = "JAX_COMPILATION_CACHE_DIR"
NUMBA_DIR_ENV = "NUMBA_CACHE_DIR"

# numba's entries under the root: "numba" held entries that concurrent saves
# could have mismatched (_save_under_a_lock), never loaded again.
NUMBA_SUBDIR = "numba-v2"
_SAVE_LOCK = ".sparsepipe-save.lock"

_dispatchers: list[Any] = []


def default_root() -> str:
  """$XDG_CACHE_HOME/sparsepipe, else ~/.cache/sparsepipe."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "sparsepipe")


def cache_root(setting: str) -> str | None:
  """The cache's root directory for a `compilation_cache_dir` setting (None: off)."""
  setting = str(setting)
  if not setting:
    return None
  if setting == AUTO:
    return default_root()
  return os.path.abspath(os.path.expanduser(setting))


def njit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
  """numba.njit(**options) whose dispatcher caches on disk once `enable` ran
  (in this process, or in the parent that started this one)."""

  def wrap(fn: Callable[..., Any]) -> Any:
    import numba  # pylint: disable=g-import-not-at-top

    dispatcher = numba.njit(**options)(fn)
    _dispatchers.append(dispatcher)
    if numba.config.CACHE_DIR:
      _cache_on_disk(dispatcher)
    return dispatcher

  return wrap


def _cache_on_disk(dispatcher: Any) -> None:
  """Caches `dispatcher` in numba's cache directory; where numba finds no
  directory it can write, it compiles in memory as before."""
  try:
    dispatcher.enable_caching()
  except RuntimeError:  # "cannot cache function ...: no locator available"
    return
  _save_under_a_lock(dispatcher._cache._cache_file)  # pylint: disable=protected-access


def _save_under_a_lock(cache_file: Any) -> None:
  """Makes numba's cache saves of one directory take turns (an exclusive flock).

  numba names a new entry's file after the index it has read: two processes
  (data workers, jobs) saving different specializations of one function at
  once could both take the same number, and the index could then name that
  file for one specialization while it held the other's machine code. A
  later load ran code compiled for other types: garbage COO buffers and NaN
  losses (seen when processes with a cold cache compiled together). Taking
  turns, each save reads the index the previous one wrote. Where flock is
  not supported, saves go on unlocked.
  """
  save = cache_file.save
  lock_path = os.path.join(cache_file._cache_path, _SAVE_LOCK)  # pylint: disable=protected-access

  def save_in_turn(key: Any, data: Any) -> None:
    try:
      fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o600)
    except OSError:
      return save(key, data)
    try:
      try:
        fcntl.flock(fd, fcntl.LOCK_EX)
      except OSError:
        pass
      return save(key, data)
    finally:
      os.close(fd)  # releases the lock

  cache_file.save = save_in_turn


def _enable_jax(directory: str) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=g-import-not-at-top

  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
  if jax.config.jax_compilation_cache_dir != directory:
    jax.config.update("jax_compilation_cache_dir", directory)
    # JAX decides once per process, at its first compilation, whether to use
    # the cache: start over so that a process which compiled before uses it.
    compilation_cache.reset_cache()


def _enable_numba(directory: str) -> None:
  import numba  # pylint: disable=g-import-not-at-top

  os.environ[NUMBA_DIR_ENV] = directory  # the data workers started from now on
  if numba.config.CACHE_DIR != directory:
    numba.config.CACHE_DIR = directory
    for dispatcher in _dispatchers:
      _cache_on_disk(dispatcher)


def check_root(root: str, workdir: str | None = None) -> None:
  """Raises OutputPathError if the cache's root is, or lies inside, saved work
  (core.saved_work) or the job's `workdir` (a new one is not saved work yet):
  its jax/ and numba-v2/ folders there would make a dataset or an export one
  with foreign files, which --overwrite then refuses to replace, and a
  workdir's removal would take the cache."""
  flag = "config.compilation_cache_dir"
  given, real = os.path.abspath(root), os.path.realpath(root)
  refuse_inside_saved_work(given, real, "compiled programs", flag)
  refuse_other_saved_work(given, real, flag, "", "the compilation cache")
  job = os.path.realpath(workdir) if workdir else None
  if job and os.path.commonpath([job, real]) == job:
    raise OutputPathError(
      f"{flag} '{given}' is inside the job's workdir '{os.path.abspath(workdir)}': write the"
      " compiled programs outside any workdir, dataset or export"
    )


def enable(setting: str, *, refused: str = "raise", workdir: str | None = None) -> str | None:
  """Turns the caches on for this process and the processes it starts.

  Args:
    setting: the config's `compilation_cache_dir` ("auto", a path, or ""
      for off).
    refused: what a root that `check_root` refuses does: "raise", or "warn"
      (a warning, and the cache stays off: for the commands that read a
      saved job's setting, which they cannot change).
    workdir: the job's workdir, which the root must not lie inside either.

  Returns:
    The root directory, or None when off. Call before the first compilation
    of a job; later calls with the same setting do nothing.
  """
  root = cache_root(setting)
  if root is None:
    return None
  try:
    check_root(root, workdir)
  except OutputPathError as error:
    if refused == "raise":
      raise
    logging.warning("%s; compiling without the cache", error)
    return None
  _enable_jax(os.environ.get(JAX_DIR_ENV) or os.path.join(root, "jax"))
  _enable_numba(os.path.join(root, NUMBA_SUBDIR))
  return root

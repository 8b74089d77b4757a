"""One job per workdir: process 0 holds a lock on `<workdir>/job.lock`.

Two jobs in one workdir (a relaunch while the first still runs, a wrapper
killed without its job) write the same checkpoints, FDO statistics and
metrics.jsonl: the second resumes from the first's checkpoints, and each
one's Orbax manager deletes the other's saves in progress. So a job takes
an exclusive lock before it touches its workdir, and a second job stops
with an error naming the first (pid, host, start time). The lock is the
kernel's (flock): it goes with the process that holds it, also when that
one is killed, so no stale lock is left behind. The holder removes the file
when it lets go (a job that failed to start leaves no file, and no workdir
it made: WorkdirLease); a job that takes the lock checks that the file it
locked is still the one at the path, so one removed meanwhile is not held
twice. Where the file system has no locks (some network or FUSE mounts)
the job warns and runs unguarded. Readers (launch.evaluate) take no lock.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import socket
from typing import IO, Iterator, Sequence

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from sparsepipe.core.write_errors import write_error
from sparsepipe.launch.distributed import coordination_client
from sparsepipe.launch.workdir.owner import utc_now

LOCK_FILENAME = "job.lock"
# + the call's number in this process: why process 0 could not take the workdir.
_PROBLEM_KEY = "sparsepipe/workdir_lock/"
_CALLS = itertools.count()


class WorkdirInUseError(OSError):
  """Another job holds the workdir's lock."""


def _owner() -> str:
  return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": utc_now()})


def _in_use(workdir: str, owner_text: str) -> str:
  try:
    owner = json.loads(owner_text)
    who = f"pid {owner['pid']} on {owner['host']}, started {owner['started']}"
  except (ValueError, KeyError, TypeError):
    who = "its pid not written yet"
  return (
    f"workdir {workdir} is in use by another job ({who}); two jobs in one workdir"
    " overwrite each other's checkpoints and metrics: stop that job first, or give"
    " this one another workdir"
  )


def _acquire(workdir: str) -> tuple[IO[str] | None, str]:
  """(the open, locked lock file, "") or (None, why the workdir is taken)."""
  path = os.path.join(workdir, LOCK_FILENAME)
  try:
    import fcntl  # pylint: disable=g-import-not-at-top
  except ImportError:  # not POSIX
    logging.warning("cannot lock %s here: a second job in it would not be detected", path)
    return None, ""
  for _ in range(100):
    handle = open(path, "a+", encoding="utf-8")  # not truncated before it is ours
    try:
      fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      handle.seek(0)
      owner = handle.read()
      handle.close()
      return None, _in_use(workdir, owner)
    except OSError as e:  # a file system without locks
      handle.close()
      logging.warning("cannot lock %s (%s): a second job in it would not be detected", path, e)
      return None, ""
    if _still_there(handle, path):
      break
    handle.close()  # its holder removed it as we opened it: lock the new one
  try:
    handle.truncate(0)
    handle.write(_owner())
    handle.flush()
  except OSError as error:  # a full disk: the file this launch may have made goes
    with contextlib.suppress(OSError):
      os.unlink(path)
    with contextlib.suppress(OSError):  # closing flushes the buffered text again
      handle.close()
    raise write_error(error, "the workdir's lock file", path) from error
  return handle, ""


def _still_there(handle: IO[str], path: str) -> bool:
  """Whether `path` still names the file `handle` has open (not removed by its holder)."""
  try:
    return os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
  except FileNotFoundError:
    return False


class WorkdirLease:
  """What `exclusive_workdir` yields: call `keep()` once the job has started.

  If the block ends before `keep()` (a launch that fails while starting: a
  config value found wrong late, eval data that does not match, a stop
  signal), what the launch made goes: a workdir it made, with all it holds,
  and the folders above it that it made; in a workdir that existed, the
  entries named in `discard` (e.g. the generated data) that were not there
  before. So a failed start leaves no half-made workdir whose data a rerun
  of another config would trip over, and nothing that was there is touched.
  """

  def __init__(self, workdir: str, discard: Sequence[str] = ()):
    top = workdir
    while not os.path.exists(os.path.dirname(top)) and os.path.dirname(top) != top:
      top = os.path.dirname(top)
    self.workdir = workdir
    self.made_from = None if os.path.exists(workdir) else top  # the highest folder made
    self.new = [n for n in discard if not os.path.lexists(os.path.join(workdir, n))]
    self.kept = False

  @property
  def made(self) -> bool:
    """Whether the launch made the workdir."""
    return self.made_from is not None

  def keep(self) -> None:
    self.kept = True

  def _discard(self) -> None:
    names = os.listdir(self.workdir) if self.made else self.new
    for name in names:
      path = os.path.join(self.workdir, name)
      if name == LOCK_FILENAME or not os.path.lexists(path):
        continue
      if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
      else:
        with contextlib.suppress(OSError):
          os.unlink(path)

  def release(self, handle: IO[str] | None) -> None:
    """Discards what a launch that did not keep the workdir made (still holding the
    lock), removes the lock file, lets go, and removes the folders it made left empty."""
    if not self.kept:
      self._discard()
    if handle is not None:
      with contextlib.suppress(OSError):
        os.unlink(os.path.join(self.workdir, LOCK_FILENAME))
      handle.close()
    self.remove_made_folders()

  def remove_made_folders(self) -> None:
    """The workdir and the folders above it that were made for it, while empty."""
    folder = self.workdir
    while self.made_from is not None:
      try:
        os.rmdir(folder)
      except OSError:
        return
      if folder == self.made_from:
        return
      folder = os.path.dirname(folder)


def _process_0s_problem(mine: str) -> str:
  """Every process's copy of process 0's `mine`: why it could not take the
  workdir ("" if it did), through the coordination service. The others said only
  "process 0 could not take it (see its error)", and that error went unsaid when
  process 0 then followed their end (peer_ends)."""
  key = f"{_PROBLEM_KEY}{next(_CALLS)}"
  if jax.process_index() == 0:
    coordination_client().key_value_set(key, mine)
    failed = multihost_utils.broadcast_one_to_all(np.int32(bool(mine)))
    return mine if int(failed) else ""
  failed = multihost_utils.broadcast_one_to_all(np.int32(0))
  if not int(failed):
    return ""
  return coordination_client().blocking_key_value_get(key, 60_000)


@contextlib.contextmanager
def exclusive_workdir(workdir: str, discard: Sequence[str] = ()) -> Iterator[WorkdirLease]:
  """Holds `workdir` for this job (made if missing) while the block runs.

  Call on every process: process 0 takes the lock, and every process raises
  WorkdirInUseError when another job holds it (or process 0's error when it
  could not open the lock file, e.g. in an unwritable workdir). Process 0
  discards what the launch made unless the block kept it (WorkdirLease;
  `discard`: the entries a start writes into an existing workdir).
  """
  lease = WorkdirLease(workdir, discard)
  os.makedirs(workdir, exist_ok=True)
  handle, problem, error = None, "", None
  if jax.process_index() == 0:
    try:
      handle, problem = _acquire(workdir)
    except OSError as e:  # raised below, once the other processes know
      error = e
  if jax.process_count() > 1:
    problem = _process_0s_problem(problem or (error and str(error)) or "")
  try:
    if error is not None:
      raise error
    if problem:
      raise WorkdirInUseError(problem)
    yield lease
  finally:
    if jax.process_index() == 0 and not (problem or error):
      lease.release(handle)
    elif error is not None:  # no lock was taken: only the empty folders this launch made go
      lease.remove_made_folders()

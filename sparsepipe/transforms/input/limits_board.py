"""The COO limits of each batch, switched at FDO retune points without a new pipeline.

An FDO retune after batch R (R batches trained) changes the limits of the
batches after it: batch index k (0-based) is preprocessed with the limits of
the last retune point R <= k, or with the pipeline's first limits when there
is none since the pipeline's position at its start. The retune points are
absolute batch numbers known ahead (`last_retune`), so a worker computing
batch k knows which retune it needs; the limits themselves are known only
when the main process has merged the statistics of batches <= R and
`publish`es them. Until then the worker waits (it is ahead of training by
the read-ahead only), then goes on with the new limits: the workers and
read-ahead threads keep running over a retune.

The limits travel as JSON files (stack -> limit name -> value, no pickle) in
a private temporary directory of this pipeline run: worker processes read
them there; the main process reads its own copy. `close` ends every wait
(the batches made then are discarded with the pipeline) and removes the
directory. A run killed before that (SIGKILL) leaves it behind, so the
process that opens a board holds an flock on the directory's `owner.lock`
for as long as it runs (the kernel drops it when the process dies, in any
pid namespace), and opening a board removes the directories whose lock it
can take (`remove_abandoned_boards`).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
from typing import Any, Callable

import grain

from sparsepipe.transforms.errors import LimitExceededError
from sparsepipe.transforms.fdo.limits import apply_stack_limits
from sparsepipe.transforms.fdo.limits import get_stack_limits
from sparsepipe.transforms.input.coo_transform import PreprocessSparse

POLL_SECONDS = 0.002
_CLOSED = "closed"
_OWNER = "owner.lock"
_PREFIX = "sparsepipe_limits_"


def _hold_owner_lock(directory: str) -> int:
  """Locks a new file of `directory` and only then names it owner.lock, so no other
  process can lock it first; the lock lasts while the returned descriptor is open."""
  fd, path = tempfile.mkstemp(dir=directory, prefix=".owner")
  fcntl.flock(fd, fcntl.LOCK_EX)
  os.rename(path, os.path.join(directory, _OWNER))
  return fd


def remove_abandoned_boards(parent: str | None = None) -> list[str]:
  """Removes the board directories in `parent` (the temporary directory) whose
  owner lock no process holds: those of runs that died without closing them.
  Directories without an owner.lock (older versions, a board being made) stay.
  Returns the directories removed."""
  parent = tempfile.gettempdir() if parent is None else parent
  removed = []
  for name in sorted(os.listdir(parent)):
    if not name.startswith(_PREFIX):
      continue
    directory = os.path.join(parent, name)
    try:
      fd = os.open(os.path.join(directory, _OWNER), os.O_RDONLY)
    except OSError:  # no lock file, or removed meanwhile
      continue
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its run is alive
      os.close(fd)
      continue
    shutil.rmtree(directory, ignore_errors=True)
    os.close(fd)
    removed.append(directory)
  return removed


class LimitsBoard:
  """Which limits each batch index is preprocessed with (see the module docstring).

  Args:
    last_retune: batch index k -> the last retune point <= k (an absolute
      batch number), or None; None for the whole board: the limits never
      change.
  """

  def __init__(self, last_retune: Callable[[int], int | None] | None):
    self._last_retune = last_retune
    self._published: dict[int, dict[str, Any]] = {}
    self._from = 0
    self.directory: str | None = None
    self._owner_fd: int | None = None

  def __getstate__(self) -> dict[str, Any]:
    state = dict(self.__dict__)
    state["_owner_fd"] = None  # the lock is the opening process's (workers get copies)
    return state

  def rebase(self, from_batch: int) -> None:
    """The pipeline's first limits apply from batch index `from_batch` (a restored
    position) up to the next retune point; what was published before is dropped."""
    self._from = int(from_batch)
    self._published.clear()

  def open(self) -> None:
    """A new run of the pipeline's workers and threads (they read this directory)."""
    self.close()
    remove_abandoned_boards()
    self.directory = tempfile.mkdtemp(prefix=_PREFIX)
    self._owner_fd = _hold_owner_lock(self.directory)
    for after_batch, limits in self._published.items():
      self._write(after_batch, limits)

  def close(self) -> None:
    """Ends the waits of this run's workers and threads and removes its directory."""
    directory, self.directory = self.directory, None
    if directory is not None:
      # os.open: this may run in an iterator's __del__ at exit, without builtins.
      os.close(os.open(os.path.join(directory, _CLOSED), os.O_CREAT | os.O_WRONLY, 0o600))
      shutil.rmtree(directory, ignore_errors=True)
    owner, self._owner_fd = self._owner_fd, None
    if owner is not None:
      os.close(owner)

  def _write(self, after_batch: int, limits: dict[str, Any]) -> None:
    path = os.path.join(self.directory, f"{after_batch}.json")
    with open(path + ".tmp", "w") as f:
      json.dump(limits, f)
    os.replace(path + ".tmp", path)

  def publish(self, after_batch: int, feature_specs: Any) -> None:
    """The limits of `feature_specs` apply from batch index `after_batch` on."""
    if self._last_retune is None or self._last_retune(int(after_batch)) != after_batch:
      raise ValueError(
        f"limits published for after batch {after_batch}, which is not a retune point of this"
        " input (make_host_input's last_retune)"
      )
    limits = get_stack_limits(feature_specs)
    self._published[int(after_batch)] = limits
    if self.directory is not None:
      self._write(int(after_batch), limits)

  def retune_of(self, index: int) -> int | None:
    """The retune point whose limits batch index `index` takes (None: the first limits)."""
    if self._last_retune is None:
      return None
    point = self._last_retune(int(index))
    return point if point is not None and point >= self._from else None

  def published(self, index: int) -> bool:
    """Whether the limits of batch index `index` are known (no wait for them)."""
    point = self.retune_of(index)
    return point is None or point in self._published

  def limits_of(self, index: int) -> dict[str, Any] | None:
    """The limits of batch index `index`, waiting for their publication (None: the
    first limits, also when the run closed while waiting)."""
    point = self.retune_of(index)
    if point is None:
      return None
    if point in self._published:
      return self._published[point]
    directory = self.directory
    path = os.path.join(directory or "", f"{point}.json")
    while directory is not None:
      if os.path.exists(path):
        with open(path) as f:
          return json.load(f)
      if not os.path.isdir(directory) or os.path.exists(os.path.join(directory, _CLOSED)):
        return None
      time.sleep(POLL_SECONDS)
    return None


class PreprocessByLimits(grain.transforms.MapWithIndex):
  """PreprocessSparse with the limits of each batch's index (a LimitsBoard).

  Args:
    preprocess: the PreprocessSparse of the pipeline's first limits.
    board: the LimitsBoard of the pipeline.
  """

  def __init__(self, preprocess: PreprocessSparse, board: LimitsBoard):
    self._first = preprocess
    self._board = board
    self._made: dict[str, PreprocessSparse] = {}

  def _for_limits(self, limits: dict[str, Any]) -> PreprocessSparse:
    key = json.dumps(limits, sort_keys=True)
    made = self._made.get(key)
    if made is None:
      first = self._first
      made = PreprocessSparse(
        apply_stack_limits(first.feature_specs, limits),
        local_device_count=first.local_device_count,
        global_device_count=first.global_device_count,
        num_sc_per_device=first.num_sc_per_device,
        sharding_strategy=first.sharding_strategy,
        allow_id_dropping=first.allow_id_dropping,
      )
      self._made[key] = made
    return made

  def map_with_index(self, index: int, element: Any) -> Any:
    limits = self._board.limits_of(index)
    preprocess = self._first if limits is None else self._for_limits(limits)
    try:
      return preprocess.map(element)
    except LimitExceededError as e:  # batches are numbered from 1 in every message
      raise LimitExceededError(f"batch {index + 1}: {e}") from None

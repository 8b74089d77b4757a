"""FDO client on a shared directory of .npz files, interchangeable with
jax-tpu-embedding's NPZFileFDOClient (same file names and keys).

`publish` writes `fdo_stats_{process_index}_{time_ns}.npz` with keys
`{stack}_max_ids`, `{stack}_max_unique_ids`, `{stack}_required_buffer_size`
and `{stack}_id_drop_counters`, each holding what was recorded as the
reference holds it: one record as given, several as one row each
(history.py). `load` reads the newest file of every process; as in the
reference, a single file comes back as written (a history stays a
history), several are merged element-wise with max over all their rows.

Writes are atomic: the data goes to a hidden temporary file in the same
directory, is fsync'ed, and is renamed into place with os.replace, so a
reader never sees a partial file (the temporary name does not match the
loader's pattern). Files are read with allow_pickle=False.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from typing import Any, Mapping

import numpy as np

from sparsepipe.core import coo_types
from sparsepipe.transforms import errors
from sparsepipe.transforms.fdo import client as fdo_client
from sparsepipe.transforms.fdo import history

FILE_PATTERN = re.compile(r"^fdo_stats_(\d+)_(\d+)\.npz$")


class NoFDOStatsError(errors.FDOStatsError, FileNotFoundError):
  """No statistics file in the directory (also a FileNotFoundError, like the
  reference's)."""


def stats_file_name(process_index: int, time_ns: int) -> str:
  return f"fdo_stats_{int(process_index)}_{int(time_ns)}.npz"


def latest_files(base_dir: str) -> list[str]:
  """Newest stats file of every process in base_dir, by process index."""
  newest: dict[int, tuple[int, str]] = {}
  for name in os.listdir(base_dir):
    match = FILE_PATTERN.match(name)
    if not match:
      continue
    process, stamp = int(match.group(1)), int(match.group(2))
    if process not in newest or stamp > newest[process][0]:
      newest[process] = (stamp, name)
  return [os.path.join(base_dir, newest[p][1]) for p in sorted(newest)]


def read_stats_file(path: str) -> dict[str, np.ndarray]:
  """All arrays of one stats file (no pickle)."""
  try:
    with np.load(path, allow_pickle=False) as data:
      return {key: data[key] for key in data.files}
  except (OSError, ValueError) as e:
    raise errors.FDOStatsError(f"cannot read FDO stats file {path}: {e}") from None


def write_stats_file(path: str, arrays: Mapping[str, np.ndarray]) -> None:
  """Atomically writes arrays as an npz file at `path`."""
  directory = os.path.dirname(path) or "."
  fd, tmp = tempfile.mkstemp(prefix=".tmp_", suffix=".partial", dir=directory)
  try:
    with os.fdopen(fd, "wb") as f:
      np.savez(f, **arrays)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


class NPZFileFDOClient(fdo_client.FDOClient):
  """FDO client writing one .npz file per publish into a shared directory.

  Usage:
    client = NPZFileFDOClient("/shared/fdo")
    _, stats = preprocess_sparse_dense_matmul_input(...)
    client.record(stats)
    client.publish()            # every process
    merged = client.load()      # after a barrier
    specs = update_preprocessing_parameters(specs, merged, num_sc_per_device)

  Every `record` adds a row (the reference's history), so memory and files
  grow with the number of records.
  """

  def __init__(self, base_dir: str, process_index: int | None = None):
    """Creates the client.

    Args:
      base_dir: shared directory (created if missing).
      process_index: this process' index; default jax.process_index().
    """
    self._base_dir = os.fspath(base_dir)
    if process_index is None:
      import jax  # pylint: disable=g-import-not-at-top

      process_index = jax.process_index()
    self._process_index = int(process_index)
    self._local = history.StatsHistory()
    self._last_stamp = 0

  @property
  def base_dir(self) -> str:
    return self._base_dir

  def record(self, stats: coo_types.SparseDenseMatmulInputStats) -> None:
    """Adds one batch's statistics as a row of the history."""
    self._local.add(stats)

  def _next_stamp(self) -> int:
    # Strictly increasing even if the clock is coarse, so a later publish
    # always wins over an earlier one of the same process.
    self._last_stamp = max(time.time_ns(), self._last_stamp + 1)
    return self._last_stamp

  def publish(self) -> str:
    """Writes the recorded history; returns the file path."""
    os.makedirs(self._base_dir, exist_ok=True)
    path = os.path.join(self._base_dir, stats_file_name(self._process_index, self._next_stamp()))
    write_stats_file(path, self._local.flat())
    return path

  def load(self) -> coo_types.SparseDenseMatmulInputStats:
    """Newest file of every process: one as written, several merged with max.

    With one process the result is its history (one row per record when it
    recorded several times); with several, the element-wise max over all
    rows of all files (1-D), as the reference returns them.

    Raises:
      NoFDOStatsError: no stats file in base_dir.
      FDOStatsError: a file cannot be read, has unknown keys or shapes that
        do not match the other files.
    """
    files = latest_files(self._base_dir) if os.path.isdir(self._base_dir) else []
    if not files:
      raise NoFDOStatsError(f"no FDO stats files (fdo_stats_*_*.npz) in {self._base_dir}")
    if len(files) == 1:
      written = history.StatsHistory()
      written.add_flat(read_stats_file(files[0]), files[0])
      return written.stats()
    merged = fdo_client.StatsAccumulator()
    for path in files:
      merged.add_flat(read_stats_file(path), path)
    return merged.stats()

  def get_state(self) -> dict[str, Any]:
    return self._local.get_state()

  def set_state(self, state: Mapping[str, Any]) -> None:
    self._local.set_state(state)

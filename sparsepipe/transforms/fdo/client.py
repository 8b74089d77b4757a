"""FDO (feedback-directed optimisation) of the preprocessing limits.

Statistics of every preprocessed batch (SparseDenseMatmulInputStats) are
recorded by a per-process client, published to shared storage, and loaded
back merged over all processes; `update_preprocessing_parameters` turns the
merged statistics into new limits. Merging across processes (and batches,
in `merge_stats`) is an element-wise maximum, the only reduction the limits
need; what one client recorded is kept as the reference keeps it
(history.py).
"""

from __future__ import annotations

import abc
from typing import Any, Mapping

import numpy as np

from sparsepipe.core import coo_types
from sparsepipe.transforms import errors

# Stats field -> key suffix in stats files (jax-tpu-embedding's names).
FIELD_SUFFIXES = {
  "max_ids_per_partition": "_max_ids",
  "max_unique_ids_per_partition": "_max_unique_ids",
  "required_buffer_size_per_sc": "_required_buffer_size",
  "id_drop_counters": "_id_drop_counters",
}


def split_key(key: str, source: str) -> tuple[str, str]:
  """(field, stack) of a `{stack}{suffix}` key of a stats file."""
  for field, suffix in FIELD_SUFFIXES.items():
    if key.endswith(suffix) and len(key) > len(suffix):
      return field, key[: -len(suffix)]
  raise errors.FDOStatsError(
    f"{source}: unexpected key '{key}', expected names ending with"
    f" {sorted(FIELD_SUFFIXES.values())}"
  )


def _reduce(field: str, value: Any) -> np.ndarray:
  """One record (1-D, or a stacked [n, ...] history) -> its element-wise max."""
  array = np.asarray(value)
  if field == "id_drop_counters":
    return np.asarray(int(array.max()) if array.size else 0, np.int64)
  if array.ndim == 2:
    array = array.max(axis=0)
  if array.ndim != 1:
    raise errors.FDOStatsError(
      f"{field}: expected a 1-D array (or a 2-D history), got shape {array.shape}"
    )
  return array.astype(np.int32)


def _merge_field(
  field: str, into: dict[str, np.ndarray], stack: str, value: Any, source: str
) -> None:
  value = _reduce(field, value)
  old = into.get(stack)
  if old is None:
    into[stack] = value
    return
  if old.shape != value.shape:
    raise errors.FDOStatsError(
      f"{source}: {field} of stack '{stack}' has shape {value.shape}, but"
      f" earlier statistics have {old.shape}"
    )
  into[stack] = np.maximum(old, value)


class StatsAccumulator:
  """Element-wise maximum of statistics, per field and stack."""

  def __init__(self):
    self._fields: dict[str, dict[str, np.ndarray]] = {f: {} for f in FIELD_SUFFIXES}

  def add(self, stats: coo_types.SparseDenseMatmulInputStats, source: str = "stats") -> None:
    for field in FIELD_SUFFIXES:
      for stack, value in getattr(stats, field).items():
        _merge_field(field, self._fields[field], stack, value, source)

  def add_flat(self, arrays: Mapping[str, Any], source: str) -> None:
    """Adds `{stack}{suffix}` arrays, as stored in stats files."""
    for key, value in arrays.items():
      field, stack = split_key(key, source)
      _merge_field(field, self._fields[field], stack, value, source)

  def stats(self) -> coo_types.SparseDenseMatmulInputStats:
    f = self._fields
    return coo_types.SparseDenseMatmulInputStats(
      max_ids_per_partition=dict(f["max_ids_per_partition"]),
      max_unique_ids_per_partition=dict(f["max_unique_ids_per_partition"]),
      required_buffer_size_per_sc=dict(f["required_buffer_size_per_sc"]),
      id_drop_counters={k: int(v) for k, v in f["id_drop_counters"].items()},
    )


def merge_stats(
  *stats: coo_types.SparseDenseMatmulInputStats,
) -> coo_types.SparseDenseMatmulInputStats:
  """Element-wise maximum of several statistics (batches, hosts): merge_stats(a, b, ...)."""
  acc = StatsAccumulator()
  for i, s in enumerate(stats):
    if not all(hasattr(s, field) for field in FIELD_SUFFIXES):  # also the reference's type
      raise TypeError(
        f"merge_stats argument {i} is a {type(s).__name__}, not SparseDenseMatmulInputStats"
        " (give them as separate arguments: merge_stats(*stats_list))"
      )
    acc.add(s)
  return acc.stats()


class FDOClient(abc.ABC):
  """Per-process client: record batches' stats, publish, load merged stats.

  Typical use: `record` every batch's statistics; every few steps every
  process calls `publish`, a barrier waits for all, then each calls `load`
  and derives new limits with `update_preprocessing_parameters`.
  """

  @abc.abstractmethod
  def record(self, stats: coo_types.SparseDenseMatmulInputStats) -> None:
    """Adds one batch's statistics to the process-local state."""

  @abc.abstractmethod
  def publish(self) -> None:
    """Writes the process-local state to the shared storage."""

  @abc.abstractmethod
  def load(self) -> coo_types.SparseDenseMatmulInputStats:
    """Returns all processes' published statistics (merged with max across processes)."""

  @abc.abstractmethod
  def get_state(self) -> dict[str, Any]:
    """The process-local state as a JSON-able dict (for checkpoints)."""

  @abc.abstractmethod
  def set_state(self, state: Mapping[str, Any]) -> None:
    """Restores a state returned by get_state."""

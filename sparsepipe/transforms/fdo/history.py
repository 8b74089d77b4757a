"""The statistics a client recorded, one row per record, as the reference keeps them.

jax-tpu-embedding's NPZFileFDOClient does not reduce what it records: the
first record of a stack is kept as given, and every later one is stacked
under it (`np.vstack`), so two records of [10, 20] publish and load back
as [[10, 20], [10, 20]]. `StatsHistory` keeps records the same way, so the
files and the loaded statistics match the reference's; whoever needs one
number takes the max (update_preprocessing_parameters does).

A history grows by one row per record: record each batch only where the
history is wanted (the launcher keeps running maxima itself and records
them once per retune).

Values are stored as int32 counts (int64 drop counters); the JSON state is
the published value of every stack, so a restored client publishes the
same file and keeps stacking records under it.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from sparsepipe.core import coo_types
from sparsepipe.transforms import errors
from sparsepipe.transforms.fdo import client as fdo_client

STATE_VERSION = 1
_DROPS = "id_drop_counters"


def _width(field: str, stack: str, value: Any, source: str) -> tuple[np.ndarray, int]:
  """(value as stored, its row width): counts 1-D/2-D, drop counters of width 1."""
  if field == _DROPS:
    array = np.asarray(value, np.int64)
    ok = array.ndim <= 2 and np.atleast_2d(array).shape[1] == 1
    expected = "an int (or a column of them)"
  else:
    array = np.asarray(value).astype(np.int32)
    ok = array.ndim in (1, 2)
    expected = "a 1-D array (or a 2-D history)"
  if not ok:
    raise errors.FDOStatsError(
      f"{source}: {field} of stack '{stack}': expected {expected}, got shape {array.shape}"
    )
  return array, np.atleast_2d(array).shape[1]


class StatsHistory:
  """Recorded statistics per field and stack, each record a row."""

  def __init__(self):
    self._records: dict[str, dict[str, list[np.ndarray]]] = {
      f: {} for f in fdo_client.FIELD_SUFFIXES
    }

  def add(self, stats: coo_types.SparseDenseMatmulInputStats, source: str = "stats") -> None:
    """Stacks one record (every field and stack of `stats`) under the earlier ones."""
    for field in fdo_client.FIELD_SUFFIXES:
      for stack, value in getattr(stats, field).items():
        self._add(field, stack, value, source)

  def add_flat(self, arrays: Mapping[str, Any], source: str) -> None:
    """Adds `{stack}{suffix}` arrays, as stored in stats files."""
    for key, value in arrays.items():
      field, stack = fdo_client.split_key(key, source)
      self._add(field, stack, value, source)

  def _add(self, field: str, stack: str, value: Any, source: str) -> None:
    array, width = _width(field, stack, value, source)
    records = self._records[field].setdefault(stack, [])
    if records:
      first = records[0]
      if np.atleast_2d(first).shape[1] != width:
        raise errors.FDOStatsError(
          f"{source}: {field} of stack '{stack}' has shape {array.shape}, but"
          f" earlier statistics have {first.shape}"
        )
    records.append(array)

  def _value(self, records: list[np.ndarray]) -> np.ndarray:
    """One record as given; several as the rows of one array."""
    return records[0] if len(records) == 1 else np.vstack(records)

  def flat(self) -> dict[str, np.ndarray]:
    """`{stack}{suffix}` -> array, the stats file layout."""
    return {
      f"{stack}{fdo_client.FIELD_SUFFIXES[field]}": self._value(records)
      for field, per_stack in self._records.items()
      for stack, records in per_stack.items()
    }

  def stats(self) -> coo_types.SparseDenseMatmulInputStats:
    """The history as statistics; a single drop count is an int."""
    values = {
      field: {stack: self._value(records) for stack, records in per_stack.items()}
      for field, per_stack in self._records.items()
    }
    drops = values.pop(_DROPS)
    return coo_types.SparseDenseMatmulInputStats(
      **values,
      id_drop_counters={k: int(v) if v.ndim == 0 else v for k, v in drops.items()},
    )

  def get_state(self) -> dict[str, Any]:
    """JSON-able state: {"version", "stats": {field: {stack: published value}}}."""
    return {
      "version": STATE_VERSION,
      "stats": {
        field: {stack: self._value(records).tolist() for stack, records in per_stack.items()}
        for field, per_stack in self._records.items()
      },
    }

  def set_state(self, state: Mapping[str, Any]) -> None:
    """Restores `get_state`'s dict: each stack's value becomes its one record."""
    version = state.get("version") if isinstance(state, Mapping) else None
    if version != STATE_VERSION:
      raise errors.FDOStatsError(f"FDO state version {version!r} is not {STATE_VERSION}")
    restored = StatsHistory()
    for field, per_stack in state.get("stats", {}).items():
      if field not in fdo_client.FIELD_SUFFIXES:
        raise errors.FDOStatsError(f"FDO state: unknown field '{field}'")
      for stack, value in per_stack.items():
        restored._add(field, stack, value, "FDO state")
    self._records = restored._records

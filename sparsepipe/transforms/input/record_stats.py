"""Grain dataset stage (main process): record each batch's COO statistics.

Grain workers run on pickled copies of the transforms, so statistics cannot
be accumulated there: they travel inside each PreprocessedBatch and this
stage, placed after `mp_prefetch`, hands them to an FDO client and keeps
running totals in its iterator state (checkpointed with the data position).
Its time goes to Grain's per-iterator statistics like a built-in stage's.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import grain
from grain._src.python.dataset import stats as grain_stats
import numpy as np

from sparsepipe.core.coo_types import SparseDenseMatmulInputStats
from sparsepipe.transforms.input.preprocess import PreprocessedBatch

_MAX_FIELDS = (
  "max_ids_per_partition",
  "max_unique_ids_per_partition",
  "required_buffer_size_per_sc",
)


class StatsTotals:
  """Running totals: element-wise max of the per-batch statistics, summed drops.

  Attributes:
    batches: batches seen.
    corrupt_records: corrupt records skipped.
    maxima: {field: {stack: int64 array}} for the three max statistics.
    id_drops: {stack: total dropped ids}.
  """

  def __init__(self):
    self.batches = 0
    self.corrupt_records = 0
    self.maxima: dict[str, dict[str, np.ndarray]] = {f: {} for f in _MAX_FIELDS}
    self.id_drops: dict[str, int] = {}

  def add(self, stats: SparseDenseMatmulInputStats, corrupt_records: int = 0) -> None:
    for field in _MAX_FIELDS:
      totals = self.maxima[field]
      for stack, value in getattr(stats, field).items():
        value = np.asarray(value, np.int64)
        old = totals.get(stack)
        if old is None:
          totals[stack] = value.copy()
        elif old.shape != value.shape:
          raise ValueError(
            f"stack '{stack}': {field} has shape {value.shape} but the running"
            f" total has shape {old.shape} (mesh or stacking changed)"
          )
        else:
          np.maximum(old, value, out=old)
    for stack, drops in stats.id_drop_counters.items():
      self.id_drops[stack] = self.id_drops.get(stack, 0) + int(drops)
    self.batches += 1
    self.corrupt_records += int(corrupt_records)

  def as_stats(self) -> SparseDenseMatmulInputStats:
    """The totals as one statistics record (int32 arrays, int drop counts)."""
    return SparseDenseMatmulInputStats(
      *({k: v.astype(np.int32) for k, v in self.maxima[f].items()} for f in _MAX_FIELDS),
      id_drop_counters=dict(self.id_drops),
    )

  def to_state(self) -> dict[str, Any]:
    """JSON-able: Python ints and lists only."""
    state = {"batches": int(self.batches), "corrupt_records": int(self.corrupt_records)}
    for field in _MAX_FIELDS:
      state[field] = {k: [int(x) for x in v] for k, v in sorted(self.maxima[field].items())}
    state["id_drop_counters"] = {k: int(v) for k, v in sorted(self.id_drops.items())}
    return state

  def clear_maxima(self) -> None:
    """Forgets the maxima (their shapes follow the device layout); counters stay."""
    self.maxima = {f: {} for f in _MAX_FIELDS}

  @classmethod
  def from_state(cls, state: Mapping[str, Any]) -> StatsTotals:
    totals = cls()
    totals.batches = int(state["batches"])
    totals.corrupt_records = int(state["corrupt_records"])
    for field in _MAX_FIELDS:
      totals.maxima[field] = {k: np.asarray(v, np.int64) for k, v in state[field].items()}
    totals.id_drops = {k: int(v) for k, v in state["id_drop_counters"].items()}
    return totals


class RecordStatsIterDataset(grain.IterDataset):
  """Passes PreprocessedBatches through, recording their statistics.

  Args:
    parent: an IterDataset of PreprocessedBatch (typically after mp_prefetch).
    fdo_client: optional object with `record(stats)` (e.g. an FDOClient);
      called once per batch in the main process.
  """

  def __init__(self, parent: grain.IterDataset, fdo_client: Any = None):
    super().__init__(parent)
    self._fdo_client = fdo_client

  def __iter__(self) -> RecordStatsIterator:
    return RecordStatsIterator(self._parent.__iter__(), self._fdo_client)

  def __str__(self) -> str:
    return "RecordStatsIterDataset"


class RecordStatsIterator(grain.DatasetIterator):
  """State: {"parent": ..., "totals": StatsTotals.to_state()}."""

  def __init__(self, parent: grain.DatasetIterator, fdo_client: Any):
    super().__init__(parent)
    self._fdo_client = fdo_client
    self.totals = StatsTotals()

  @grain_stats.record_next_duration_if_output
  @grain_stats.trace_input_pipeline_next(stage_category=grain_stats.IPL_CAT_PREPROCESSING)
  def __next__(self) -> PreprocessedBatch:
    element = next(self._parent)
    with self._stats.record_self_time():
      self.totals.add(element.stats, element.num_corrupt_records)
      if self._fdo_client is not None:
        self._fdo_client.record(element.stats)
      return self._stats.record_output_spec(element)

  def get_state(self) -> dict[str, Any]:
    return {"parent": self._parent.get_state(), "totals": self.totals.to_state()}

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state["parent"])
    self.totals = StatsTotals.from_state(state["totals"])

  def __str__(self) -> str:
    return "RecordStatsIterator"


def map_stats_node(state: Any, fn: Callable[[Mapping[str, Any]], Mapping[str, Any]]) -> Any:
  """A copy of a (nested) iterator state whose statistics node is replaced by fn(node).

  The node is RecordStatsIterator's {"parent": ..., "totals": ...}; the
  stages around it (worker prefetch, device placement) may nest it. Exactly
  one such node must exist.
  """
  found = []

  def visit(node: Any) -> Any:
    if isinstance(node, Mapping):
      if "totals" in node and "parent" in node:
        found.append(node)
        return fn(node)
      return {key: visit(value) for key, value in node.items()}
    if isinstance(node, (list, tuple)):
      return type(node)(visit(value) for value in node)
    return node

  new = visit(state)
  if len(found) != 1:
    raise ValueError(f"expected one statistics stage in the iterator state, found {len(found)}")
  return new


def find_stats_node(state: Any) -> Mapping[str, Any]:
  """The statistics node {"parent": ..., "totals": ...} inside an iterator state."""
  found = []
  map_stats_node(state, lambda node: found.append(node) or node)
  return found[0]


def clear_stats_maxima(state: Any) -> Any:
  """A copy of an iterator state whose FDO totals have no maxima (counters kept)."""

  def clear(node: Mapping[str, Any]) -> dict[str, Any]:
    totals = StatsTotals.from_state(node["totals"])
    totals.clear_maxima()
    return {**node, "totals": totals.to_state()}

  return map_stats_node(state, clear)

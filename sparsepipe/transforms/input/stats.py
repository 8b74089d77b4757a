"""Running totals of the batches' COO statistics, kept in the input iterator's state.

Grain workers run on pickled copies of the transforms, so statistics cannot
be accumulated there: they travel inside each PreprocessedBatch, and the
input iterator (host_input.py) adds them up in the main process as it hands
the batches out. The totals are part of its JSON state, so a resumed job
has the same totals (and FDO derives the same limits) as an uninterrupted one.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from sparsepipe.core.coo_types import SparseDenseMatmulInputStats

_MAX_FIELDS = (
  "max_ids_per_partition",
  "max_unique_ids_per_partition",
  "required_buffer_size_per_sc",
)


# {field: {stack: length}}: the shapes of one host's statistics.
StatsSizes = Mapping[str, Mapping[str, int]]


def stats_sizes(stacks: list[str], local_devices: int, num_global_sc: int, num_sc: int):
  """The lengths of one host's statistics per stack: L*N per partition, L*S per SC."""
  per_partition = {s: local_devices * num_global_sc for s in stacks}
  return {
    "max_ids_per_partition": per_partition,
    "max_unique_ids_per_partition": dict(per_partition),
    "required_buffer_size_per_sc": {s: local_devices * num_sc for s in stacks},
  }


class StatsTotals:
  """Running totals: element-wise max of the per-batch statistics, summed drops.

  Attributes:
    batches: batches seen.
    corrupt_records: corrupt records skipped.
    maxima: {field: {stack: int64 array}} for the three max statistics;
      zeros of `sizes` before the first batch (or empty without sizes).
    id_drops: {stack: total dropped ids}.
  """

  def __init__(self, sizes: StatsSizes | None = None):
    self.sizes = sizes
    self.batches = 0
    self.corrupt_records = 0
    self.id_drops: dict[str, int] = {s: 0 for s in (sizes or {}).get(_MAX_FIELDS[0], {})}
    self.clear_maxima()

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
    sizes = self.sizes or {}
    self.maxima = {
      f: {s: np.zeros(n, np.int64) for s, n in sizes.get(f, {}).items()} for f in _MAX_FIELDS
    }

  @classmethod
  def from_state(cls, state: Mapping[str, Any], sizes: StatsSizes | None = None) -> StatsTotals:
    """Totals from `to_state()` output; `sizes` fills maxima the state lacks with zeros."""
    totals = cls(sizes)
    totals.batches = int(state["batches"])
    totals.corrupt_records = int(state["corrupt_records"])
    for field in _MAX_FIELDS:
      saved = {k: np.asarray(v, np.int64) for k, v in state[field].items()}
      totals.maxima[field] = {**totals.maxima[field], **saved}
    totals.id_drops.update({k: int(v) for k, v in state["id_drop_counters"].items()})
    return totals

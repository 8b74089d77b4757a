"""FDO in the loop: merge every process's statistics and derive new limits.

At a segment boundary (pipeline drained) every process writes its running
statistics (element-wise max over all batches it has preprocessed, kept in
the input iterator's state, so a resumed job writes the same numbers) as an
NPZ file, the record of what FDO saw, in the reference's format. The merge
itself is a collective (`multihost_utils.process_allgather`, then the
element-wise max), so no process waits on another's file. The limits follow
with `headroom`: a later batch may exceed what earlier batches showed, and
exceeding a limit is an error (or counted drops with allow_id_dropping).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from jax.experimental import multihost_utils

from sparsepipe import core
from sparsepipe import transforms


def merge_stats_across_processes(
  stats: core.SparseDenseMatmulInputStats,
) -> core.SparseDenseMatmulInputStats:
  """Element-wise max of every process's statistics (call on all processes)."""
  fields = [{k: np.asarray(v) for k, v in sorted(part.items())} for part in stats]
  gathered = multihost_utils.process_allgather(fields)
  return core.SparseDenseMatmulInputStats(
    *({k: np.max(v, axis=0) for k, v in part.items()} for part in gathered[:3]),
    id_drop_counters={k: int(np.max(v)) for k, v in gathered[3].items()},
  )


def scale_stats(
  stats: core.SparseDenseMatmulInputStats, headroom: float
) -> core.SparseDenseMatmulInputStats:
  """Statistics multiplied by `headroom` (>= 1), rounded up (buffer sizes to 8)."""
  if not headroom >= 1.0:
    raise ValueError(f"fdo.headroom={headroom} must be >= 1.0")

  def scale(values: Any, align: int) -> np.ndarray:
    values = np.asarray(values, np.int64)
    scaled = np.ceil(values * headroom).astype(np.int64)
    return ((scaled + align - 1) // align * align).astype(np.int32)

  return core.SparseDenseMatmulInputStats(
    max_ids_per_partition={k: scale(v, 1) for k, v in stats.max_ids_per_partition.items()},
    max_unique_ids_per_partition={
      k: scale(v, 1) for k, v in stats.max_unique_ids_per_partition.items()
    },
    required_buffer_size_per_sc={
      k: scale(v, 8) for k, v in stats.required_buffer_size_per_sc.items()
    },
    id_drop_counters=dict(stats.id_drop_counters),
  )


def retune_limits(
  feature_specs: Any,
  local_stats: core.SparseDenseMatmulInputStats,
  *,
  stats_dir: str,
  headroom: float,
  num_sc_per_device: int,
  global_device_count: int,
) -> tuple[Any, core.SparseDenseMatmulInputStats]:
  """Records `local_stats`, merges all processes', returns (new specs, merged).

  Call on every process at the same point. `stats_dir` (one per retune, e.g.
  per segment) receives this process's statistics file.
  """
  os.makedirs(stats_dir, exist_ok=True)
  client = transforms.NPZFileFDOClient(stats_dir)
  client.record(local_stats)
  client.publish()
  merged = merge_stats_across_processes(local_stats)
  specs = transforms.update_preprocessing_parameters(
    feature_specs,
    scale_stats(merged, headroom),
    num_sc_per_device,
    global_device_count,
  )
  # Headroom past what a batch can fill buys nothing.
  return transforms.bound_coo_buffers_by_the_batch(
    specs, num_sc_per_device, global_device_count
  ), merged


def describe_limits(before: Any, after: Any) -> str:
  """'stack: max_ids 256->40, ...' for the stacks whose limits changed."""
  old, new = transforms.get_stack_limits(before), transforms.get_stack_limits(after)
  parts = []
  for stack in sorted(new):
    short = {n: n.replace("_per_partition", "") for n in transforms.LIMIT_NAMES}
    short["suggested_coo_buffer_size_per_device"] = "buffer"
    changes = [
      f"{short[name]} {old[stack][name]}->{new[stack][name]}"
      for name in transforms.LIMIT_NAMES
      if old[stack][name] != new[stack][name]
    ]
    if changes:
      parts.append(f"{stack}: " + ", ".join(changes))
  return "; ".join(parts) if parts else "unchanged"

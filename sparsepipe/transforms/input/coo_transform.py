"""Grain transform: columnar examples -> COO buffers + statistics (host numpy)."""

from __future__ import annotations

from typing import Any, NamedTuple

import grain
import jax
import numpy as np

from sparsepipe.data.example import ExampleBatch
from sparsepipe.core.batch import TrainBatch
from sparsepipe.transforms.coo.preprocess import preprocess_sparse_dense_matmul_input
from sparsepipe.core.coo_types import SparseDenseMatmulInputStats
from sparsepipe.transforms.input.train_batches import ParsedBatch


class PreprocessedBatch(NamedTuple):
  """A host batch ready for the device, with what it cost.

  Attributes:
    batch: TrainBatch of numpy arrays: labels [B], dense [B, num_dense], COO
      buffers per stack flattened per local device.
    stats: the COO statistics of this batch (before any dropping).
    num_corrupt_records: corrupt records skipped while forming it.
  """

  batch: TrainBatch
  stats: SparseDenseMatmulInputStats
  num_corrupt_records: int = 0


class PreprocessSparse(grain.transforms.Map):
  """Runs `preprocess_sparse_dense_matmul_input` on a batch of examples.

  Holds the frozen feature specs (and so the limits); a change of limits
  (FDO) means a new transform and a rebuilt pipeline. Each feature spec
  reads the example feature of the same name. The batch split follows the
  COO format: local device d gets examples [d*B/L, (d+1)*B/L).

  Args:
    feature_specs: pytree of prepared FeatureSpecs (stacking done).
    local_device_count: L, devices of this host.
    global_device_count: G, devices of the mesh.
    num_sc_per_device: S.
    sharding_strategy: "MOD".
    allow_id_dropping: drop ids over the limits (counted) instead of raising.
  """

  def __init__(
    self,
    feature_specs: Any,
    *,
    local_device_count: int,
    global_device_count: int,
    num_sc_per_device: int,
    sharding_strategy: str = "MOD",
    allow_id_dropping: bool = False,
  ):
    self.feature_specs = feature_specs
    self.local_device_count = int(local_device_count)
    self.global_device_count = int(global_device_count)
    self.num_sc_per_device = int(num_sc_per_device)
    self.sharding_strategy = sharding_strategy
    self.allow_id_dropping = bool(allow_id_dropping)
    self._names = [s.name for s in jax.tree_util.tree_leaves(feature_specs)]

  def map(self, element: ParsedBatch | ExampleBatch) -> PreprocessedBatch:
    corrupt = 0
    if isinstance(element, ParsedBatch):
      corrupt = element.num_corrupt_records
      element = element.examples
    missing = [n for n in self._names if n not in element.sparse]
    if missing:
      raise KeyError(
        f"feature specs {missing} have no example feature of that name"
        f" (examples have {sorted(element.sparse)})"
      )
    features = jax.tree_util.tree_map(lambda s: element.sparse[s.name], self.feature_specs)
    processed, stats = preprocess_sparse_dense_matmul_input(
      features,
      None,
      self.feature_specs,
      self.local_device_count,
      self.global_device_count,
      num_sc_per_device=self.num_sc_per_device,
      sharding_strategy=self.sharding_strategy,
      has_leading_dimension=False,
      allow_id_dropping=self.allow_id_dropping,
    )
    batch = TrainBatch(
      labels=np.ascontiguousarray(element.labels, np.float32),
      dense=np.ascontiguousarray(element.dense, np.float32),
      sparse=processed.sparse_dense_matmul_input,
    )
    return PreprocessedBatch(batch, _plain_stats(stats), int(corrupt))


def _plain_stats(stats: SparseDenseMatmulInputStats) -> SparseDenseMatmulInputStats:
  """Plain dicts with int32 arrays and Python int drop counters."""
  return SparseDenseMatmulInputStats(
    max_ids_per_partition=dict(stats.max_ids_per_partition),
    max_unique_ids_per_partition=dict(stats.max_unique_ids_per_partition),
    required_buffer_size_per_sc=dict(stats.required_buffer_size_per_sc),
    id_drop_counters={k: int(v) for k, v in stats.id_drop_counters.items()},
  )

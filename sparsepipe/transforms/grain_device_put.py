"""Grain dataset stage (main process): host batches -> global jax.Arrays on the mesh.

Every leaf of the host TrainBatch has its leading dimension split over this
host's devices in mesh order (labels/dense by examples, COO buffers by
device), so `jax.make_array_from_process_local_data` with the data-axis
sharding assembles the global batch: local device d of the COO
preprocessing is the d-th of this process's devices along the data axis.
"""

from __future__ import annotations

from typing import Any

import grain
import jax
import numpy as np
from jax.sharding import Mesh

from sparsepipe.pipeline.mesh import data_sharding
from sparsepipe.transforms.batch import TrainBatch
from sparsepipe.transforms.coo_types import SparseDenseMatmulInput


def to_global_batch(batch: TrainBatch, mesh: Mesh) -> TrainBatch:
  """A host-local numpy TrainBatch -> global TrainBatch sharded over 'data'."""
  sharding = data_sharding(mesh)

  def put(x):
    return jax.make_array_from_process_local_data(sharding, np.asarray(x))

  sparse = SparseDenseMatmulInput(*({k: put(v) for k, v in part.items()} for part in batch.sparse))
  return TrainBatch(put(batch.labels), put(batch.dense), sparse)


class DevicePutIterDataset(grain.IterDataset):
  """PreprocessedBatch (or TrainBatch) -> TrainBatch of global jax.Arrays."""

  def __init__(self, parent: grain.IterDataset, mesh: Mesh):
    super().__init__(parent)
    self._mesh = mesh

  def __iter__(self) -> grain.DatasetIterator:
    return _DevicePutIterator(self._parent.__iter__(), self._mesh)

  def __str__(self) -> str:
    return "DevicePutIterDataset"


class _DevicePutIterator(grain.DatasetIterator):
  """Stateless: the state is the parent's."""

  def __init__(self, parent: grain.DatasetIterator, mesh: Mesh):
    super().__init__(parent)
    self._mesh = mesh

  def __next__(self) -> TrainBatch:
    element = next(self._parent)
    batch = element if isinstance(element, TrainBatch) else element.batch
    return to_global_batch(batch, self._mesh)

  def get_state(self) -> dict[str, Any]:
    return self._parent.get_state()

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state)

  def __str__(self) -> str:
    return "_DevicePutIterator"

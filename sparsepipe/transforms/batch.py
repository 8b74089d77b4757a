"""The batch that leaves the input pipeline and enters the train step."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from sparsepipe.transforms import coo_layout
from sparsepipe.transforms import stacking
from sparsepipe.transforms.coo_types import SparseDenseMatmulInput


class TrainBatch(NamedTuple):
  """One training batch (host-local numpy, or global jax.Arrays on the mesh).

  Attributes:
    labels: [batch] float32 click/rating labels.
    dense: [batch, num_dense] float32 dense features.
    sparse: COO buffers per stack, flattened per device
      (has_leading_dimension=False); on the mesh they are sharded over the
      data axis, each device holding its own buffers.
  """

  labels: Any
  dense: Any
  sparse: SparseDenseMatmulInput


def abstract_train_batch(
    feature_specs: Any,
    mesh: Any,
    *,
    global_batch_size: int,
    num_dense: int,
    num_sc_per_device: int,
) -> TrainBatch:
  """The global TrainBatch as ShapeDtypeStructs sharded over the data axis.

  Shapes follow from the (prepared) specs alone, so a train step can be
  built and compiled before the first batch exists.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from sparsepipe.pipeline.mesh import data_sharding  # pylint: disable=g-import-not-at-top

  sharding = data_sharding(mesh)
  devices = mesh.size

  def struct(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype), sharding=sharding)

  row_pointers = coo_layout.compute_row_pointers_size_per_device(devices, num_sc_per_device)
  sizes = coo_layout.compute_coo_buffer_sizes(
      stacking.get_stacked_table_specs(feature_specs), num_sc_per_device, devices
  )
  sparse = SparseDenseMatmulInput(
      lhs_row_pointers={s: struct((devices * row_pointers,), np.int32) for s in sizes},
      lhs_embedding_ids={s: struct((devices * c,), np.int32) for s, c in sizes.items()},
      lhs_sample_ids={s: struct((devices * c,), np.int32) for s, c in sizes.items()},
      lhs_gains={s: struct((devices * c,), np.float32) for s, c in sizes.items()},
  )
  return TrainBatch(
      labels=struct((global_batch_size,), np.float32),
      dense=struct((global_batch_size, num_dense), np.float32),
      sparse=sparse,
  )

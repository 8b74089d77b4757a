"""Host batches -> global jax.Arrays on the mesh.

Every leaf of the host TrainBatch has its leading dimension split over this
host's devices in mesh order (labels/dense by examples, COO buffers by
device), so `jax.make_array_from_process_local_data` with the data-axis
sharding assembles the global batch: local device d of the COO
preprocessing is the d-th of this process's devices along the data axis.

The input runs the placement as a Grain `.map` followed by a thread
prefetch (train_input.py), so the transfer of batch i+1 overlaps the step
of batch i; the input iterator's position counts batches handed out, so
checkpoints stay exact.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh

from sparsepipe import transforms
from sparsepipe.core.batch import EvalBatch, TrainBatch
from sparsepipe.core.coo_types import SparseDenseMatmulInput
from sparsepipe.core.mesh import data_sharding
from sparsepipe.pipeline.input.device_buffer import PackedBatch, place_packed


def to_global_batch(batch: TrainBatch, mesh: Mesh) -> TrainBatch:
  """A host-local numpy TrainBatch -> global TrainBatch sharded over 'data'."""
  sharding = data_sharding(mesh)

  def put(x):
    return jax.make_array_from_process_local_data(sharding, np.asarray(x))

  sparse = SparseDenseMatmulInput(*({k: put(v) for k, v in part.items()} for part in batch.sparse))
  return TrainBatch(put(batch.labels), put(batch.dense), sparse)


class LabelRangeError(ValueError):
  """Labels the model's loss cannot take (e.g. ratings 1..5 for a click loss)."""


def check_label_range(labels: np.ndarray, label_range: tuple[float, float], where: str) -> None:
  """Raises LabelRangeError if a label is outside `label_range` (or not finite)."""
  lo, hi = label_range
  labels = np.asarray(labels)
  if labels.size and not (np.all(labels >= lo) and np.all(labels <= hi)):
    raise LabelRangeError(
      f"labels outside [{lo:g}, {hi:g}] in {where}: a batch has labels from"
      f" {np.nanmin(labels):g} to {np.nanmax(labels):g} (non-finite:"
      f" {int(np.sum(~np.isfinite(labels)))}); the models' sigmoid cross-entropy needs click"
      " labels in [0, 1]: convert ratings with --label_threshold"
    )


def make_placement(
  mesh: Mesh,
  *,
  label_range: tuple[float, float] | None = None,
  where: str = "the data",
) -> Callable[[Any], Any]:
  """A function putting host elements on the mesh as global jax.Arrays.

  A PreprocessedBatch keeps its statistics and gets its TrainBatch placed
  (a PackedBatch: in one transfer, as a DevicePackedBatch); a TrainBatch is
  placed; an EvalBatch stays an EvalBatch (its mask sharded like the
  labels). With `label_range`, every batch's labels are
  checked on the host first (LabelRangeError naming `where`).
  """

  def put(element: Any) -> Any:
    if isinstance(element, EvalBatch):
      mask = jax.make_array_from_process_local_data(data_sharding(mesh), np.asarray(element.mask))
      return EvalBatch(to_global_batch(element.batch, mesh), mask)
    batch = element if isinstance(element, TrainBatch) else element.batch
    if isinstance(batch, PackedBatch):  # one buffer for the whole batch (device_buffer.py)
      if label_range is not None:  # leaf 0 of a TrainBatch: its labels
        check_label_range(batch.layout.host_leaf(batch.data, 0), label_range, where)
      return element._replace(batch=place_packed(batch, mesh))
    if label_range is not None:
      check_label_range(batch.labels, label_range, where)
    placed = to_global_batch(batch, mesh)
    return placed if isinstance(element, TrainBatch) else element._replace(batch=placed)

  return put


def abstract_train_batch(
  feature_specs: Any,
  mesh: Mesh,
  *,
  global_batch_size: int,
  num_dense: int,
  num_sc_per_device: int,
) -> TrainBatch:
  """The global TrainBatch as ShapeDtypeStructs sharded over the data axis.

  Shapes follow from the (prepared) specs alone, so a train step can be
  built and compiled before the first batch exists.
  """
  sharding = data_sharding(mesh)
  devices = mesh.size

  def struct(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype), sharding=sharding)

  row_pointers = transforms.compute_row_pointers_size_per_device(devices, num_sc_per_device)
  sizes = transforms.compute_coo_buffer_sizes(
    transforms.get_stacked_table_specs(feature_specs), num_sc_per_device, devices
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

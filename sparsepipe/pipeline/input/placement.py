"""Host batches -> global jax.Arrays on the mesh, as a Grain stage.

Every leaf of the host TrainBatch has its leading dimension split over this
host's devices in mesh order (labels/dense by examples, COO buffers by
device), so `jax.make_array_from_process_local_data` with the data-axis
sharding assembles the global batch: local device d of the COO
preprocessing is the d-th of this process's devices along the data axis.

Placement is a Grain `.map` followed by a thread prefetch, so the transfer
of batch i+1 overlaps the step of batch i; the prefetch keeps the state of
the last batch handed out, so checkpoints stay exact.
"""

from __future__ import annotations

from typing import Any, Callable

import grain
import jax
import numpy as np
from jax.sharding import Mesh

from sparsepipe import transforms
from sparsepipe.core.batch import EvalBatch, TrainBatch
from sparsepipe.core.coo_types import SparseDenseMatmulInput
from sparsepipe.core.mesh import data_sharding

# Batches placed ahead of the step: one in flight while the step runs.
PREFETCH_BATCHES = 1


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


def place_on_mesh(
  ds: grain.IterDataset,
  mesh: Mesh,
  *,
  prefetch: int = PREFETCH_BATCHES,
  label_range: tuple[float, float] | None = None,
  where: str = "the data",
) -> grain.IterDataset:
  """Host elements -> the same on the mesh as global jax.Arrays.

  PreprocessedBatch (or TrainBatch) elements become TrainBatch, EvalBatch
  stays EvalBatch (its mask sharded like the labels). With `label_range`,
  every batch's labels are checked on the host first.
  """

  def put(element: Any) -> TrainBatch | EvalBatch:
    if isinstance(element, EvalBatch):
      mask = jax.make_array_from_process_local_data(data_sharding(mesh), np.asarray(element.mask))
      return EvalBatch(to_global_batch(element.batch, mesh), mask)
    batch = element if isinstance(element, TrainBatch) else element.batch
    if label_range is not None:
      check_label_range(batch.labels, label_range, where)
    return to_global_batch(batch, mesh)

  ds = ds.map(put)
  if prefetch:
    ds = grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=prefetch)
  return ds


def _this_host(mesh: Mesh) -> dict[str, int]:
  """The host pipeline's device and process arguments for this process on `mesh`."""
  return dict(
    local_device_count=len(mesh.local_devices),
    global_device_count=mesh.size,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
  )


def make_input_pipeline(
  config: transforms.InputConfig | Any,
  feature_specs: Any,
  mesh: Mesh,
  *,
  fdo_client: Any = None,
  worker_init_fn: Callable[[int, int], None] | None = None,
  label_range: tuple[float, float] | None = None,
) -> transforms.InputPipelineIterator:
  """Iterator of TrainBatch of global jax.Arrays sharded over the mesh's data axis.

  Args:
    config: InputConfig (or ConfigDict/mapping with its keys).
    feature_specs: pytree of prepared FeatureSpecs; each reads the example
      feature of the same name; global batch = per_host_batch_size * processes.
    mesh: the 1-D data mesh; local devices = mesh.local_devices, global = mesh.size.
    fdo_client: optional, gets `record(stats)` for every batch (main process).
    worker_init_fn: optional `(worker_index, worker_count)` run in each worker
      (after it starts ignoring SIGTERM).
    label_range: if given, (lo, hi): a batch with a label outside it is a
      LabelRangeError naming the dataset.
  """
  where = f"dataset '{transforms.InputConfig.from_config(config).data_dir}'"
  return transforms.make_host_pipeline(
    config,
    feature_specs,
    **_this_host(mesh),
    fdo_client=fdo_client,
    worker_init_fn=worker_init_fn,
    placement=lambda ds: place_on_mesh(ds, mesh, label_range=label_range, where=where),
  )


def make_eval_input_pipeline(
  config: transforms.InputConfig | Any,
  feature_specs: Any,
  mesh: Mesh,
  *,
  worker_init_fn: Callable[[int, int], None] | None = None,
) -> grain.IterDataset:
  """One eval pass per iteration: EvalBatch of global jax.Arrays on the mesh.

  Args:
    config: InputConfig with the eval data_dir and the train step's
      per_host_batch_size (see transforms.make_eval_pipeline).
    feature_specs: the train step's prepared FeatureSpecs (same limits).
    mesh: the 1-D data mesh.
    worker_init_fn: optional `(worker_index, worker_count)` run in each worker.
  """
  return transforms.make_eval_pipeline(
    config,
    feature_specs,
    **_this_host(mesh),
    worker_init_fn=worker_init_fn,
    placement=lambda ds: place_on_mesh(ds, mesh),
  )


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

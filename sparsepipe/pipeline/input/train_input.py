"""The input of the train and eval steps: host input placed on the mesh.

`make_train_input` is the checkpointable iterator of placed batches
(DevicePackedBatch: one global jax.Array per batch, sharded over the data
axis) that the trainer reads;
`make_eval_input` is one pass over an eval set per iteration. Both run the
host input of sparsepipe.transforms for this process's share of the mesh.
"""

from __future__ import annotations

from typing import Any, Callable

import grain
import jax
from jax.sharding import Mesh

from sparsepipe import transforms
from sparsepipe.pipeline.input.device_buffer import PackForDevices
from sparsepipe.pipeline.input.device_placement import make_placement

# Batches placed ahead of the step: one in flight while the step runs.
PREFETCH_BATCHES = 1


def this_host(mesh: Mesh) -> dict[str, int]:
  """The host input's device and process arguments for this process on `mesh`."""
  return dict(
    local_device_count=len(mesh.local_devices),
    global_device_count=mesh.size,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
  )


def make_train_input(
  config: transforms.InputConfig | Any,
  feature_specs: Any,
  mesh: Mesh,
  *,
  fdo_client: Any = None,
  worker_init_fn: Callable[[int, int], None] | None = None,
  label_range: tuple[float, float] | None = None,
  last_retune: Callable[[int], int | None] | None = None,
) -> transforms.InputIterator:
  """Iterator of DevicePackedBatch (a TrainBatch packed into one global jax.Array,
  sharded over the mesh's data axis; `.unpacked()` is the TrainBatch). A trainer
  built from `abstract_packed_batch` takes them as they are.

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
    last_retune: optional, batch index -> the last FDO retune point at or
      before it (None: none); the iterator's `publish_limits` then changes
      the limits of later batches without restarting the workers.
  """
  where = f"dataset '{transforms.InputConfig.from_config(config).data_dir}'"
  return transforms.make_host_input(
    config,
    feature_specs,
    **this_host(mesh),
    fdo_client=fdo_client,
    worker_init_fn=worker_init_fn,
    place=make_placement(mesh, label_range=label_range, where=where),
    prefetch=PREFETCH_BATCHES,
    output=lambda element: element.batch,
    last_retune=last_retune,
    pack=PackForDevices(len(mesh.local_devices)),
  )


def make_eval_input(
  config: transforms.InputConfig | Any,
  feature_specs: Any,
  mesh: Mesh,
  *,
  worker_init_fn: Callable[[int, int], None] | None = None,
) -> grain.IterDataset:
  """One eval pass per iteration: EvalBatch of global jax.Arrays on the mesh.

  Args:
    config: InputConfig with the eval data_dir and the train step's
      per_host_batch_size (see transforms.make_host_eval_input).
    feature_specs: the train step's prepared FeatureSpecs (same limits).
    mesh: the 1-D data mesh.
    worker_init_fn: optional `(worker_index, worker_count)` run in each worker.
  """
  return transforms.make_host_eval_input(
    config,
    feature_specs,
    **this_host(mesh),
    worker_init_fn=worker_init_fn,
    place=make_placement(mesh),
  )

"""The batch that leaves the input pipeline and enters the train step."""

from __future__ import annotations

from typing import Any, NamedTuple

from sparsepipe.core.coo_types import SparseDenseMatmulInput


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


class EvalBatch(NamedTuple):
  """One eval batch: a TrainBatch of static size and which examples are real.

  The last batches of an eval pass are padded to the static batch size
  (label 0, dense 0, no sparse ids); `mask` tells the metrics to skip them.

  Attributes:
    batch: the TrainBatch (host numpy, or global jax.Arrays on the mesh).
    mask: [batch] float32, 1 for a real example, 0 for padding.
  """

  batch: TrainBatch
  mask: Any

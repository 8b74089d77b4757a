"""Containers for preprocessed COO buffers and their statistics.

Field names follow jax-tpu-embedding 0.1.0 so buffers and statistics can be
exchanged with it. Every mapping is keyed by stack name.
"""

from __future__ import annotations

import types
from typing import Mapping, NamedTuple

import numpy as np

_EMPTY: Mapping = types.MappingProxyType({})


class SparseDenseMatmulInput(NamedTuple):
  """COO buffers per stack (see docs/reference/coo_format.md for the layout)."""

  lhs_row_pointers: Mapping[str, np.ndarray]
  lhs_embedding_ids: Mapping[str, np.ndarray]
  lhs_sample_ids: Mapping[str, np.ndarray]
  lhs_gains: Mapping[str, np.ndarray]


class PreprocessedInput(NamedTuple):
  """What preprocessing returns (the reference wraps the same one field).

  The lhs_* properties forward to the buffers, as the reference's do.
  """

  sparse_dense_matmul_input: SparseDenseMatmulInput

  @property
  def lhs_row_pointers(self) -> Mapping[str, np.ndarray]:
    return self.sparse_dense_matmul_input.lhs_row_pointers

  @property
  def lhs_embedding_ids(self) -> Mapping[str, np.ndarray]:
    return self.sparse_dense_matmul_input.lhs_embedding_ids

  @property
  def lhs_sample_ids(self) -> Mapping[str, np.ndarray]:
    return self.sparse_dense_matmul_input.lhs_sample_ids

  @property
  def lhs_gains(self) -> Mapping[str, np.ndarray]:
    return self.sparse_dense_matmul_input.lhs_gains


class SparseDenseMatmulInputStats(NamedTuple):
  """Buffer statistics observed before any dropping (int32 arrays per stack).

  Attributes:
    max_ids_per_partition: shape (L*N,), index d*N+p.
    max_unique_ids_per_partition: shape (L*N,).
    required_buffer_size_per_sc: shape (L*S,), index d*S+s.
    id_drop_counters: dropped entries on this host, per stack (int).

  The last two default to empty (read-only) mappings, so statistics can be
  built from the first two alone, as with the reference.
  """

  max_ids_per_partition: Mapping[str, np.ndarray]
  max_unique_ids_per_partition: Mapping[str, np.ndarray]
  required_buffer_size_per_sc: Mapping[str, np.ndarray] = _EMPTY
  id_drop_counters: Mapping[str, int] = _EMPTY

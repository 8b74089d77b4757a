"""Columnar ragged ids: the form decoders produce and preprocessing consumes."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class RaggedBatch(NamedTuple):
  """A batch of variable-length id lists in columnar form.

  Attributes:
    values: flat ids of all samples, concatenated in sample order (int32 or
      int64), shape [sum(row_lengths)].
    row_lengths: ids per sample (int32 or int64), shape [batch]; zero allowed.
    weights: optional float32/float64 weights aligned with `values`, or None
      (all weights 1.0).
  """

  values: np.ndarray
  row_lengths: np.ndarray
  weights: np.ndarray | None = None

  @property
  def batch_size(self) -> int:
    return int(self.row_lengths.shape[0])

  def row_splits(self) -> np.ndarray:
    """Exclusive prefix sums: sample i owns values[splits[i]:splits[i+1]]."""
    splits = np.zeros(self.row_lengths.shape[0] + 1, np.int64)
    np.cumsum(self.row_lengths, out=splits[1:])
    return splits

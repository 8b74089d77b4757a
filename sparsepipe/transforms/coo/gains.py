"""Per-id gains of the combiners, bit-exact with the reference's float math.

sum: w_i.  mean: w_i / sum(w).  sqrtn: w_i / sqrt(sum(w^2)).
Per-sample sums are sequential float32 sums in input order (sqrtn
accumulates float32(double(acc) + double(w)^2)), so they cannot use numpy's
pairwise reductions: `sequential_row_sums` walks the rows column by column
instead (one vectorised step per position, rows sorted by length). Merged
duplicates sum their gains the same way, in the compiled pass (coo_pass).
"""

from __future__ import annotations

import numpy as np

from sparsepipe.core.specs import check_combiner


def sequential_row_sums(
  values: np.ndarray, lengths: np.ndarray, *, squares: bool = False
) -> np.ndarray:
  """Per-row sums of `values` in input order with float32 rounding per step.

  Args:
    values: float32 values of all rows, concatenated.
    lengths: int64 row lengths.
    squares: sum float32(double(acc) + double(v)^2) instead of acc + v.

  Returns:
    float32 [num_rows] sums (0 for empty rows).
  """
  num_rows = lengths.shape[0]
  sums = np.zeros(num_rows, np.float32)
  if values.size == 0:
    return sums
  order = np.argsort(-lengths, kind="stable")
  sorted_lengths = lengths[order]
  starts = (np.cumsum(lengths) - lengths)[order]
  # active[j] = number of rows longer than j (a prefix, rows sorted by length).
  active = np.searchsorted(-sorted_lengths, -np.arange(int(sorted_lengths[0])), "left")
  acc = np.zeros(num_rows, np.float64 if squares else np.float32)
  for j, count in enumerate(active.tolist()):
    v = values[starts[:count] + j]
    if squares:
      v64 = v.astype(np.float64)
      acc[:count] = (acc[:count] + v64 * v64).astype(np.float32)
    else:
      acc[:count] += v
  sums[order] = acc
  return sums


def id_gains(
  combiner: str, lengths: np.ndarray, weights: np.ndarray | None
) -> tuple[np.ndarray | None, np.ndarray | None]:
  """Gains of one feature's ids.

  Returns (per_row, per_id): exactly one is not None. Unweighted input has
  a gain per sample (1, 1/k, 1/sqrt(k)); weighted input a gain per id.
  """
  check_combiner(combiner, "id_gains")  # an unknown name must not be taken as sqrtn
  with np.errstate(divide="ignore", invalid="ignore"):
    if weights is None:
      k = lengths.astype(np.float32)
      if combiner == "sum":
        return np.ones(lengths.shape[0], np.float32), None
      if combiner == "mean":
        return np.float32(1.0) / k, None
      return np.float32(1.0) / np.sqrt(k), None
    if combiner == "sum":
      return None, weights
    if combiner == "mean":
      denominator = sequential_row_sums(weights, lengths)
    else:
      denominator = np.sqrt(sequential_row_sums(weights, lengths, squares=True))
    return None, weights / np.repeat(denominator, lengths)

"""Per-column statistics of dense values, the `auto` transform, and scale warnings.

The converters record in the manifest, per dense column, the values as
stored (after the transform):

    info["dense_stats"][column] = {"transform": "none" | "log1p", "count": n,
                                   "missing": empty fields (stored as 0.0),
                                   "min", "max", "mean", "std" (population)}

over every example converted (train and eval split together). They are
exact, not sampled: each batch's float64 moments are merged as it is
converted (Chan et al.'s pairwise update), at the cost of one pass over
the batch's [n, d] array.

A dense input whose values reach far past 1 swamps a model whose weights
start at about that scale: one raw timestamp column (about 1e9) made a
DLRM's loss 1.2e6 and its AUC 0.515. `scale_warnings` names every column
stored with a magnitude above SWAMP_MAGNITUDE, and `--dense_transform auto`
(the column converters' default) stores log(1 + x) instead for a column
whose values are all >= 0 and reach above it: counts, prices, durations,
timestamps. Columns with negative values are left as they are (log1p
clamps negatives to 0) and are warned about.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

# Stored magnitudes above this warn (and make `auto` take log1p of a non-negative column).
SWAMP_MAGNITUDE = 100.0


class DenseStats:
  """Running count, missing, min, max, mean and variance of [n, d] dense batches."""

  def __init__(self, names: Sequence[str]):
    d = len(names)
    self.names = tuple(names)
    self.count = 0
    self.missing = np.zeros(d, np.int64)
    self._mean = np.zeros(d, np.float64)
    self._m2 = np.zeros(d, np.float64)
    self._min = np.full(d, np.inf)
    self._max = np.full(d, -np.inf)

  def add(self, values: np.ndarray, missing: Sequence[int] | np.ndarray | None = None) -> None:
    """Adds a batch of values ([n, d]) and its count of missing fields per column ([d])."""
    k = len(values)
    if missing is not None:
      self.missing += np.asarray(missing, np.int64)
    if k == 0 or not self.names:
      self.count += k
      return
    x = np.asarray(values, np.float64).reshape(k, len(self.names))
    mean = x.mean(axis=0)
    m2 = np.square(x - mean).sum(axis=0)
    total = self.count + k
    delta = mean - self._mean
    self._mean += delta * (k / total)
    self._m2 += m2 + np.square(delta) * (self.count * k / total)
    self.count = total
    np.minimum(self._min, x.min(axis=0), out=self._min)
    np.maximum(self._max, x.max(axis=0), out=self._max)

  def column(self, j: int) -> dict[str, Any]:
    """{"count", "missing", "min", "max", "mean", "std"} of column j (None when empty)."""
    if self.count == 0:
      stats = dict.fromkeys(("min", "max", "mean", "std"))
    else:
      stats = {
        "min": float(self._min[j]),
        "max": float(self._max[j]),
        "mean": float(self._mean[j]),
        "std": float(np.sqrt(self._m2[j] / self.count)),
      }
    return {"count": self.count, "missing": int(self.missing[j]), **stats}

  def to_dict(self, transforms: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The manifest's info["dense_stats"]: per column its transform and statistics."""
    return {
      name: {"transform": transforms[name], **self.column(j)} for j, name in enumerate(self.names)
    }


def auto_transforms(raw: DenseStats) -> dict[str, str]:
  """{column: "log1p" | "none"} for `--dense_transform auto` from the raw values' statistics."""
  out = {}
  for j, name in enumerate(raw.names):
    s = raw.column(j)
    heavy = s["min"] is not None and s["min"] >= 0.0 and s["max"] > SWAMP_MAGNITUDE
    out[name] = "log1p" if heavy else "none"
  return out


def resolve_transforms(
  option: str | Mapping[str, str], names: Sequence[str], raw: DenseStats | None
) -> dict[str, str]:
  """{column: transform} from a converter's dense_transform option ("auto" needs `raw`)."""
  if isinstance(option, Mapping):
    return {name: str(option[name]) for name in names}
  if option == "auto":
    return auto_transforms(raw)
  return {name: option for name in names}


def scale_warnings(info: Mapping[str, Any]) -> list[str]:
  """One warning per dense column a manifest's info records as stored past SWAMP_MAGNITUDE."""
  stats = info.get("dense_stats") if isinstance(info, Mapping) else None
  if not isinstance(stats, Mapping):
    return []
  out = []
  for name, s in stats.items():
    if not isinstance(s, Mapping) or s.get("min") is None or s.get("max") is None:
      continue
    peak = max(abs(float(s["min"])), abs(float(s["max"])))
    if peak <= SWAMP_MAGNITUDE:
      continue
    if s.get("transform") == "log1p":  # raw values past e^100: sentinels or garbled fields
      fix = (
        f"log1p is applied already, so its raw values reach e^{peak:.4g}: clip or drop such"
        " values before converting"
      )
    elif float(s["min"]) >= 0.0:
      fix = "convert with --dense_transform log1p (or auto) to store log(1 + x)"
    else:
      fix = (
        "scale the column to about [-10, 10] before converting (log1p would clamp its"
        " negative values to 0)"
      )
    out.append(
      f"dense column '{name}' is stored with values up to {peak:.4g} in magnitude (mean"
      f" {float(s['mean']):.4g}, std {float(s['std']):.4g}, transform"
      f" {s.get('transform', 'none')}): inputs past {SWAMP_MAGNITUDE:g} swamp the model;"
      f" {fix}"
    )
  return out

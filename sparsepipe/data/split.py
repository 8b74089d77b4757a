"""Deterministic train/eval split of an example stream.

Example i (its 0-based index in the converter's input, over all files in
order) goes to the eval split when

    u = splitmix64((i + seed * 0x9E3779B97F4A7C15) mod 2^64) >> 11
    u / 2^53 < eval_fraction

The decision depends only on the index, the seed and the fraction (not on
random state, batching or process), so a rerun splits the same way and a
larger fraction only moves more examples into eval.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SPLIT_RULE = "eval if splitmix64(index + seed * 0x9E3779B97F4A7C15) >> 11 < fraction * 2^53"
_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def _splitmix64(x: np.ndarray) -> np.ndarray:
  """The splitmix64 finaliser on uint64 (wrapping arithmetic)."""
  z = x + np.uint64(_GOLDEN)
  z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return z ^ (z >> np.uint64(31))


def eval_mask(start: int, n: int, fraction: float, seed: int) -> np.ndarray:
  """[n] bool: whether examples start..start+n-1 belong to the eval split."""
  offset = np.uint64((seed * _GOLDEN) & _MASK64)
  keys = np.arange(start, start + n, dtype=np.uint64) + offset
  u = (_splitmix64(keys) >> np.uint64(11)).astype(np.float64)
  return u < fraction * 2.0**53


def split_info(part: str, fraction: float, seed: int) -> dict[str, Any]:
  """What the manifests of a split record about it."""
  return {"part": part, "eval_fraction": fraction, "seed": seed, "rule": SPLIT_RULE}

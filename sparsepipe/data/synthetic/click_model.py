"""The planted click model of synthetic datasets: each example's true click probability.

Synthetic labels are Bernoulli(sigmoid(logit)) draws, with the logit a fixed
function of the example's own features and the dataset seed:

    logit = BIAS + SCALE * (SPARSE_SHARE * s + DENSE_SHARE * d)
    s = sum_f  (sum_k g_k * w(seed, f, id_k)) / sqrt(sum_k g_k^2)  / sqrt(F)
    d = sum_j  v(seed, j) * (x_j - DENSE_MEAN) / DENSE_STD          / sqrt(D)

over the F sparse features f (by name; g_k are the id weights, 1.0 when the
feature is unweighted; a feature with no ids adds 0) and the D dense values
x_j. Every weight w and v is uniform on [-sqrt(3), sqrt(3)) (unit variance),
taken from MurmurHash3's 32-bit finalizer of (seed, feature name, id) or (seed, j), so
the model needs no table and any vocabulary size works. s and d then have
about unit variance, and SCALE puts the Bayes AUC (the AUC of the true
probabilities) near 0.78 for Criteo-shaped data (`benchmarks/synthetic.py`
prints it). A model that learns per-id embeddings and the dense layer can
approach it; `synthetic_click_probabilities` gives the bound to compare with.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from sparsepipe.data.example import ExampleBatch
from sparsepipe.data.hashing import stable_hash64
from sparsepipe.data.ragged import RaggedBatch

MODEL_VERSION = 1  # recorded in the manifest; bump when the formula changes
BIAS = -1.3
SCALE = 1.15
SPARSE_SHARE = 0.8
DENSE_SHARE = 0.6
# Mean and standard deviation of log(1 + Exponential(mean 10)), the dense distribution.
DENSE_MEAN = 2.0147
DENSE_STD = 0.9115

_HALF_WIDTH = math.sqrt(3.0)


def fmix32(x: np.ndarray) -> np.ndarray:
  """MurmurHash3's 32-bit finalizer (wrapping uint32 arithmetic): a bijective, well-mixed hash."""
  x = x ^ (x >> np.uint32(16))
  x *= np.uint32(0x85EBCA6B)
  x ^= x >> np.uint32(13)
  x *= np.uint32(0xC2B2AE35)
  x ^= x >> np.uint32(16)
  return x


def hashed_weights(keys: np.ndarray, salt: int) -> np.ndarray:
  """Unit-variance uniform weights in [-sqrt(3), sqrt(3)), float64: fmix32(key mod 2^32 ^ salt)."""
  z = fmix32(keys.astype(np.uint32) ^ np.uint32(salt))
  return z.astype(np.float64) * (2.0 * _HALF_WIDTH / 2.0**32) - _HALF_WIDTH


def _salt(seed: int, what: str) -> int:
  """A 32-bit salt per (seed, feature name)."""
  return stable_hash64(f"{seed}/{what}") & 0xFFFFFFFF


def segment_sums(values: np.ndarray, row_lengths: np.ndarray) -> np.ndarray:
  """Sums of consecutive runs of `values`, row_lengths[i] long (0 for an empty run), float64."""
  n = row_lengths.shape[0]
  starts = np.zeros(n, np.int64)
  np.cumsum(row_lengths[:-1], out=starts[1:])
  # reduceat needs in-range starts and gives values[start] for an empty run: pad, then zero those.
  padded = np.append(values.astype(np.float64, copy=False), 0.0)
  sums = np.add.reduceat(padded, np.minimum(starts, values.shape[0]))
  sums[row_lengths == 0] = 0.0
  return sums


def sparse_logit(name: str, ragged: RaggedBatch, seed: int) -> np.ndarray:
  """s_f above for one feature: [B] float64, weight-normalized sum of its id weights."""
  w = hashed_weights(ragged.values, _salt(seed, f"sparse/{name}"))
  if ragged.weights is None:
    total = segment_sums(w, ragged.row_lengths)
    norm = ragged.row_lengths.astype(np.float64)
  else:
    g = ragged.weights.astype(np.float64)
    total = segment_sums(w * g, ragged.row_lengths)
    norm = segment_sums(g * g, ragged.row_lengths)
  return total / np.sqrt(np.maximum(norm, 1e-12))


def dense_logit(dense: np.ndarray, seed: int) -> np.ndarray:
  """d above: [B] float64."""
  num_dense = dense.shape[1]
  if num_dense == 0:
    return np.zeros(dense.shape[0])
  v = hashed_weights(np.arange(num_dense), _salt(seed, "dense"))
  d = np.zeros(dense.shape[0])
  for j in range(num_dense):  # Column by column: the same sums whatever the batch size.
    d += (dense[:, j].astype(np.float64) - DENSE_MEAN) * (v[j] / DENSE_STD)
  return d / math.sqrt(num_dense)


def click_logits(dense: np.ndarray, sparse: Mapping[str, RaggedBatch], seed: int) -> np.ndarray:
  """The planted logit of every example (module doc), [B] float64."""
  s = np.zeros(dense.shape[0])
  for name, ragged in sparse.items():
    s += sparse_logit(name, ragged, seed)
  if sparse:
    s /= math.sqrt(len(sparse))
  return BIAS + SCALE * (SPARSE_SHARE * s + DENSE_SHARE * dense_logit(dense, seed))


def synthetic_click_probabilities(batch: ExampleBatch, seed: int) -> np.ndarray:
  """True click probabilities of synthetic examples (labels are Bernoulli draws of these).

  Args:
    batch: examples of a dataset written by `write_synthetic` (or yielded by
      `generate_batches`), e.g. decoded back from its records; any packing.
    seed: the dataset's seed (`manifest.info["seed"]`).

  Returns:
    [B] float64 probabilities sigmoid(logit), a function of each example's
    features only, so the same for an example however it was batched.
  """
  return click_probabilities(batch.dense, batch.sparse, seed)


def click_probabilities(
  dense: np.ndarray, sparse: Mapping[str, RaggedBatch], seed: int
) -> np.ndarray:
  """sigmoid(click_logits(...)), [B] float64 (tanh form: no overflow warnings)."""
  return 0.5 * (1.0 + np.tanh(0.5 * click_logits(dense, sparse, seed)))

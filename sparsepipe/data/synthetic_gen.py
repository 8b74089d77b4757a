"""Synthetic click-log datasets: Zipf-distributed ids, deterministic per seed.

Command line: `python -m sparsepipe.data.synthetic` (synthetic.py).

Per sparse feature, each example gets a uniform number of ids in
[min_ids, max_ids]. Ids follow a bounded Zipf law of exponent s: a rank
k in [0, vocab) is drawn from the power-law density x^-s on [1, vocab+1)
(floor(x) - 1, by inverse CDF), then scrambled by a fixed bijection
k -> (k * m) mod vocab so the hot ids spread over the table. Weights (if
asked) are uniform in [0.5, 1.5). Dense values are log(1 + Exponential(10)).
Labels are Bernoulli(sigmoid(logit)) with a logit made of fixed per-id
effects, so a model has something to learn. The whole stream depends only
on the seed and the feature definitions (not on packing or sharding).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterator, Sequence

import numpy as np

from sparsepipe.data.example import ExampleBatch
from sparsepipe.data.manifest import Manifest
from sparsepipe.data.progress import Progress
from sparsepipe.data.ragged import RaggedBatch
from sparsepipe.data.schema import ExampleSchema, SparseFeatureSchema
from sparsepipe.data.writer import DEFAULT_EXAMPLES_PER_RECORD, DEFAULT_MAX_RECORDS_PER_SHARD
from sparsepipe.data.writer import write_batches

_CHUNK = 4096  # examples generated per step (fixed: part of the stream definition)
_EFFECTS = 64  # distinct per-id label effects per feature


@dataclasses.dataclass(frozen=True)
class SyntheticFeature:
  """How one synthetic sparse feature is drawn."""

  name: str
  vocab_size: int
  min_ids: int = 1
  max_ids: int = 1
  weighted: bool = False
  zipf_exponent: float = 1.1

  def __post_init__(self):
    if not 0 <= self.min_ids <= self.max_ids:
      raise ValueError(
          f"feature '{self.name}': need 0 <= min_ids <= max_ids, got"
          f" min_ids={self.min_ids} max_ids={self.max_ids}"
      )
    if self.zipf_exponent <= 0:
      raise ValueError(f"feature '{self.name}': zipf_exponent={self.zipf_exponent} must be > 0")


def criteo_like_features(
    num_sparse: int = 26,
    vocab_sizes: int | Sequence[int] = 100_000,
    *,
    min_ids: int = 1,
    max_ids: int = 20,
    weighted: bool = False,
    zipf_exponent: float = 1.1,
    prefix: str = "C",
) -> tuple[SyntheticFeature, ...]:
  """Features named C1..Cn (Criteo-style), all drawn alike."""
  sizes = _expand(vocab_sizes, num_sparse, "vocab_sizes")
  return tuple(
      SyntheticFeature(f"{prefix}{i + 1}", sizes[i], min_ids, max_ids, weighted, zipf_exponent)
      for i in range(num_sparse)
  )


def synthetic_schema(features: Sequence[SyntheticFeature], num_dense: int) -> ExampleSchema:
  return ExampleSchema(
      num_dense=num_dense,
      sparse=tuple(SparseFeatureSchema(f.name, f.vocab_size, f.weighted) for f in features),
      dense_names=tuple(f"I{i + 1}" for i in range(num_dense)),
  )


def zipf_ids(rng: np.random.Generator, n: int, vocab_size: int, exponent: float) -> np.ndarray:
  """n ids in [0, vocab_size): bounded Zipf ranks, scrambled (see module doc)."""
  u = rng.random(n)
  top = vocab_size + 1.0
  if abs(exponent - 1.0) < 1e-9:
    x = np.power(top, u)
  else:
    a = 1.0 - exponent
    x = np.power(1.0 + u * (top**a - 1.0), 1.0 / a)
  ranks = np.clip(np.floor(x).astype(np.int64) - 1, 0, vocab_size - 1)
  return (ranks * _scramble_multiplier(vocab_size)) % vocab_size


def _scramble_multiplier(vocab_size: int) -> int:
  m = 2654435761 % vocab_size or 1
  while math.gcd(m, vocab_size) != 1:
    m += 1
  return m


def generate_batches(
    features: Sequence[SyntheticFeature], num_dense: int, num_examples: int, seed: int
) -> Iterator[ExampleBatch]:
  """Yields columnar chunks of the synthetic stream, num_examples in all."""
  rng = np.random.default_rng(seed)
  effects = rng.normal(0.0, 1.0, (len(features), _EFFECTS))
  dense_w = rng.normal(0.0, 0.3, num_dense)
  done = 0
  while done < num_examples:
    b = min(_CHUNK, num_examples - done)
    dense = np.log1p(rng.exponential(10.0, (b, num_dense))).astype(np.float32)
    logit = dense.astype(np.float64) @ dense_w - 1.0
    sparse = {}
    for i, f in enumerate(features):
      lengths = rng.integers(f.min_ids, f.max_ids + 1, b).astype(np.int32)
      ids = zipf_ids(rng, int(lengths.sum()), f.vocab_size, f.zipf_exponent)
      weights = rng.uniform(0.5, 1.5, ids.size).astype(np.float32) if f.weighted else None
      rows = np.repeat(np.arange(b), lengths)
      total = np.bincount(rows, effects[i][ids % _EFFECTS], minlength=b)
      logit += total / np.maximum(lengths, 1) / math.sqrt(max(len(features), 1))
      sparse[f.name] = RaggedBatch(ids.astype(np.int32), lengths, weights)
    labels = (rng.random(b) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    yield ExampleBatch(labels, dense, sparse)
    done += b


def write_synthetic(
    output_dir: str,
    features: Sequence[SyntheticFeature],
    *,
    num_examples: int,
    num_dense: int = 13,
    seed: int = 0,
    examples_per_record: int = DEFAULT_EXAMPLES_PER_RECORD,
    max_records_per_shard: int = DEFAULT_MAX_RECORDS_PER_SHARD,
    overwrite: bool = False,
    show_progress: bool = False,
) -> Manifest:
  """Writes a synthetic dataset and returns its manifest."""
  if num_examples < 1:
    raise ValueError(f"num_examples={num_examples} must be >= 1")
  schema = synthetic_schema(features, num_dense)
  info = {
      "generator": "sparsepipe.data.synthetic",
      "seed": seed,
      "features": [dataclasses.asdict(f) for f in features],
  }
  return write_batches(
      output_dir,
      schema,
      generate_batches(features, num_dense, num_examples, seed),
      examples_per_record=examples_per_record,
      max_records_per_shard=max_records_per_shard,
      overwrite=overwrite,
      info=info,
      progress=Progress("synthetic", num_examples) if show_progress else None,
  )


def _expand(value: int | Sequence[int], n: int, what: str) -> list[int]:
  if isinstance(value, (int, np.integer)):
    return [int(value)] * n
  values = [int(v) for v in value]
  if len(values) == 1:
    return values * n
  if len(values) != n:
    raise ValueError(f"{what} has {len(values)} entries, expected 1 or {n}")
  return values

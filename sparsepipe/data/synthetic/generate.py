"""Synthetic click-log datasets: Zipf-distributed ids, planted labels, deterministic per seed.

Command line: `python -m sparsepipe.data.synthetic` (synthetic.py).

Per sparse feature, each example gets a uniform number of ids in
[min_ids, max_ids]. Ids follow a bounded Zipf law of exponent s: a rank
k in [0, vocab) is drawn from the power-law density x^-s on [1, vocab+1)
(floor(x) - 1, by inverse CDF), then scrambled by a fixed bijection
k -> (k * m) mod vocab so the hot ids spread over the table. Weights (if
asked) are uniform in [0.5, 1.5). Dense values are log(1 + Exponential(10)).
Labels are Bernoulli draws of the planted click model (click_model.py),
so `synthetic_click_probabilities` gives every example's true probability.

A dataset has two independent streams of the same distribution and model:
"train" and "eval" (`write_synthetic(..., eval_output=...)`). Each depends
only on the seed, the split and the feature definitions (not on packing,
sharding or the number of examples asked: a longer stream extends a shorter).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
from typing import Iterator, Sequence

import numpy as np

from sparsepipe.data.example import ExampleBatch, slice_batch
from sparsepipe.data.manifest import Manifest
from sparsepipe.data.progress import Progress
from sparsepipe.data.ragged import RaggedBatch
from sparsepipe.data.schema import ExampleSchema, SparseFeatureSchema
from sparsepipe.data.synthetic.click_model import MODEL_VERSION, click_probabilities
from sparsepipe.data.writer import DEFAULT_EXAMPLES_PER_RECORD, DEFAULT_MAX_RECORDS_PER_SHARD
from sparsepipe.data.writer import check_apart, written_together

_CHUNK = 4096  # examples generated per step (fixed: part of the stream definition)
_FLOAT32_VOCAB = 1 << 20  # Zipf inverse CDF in float32 up to this vocabulary size
_TABLE_VOCAB = 1 << 22  # scramble by table lookup up to this vocabulary size (16 MiB)
_TABLE_CACHE_BYTES = 128 << 20  # scramble tables kept, least recently used dropped first
_TABLES: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
_TABLES_LOCK = threading.Lock()


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
    if not self.zipf_exponent > 0:  # NaN too
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
  """n int32 ids in [0, vocab_size): bounded Zipf ranks, scrambled (see module doc).

  Up to _FLOAT32_VOCAB the inverse CDF runs in float32 (twice as fast; 24-bit
  uniforms still resolve the rarest rank), above it in float64.
  """
  dtype = np.float32 if vocab_size <= _FLOAT32_VOCAB else np.float64
  u = rng.random(n, dtype)
  top = vocab_size + 1.0
  if abs(exponent - 1.0) < 1e-9:
    x = np.exp(u * dtype(math.log(top)), out=u)
  else:
    a = 1.0 - exponent
    u *= dtype(top**a - 1.0)
    u += dtype(1.0)
    x = np.power(u, dtype(1.0 / a), out=u)
  ranks = x.astype(np.int64)  # floor: x >= 1
  ranks -= 1
  np.clip(ranks, 0, vocab_size - 1, out=ranks)
  return scramble(ranks, vocab_size)


def scramble(ranks: np.ndarray, vocab_size: int) -> np.ndarray:
  """The bijection k -> (k * m) mod vocab_size of the module doc, as int32."""
  if vocab_size <= _TABLE_VOCAB:
    return _scramble_table(vocab_size)[ranks]
  return ((ranks * _scramble_multiplier(vocab_size)) % vocab_size).astype(np.int32)


def _scramble_table(vocab_size: int) -> np.ndarray:
  """The bijection as a lookup table: a gather is ~4x faster than int64 modulo.

  Cached by bytes, not by count: a Criteo-shaped stream draws from ~20
  vocabulary sizes per chunk, and a cache of a few tables rebuilt most of
  them for every chunk.
  """
  with _TABLES_LOCK:
    table = _TABLES.get(vocab_size)
    if table is not None:
      _TABLES.move_to_end(vocab_size)
      return table
  table = np.arange(vocab_size, dtype=np.int64) * _scramble_multiplier(vocab_size) % vocab_size
  table = table.astype(np.int32)
  with _TABLES_LOCK:
    _TABLES[vocab_size] = table
    while len(_TABLES) > 1 and sum(t.nbytes for t in _TABLES.values()) > _TABLE_CACHE_BYTES:
      _TABLES.popitem(last=False)  # the least recently used
  return table


def _scramble_multiplier(vocab_size: int) -> int:
  m = 2654435761 % vocab_size or 1
  while math.gcd(m, vocab_size) != 1:
    m += 1
  return m


SPLITS = ("train", "eval")


def generate_batches(
  features: Sequence[SyntheticFeature],
  num_dense: int,
  num_examples: int,
  seed: int,
  *,
  split: str = "train",
) -> Iterator[ExampleBatch]:
  """Yields columnar chunks of a synthetic stream, num_examples in all."""
  if split not in SPLITS:
    raise ValueError(f"split '{split}' must be one of {SPLITS}")
  rng = np.random.default_rng([seed, SPLITS.index(split)])
  done = 0
  while done < num_examples:
    # Always a whole chunk, cut at the end: the first n examples never depend on num_examples.
    dense = np.log1p(rng.standard_exponential((_CHUNK, num_dense), np.float32) * np.float32(10.0))
    sparse = {f.name: _draw_feature(rng, f, _CHUNK) for f in features}
    p = click_probabilities(dense, sparse, seed)
    labels = (rng.random(_CHUNK) < p).astype(np.float32)
    b = min(_CHUNK, num_examples - done)
    yield slice_batch(ExampleBatch(labels, dense, sparse), 0, b)
    done += b


def _draw_feature(rng: np.random.Generator, f: SyntheticFeature, b: int) -> RaggedBatch:
  lengths = rng.integers(f.min_ids, f.max_ids + 1, b, np.int32)
  ids = zipf_ids(rng, int(lengths.sum()), f.vocab_size, f.zipf_exponent)
  weights = rng.uniform(0.5, 1.5, ids.size).astype(np.float32) if f.weighted else None
  return RaggedBatch(ids, lengths, weights)


def write_synthetic(
  output_dir: str,
  features: Sequence[SyntheticFeature],
  *,
  num_examples: int,
  num_dense: int = 13,
  seed: int = 0,
  eval_output: str | None = None,
  eval_fraction: float | None = None,
  eval_examples: int | None = None,
  examples_per_record: int = DEFAULT_EXAMPLES_PER_RECORD,
  max_records_per_shard: int = DEFAULT_MAX_RECORDS_PER_SHARD,
  overwrite: bool = False,
  show_progress: bool = False,
) -> Manifest:
  """Writes a synthetic dataset (the "train" stream) and returns its manifest.

  With `eval_output`, also writes an eval dataset there: the first examples
  of the independent "eval" stream (same click model, same schema), either
  `eval_examples` of them or round(eval_fraction * num_examples) taken out of
  num_examples (train keeps the rest). Both manifests' `info` record the seed,
  split and click model version (`synthetic_click_probabilities` needs the seed).
  """
  num_eval = _num_eval_examples(num_examples, eval_output, eval_fraction, eval_examples)
  if eval_output is not None:
    check_apart(output_dir, eval_output)
  num_train = num_examples - num_eval if eval_fraction is not None else num_examples
  if num_train < 1:
    raise ValueError(f"num_examples={num_examples} leaves {num_train} train examples (need >= 1)")
  splits = [("train", output_dir, num_train)]
  if num_eval:
    splits.append(("eval", eval_output, num_eval))
  options = dict(
    examples_per_record=examples_per_record,
    max_records_per_shard=max_records_per_shard,
    overwrite=overwrite,
  )
  schema = synthetic_schema(features, num_dense)
  directories = {directory: _info(features, seed, split) for split, directory, _ in splits}
  with written_together(directories, schema, **options) as writers:  # train and eval at once
    for writer, (split, _, count) in zip(writers, splits):
      progress = Progress(f"synthetic {split}", count) if show_progress else None
      for batch in generate_batches(features, num_dense, count, seed, split=split):
        writer.write_batch(batch)
        if progress:
          progress.update(batch.num_examples)
      if progress:
        progress.close()
  return writers[0].manifest


def _num_eval_examples(
  num_examples: int, eval_output: str | None, fraction: float | None, count: int | None
) -> int:
  """Eval examples asked for; checks that exactly one of fraction/count goes with eval_output."""
  if num_examples < 1:
    raise ValueError(f"num_examples={num_examples} must be >= 1")
  if eval_output is None:
    if fraction is not None or count is not None:
      raise ValueError("eval_fraction/eval_examples need eval_output (the eval dataset directory)")
    return 0
  if (fraction is None) == (count is None):
    raise ValueError("eval_output needs exactly one of eval_fraction and eval_examples")
  if fraction is not None:
    if not 0.0 < fraction < 1.0:
      raise ValueError(f"eval_fraction={fraction} must be in (0, 1)")
    count = max(1, round(fraction * num_examples))
  if count < 1:
    raise ValueError(f"eval_examples={count} must be >= 1")
  return count


def _info(features: Sequence[SyntheticFeature], seed: int, split: str) -> dict[str, object]:
  return {
    "generator": "sparsepipe.data.synthetic",
    "seed": seed,
    "split": split,
    "click_model_version": MODEL_VERSION,
    "features": [dataclasses.asdict(f) for f in features],
  }


def _expand(value: int | Sequence[int], n: int, what: str) -> list[int]:
  if isinstance(value, (int, np.integer)):
    return [int(value)] * n
  values = [int(v) for v in value]
  if len(values) == 1:
    return values * n
  if len(values) != n:
    raise ValueError(f"{what} has {len(values)} entries, expected 1 or {n}")
  return values

"""Examples one at a time (writers, tests) and columnar batches (the hot path)."""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

import numpy as np

from sparsepipe.data.ragged import RaggedBatch
from sparsepipe.data.schema import ExampleSchema


class Example(NamedTuple):
  """One example.

  Attributes:
    label: the label (float).
    dense: [num_dense] float32.
    ids: {feature name: 1-D int ids} for every sparse feature (may be empty).
    weights: {feature name: 1-D float32 weights} for the weighted features.
  """

  label: float
  dense: np.ndarray
  ids: Mapping[str, np.ndarray]
  weights: Mapping[str, np.ndarray] = {}


class ExampleBatch(NamedTuple):
  """Columnar examples: no per-example Python objects.

  Attributes:
    labels: [B] float32.
    dense: [B, num_dense] float32.
    sparse: {feature name: RaggedBatch} in schema order; int32 values,
      int32 row_lengths, float32 weights for weighted features else None.
  """

  labels: np.ndarray
  dense: np.ndarray
  sparse: Mapping[str, RaggedBatch]

  @property
  def num_examples(self) -> int:
    return int(self.labels.shape[0])


def batch_from_examples(examples: Sequence[Example], schema: ExampleSchema) -> ExampleBatch:
  """Packs examples into columnar form, validating them against the schema."""
  n = len(examples)
  labels = np.asarray([float(e.label) for e in examples], np.float32).reshape(n)
  dense = np.zeros((n, schema.num_dense), np.float32)
  for i, e in enumerate(examples):
    d = np.asarray(e.dense, np.float32)
    if d.shape != (schema.num_dense,):
      raise ValueError(
        f"example {i}: dense has shape {d.shape}, schema needs ({schema.num_dense},)"
      )
    dense[i] = d
  sparse = {}
  for f in schema.sparse:
    rows, wrows = [], []
    for i, e in enumerate(examples):
      if f.name not in e.ids:
        raise ValueError(f"example {i}: sparse feature '{f.name}' is missing")
      ids = np.asarray(e.ids[f.name]).reshape(-1)
      if ids.size and ids.dtype.kind not in "iu":
        raise ValueError(f"example {i}: feature '{f.name}' ids have dtype {ids.dtype}, not integer")
      rows.append(ids.astype(np.int64))
      if f.weighted:
        if f.name not in e.weights:
          raise ValueError(f"example {i}: weighted feature '{f.name}' has no weights")
        w = np.asarray(e.weights[f.name], np.float32).reshape(-1)
        if w.shape != ids.shape:
          raise ValueError(
            f"example {i}: feature '{f.name}' has {ids.size} ids but {w.size} weights"
          )
        wrows.append(w)
    values = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    _check_ids(f.name, values, f.vocab_size)
    lengths = np.asarray([r.size for r in rows], np.int32)
    weights = None
    if f.weighted:
      weights = np.concatenate(wrows) if wrows else np.zeros(0, np.float32)
    sparse[f.name] = RaggedBatch(values.astype(np.int32), lengths, weights)
  extra = set()
  for e in examples:
    extra |= set(e.ids) - set(schema.feature_names)
  if extra:
    raise ValueError(f"examples hold sparse features not in the schema: {sorted(extra)}")
  return ExampleBatch(labels, dense, sparse)


def example_at(batch: ExampleBatch, i: int) -> Example:
  """Example i of a columnar batch (tests and tools; not for the hot path)."""
  ids, weights = {}, {}
  for name, rb in batch.sparse.items():
    splits = rb.row_splits()
    ids[name] = rb.values[splits[i] : splits[i + 1]]
    if rb.weights is not None:
      weights[name] = rb.weights[splits[i] : splits[i + 1]]
  return Example(float(batch.labels[i]), batch.dense[i], ids, weights)


def concat_batches(batches: Sequence[ExampleBatch]) -> ExampleBatch:
  """Concatenates columnar batches with the same features, in order."""
  if not batches:
    raise ValueError("concat_batches needs at least one batch")
  if len(batches) == 1:
    return batches[0]
  first = batches[0]
  sparse = {}
  for name, rb in first.sparse.items():
    parts = [b.sparse[name] for b in batches]
    weights = None
    if rb.weights is not None:
      weights = np.concatenate([p.weights for p in parts])
    sparse[name] = RaggedBatch(
      np.concatenate([p.values for p in parts]),
      np.concatenate([p.row_lengths for p in parts]),
      weights,
    )
  return ExampleBatch(
    np.concatenate([b.labels for b in batches]),
    np.concatenate([b.dense for b in batches]),
    sparse,
  )


def slice_batch(batch: ExampleBatch, start: int, stop: int) -> ExampleBatch:
  """Examples [start, stop) of a columnar batch (views where possible)."""
  if start == 0 and stop == batch.num_examples:
    return batch
  sparse = {}
  for name, rb in batch.sparse.items():
    lengths = rb.row_lengths
    lo = int(lengths[:start].sum())
    hi = lo + int(lengths[start:stop].sum())
    weights = None if rb.weights is None else rb.weights[lo:hi]
    sparse[name] = RaggedBatch(rb.values[lo:hi], lengths[start:stop], weights)
  return ExampleBatch(batch.labels[start:stop], batch.dense[start:stop], sparse)


def select_examples(batch: ExampleBatch, mask: np.ndarray) -> ExampleBatch:
  """The examples of a columnar batch where `mask` ([num_examples] bool) is True, in order."""
  sparse = {}
  for name, rb in batch.sparse.items():
    keep = np.repeat(mask, rb.row_lengths)
    weights = None if rb.weights is None else rb.weights[keep]
    sparse[name] = RaggedBatch(rb.values[keep], rb.row_lengths[mask], weights)
  return ExampleBatch(batch.labels[mask], batch.dense[mask], sparse)


def _check_ids(name: str, values: np.ndarray, vocab_size: int) -> None:
  if values.size == 0:
    return
  bad = (values < 0) | (values >= vocab_size)
  if bad.any():
    raise ValueError(
      f"feature '{name}': id {int(values[np.argmax(bad)])} out of range [0, {vocab_size})"
    )


class ExampleBatchBuilder:
  """Accumulates parsed examples column by column (for text converters)."""

  def __init__(self, schema: ExampleSchema):
    self.schema = schema
    self._names = schema.feature_names
    self.clear()

  def clear(self) -> None:
    self._labels: list[float] = []
    self._dense: list[Sequence[float]] = []
    self._ids: list[list[int]] = [[] for _ in self._names]
    self._lengths: list[list[int]] = [[] for _ in self._names]

  def __len__(self) -> int:
    return len(self._labels)

  def add(self, label: float, dense: Sequence[float], ids: Sequence[Sequence[int]]) -> None:
    """Adds one example; `ids[i]` are the ids of schema feature i (unweighted)."""
    self._labels.append(label)
    self._dense.append(dense)
    for i, row in enumerate(ids):
      self._ids[i].extend(row)
      self._lengths[i].append(len(row))

  def take(self) -> ExampleBatch:
    """The examples added since the last take(), as a columnar batch."""
    n = len(self._labels)
    dense = np.asarray(self._dense, np.float32).reshape(n, self.schema.num_dense)
    sparse = {}
    for i, f in enumerate(self.schema.sparse):
      values = np.asarray(self._ids[i], np.int64)
      _check_ids(f.name, values, f.vocab_size)
      sparse[f.name] = RaggedBatch(
        values.astype(np.int32), np.asarray(self._lengths[i], np.int32), None
      )
    batch = ExampleBatch(np.asarray(self._labels, np.float32), dense, sparse)
    self.clear()
    return batch

"""The embedding lookup of the trained model on the host: ids -> combined vectors.

Per feature and example: the rows of the feature's table for its ids,
times the combiner's gains (sum: w; mean: w / sum(w); sqrtn:
w / sqrt(sum(w^2)); w = 1 without weights), summed. The gains are the COO
preprocessing's own (transforms.coo.gains), so the vectors equal the
training lookup's up to float summation order. An example without ids
gets zeros.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from sparsepipe.core.specs import check_combiner
from sparsepipe.data.example import ExampleBatch
from sparsepipe.transforms.coo.gains import id_gains


def _combined(table: Any, values: np.ndarray, lengths: np.ndarray, weights, combiner: str):
  batch, dim = lengths.shape[0], table.shape[1]
  out = np.zeros((batch, dim), np.float32)
  if values.size == 0:
    return out
  per_row, per_id = id_gains(combiner, lengths.astype(np.int64), weights)
  gains = per_id if per_id is not None else np.repeat(per_row, lengths)
  contributions = np.asarray(table[values], np.float32) * gains[:, None].astype(np.float32)
  nonempty = np.flatnonzero(lengths)
  starts = (np.cumsum(lengths) - lengths)[nonempty]
  out[nonempty] = np.add.reduceat(contributions, starts, axis=0)
  return out


def _checked_ids(name: str, ragged: Any, num_examples: int) -> np.ndarray:
  """A feature's ids as int64, checked against its row lengths and the examples' count:
  numpy would broadcast, truncate float ids, or fail without naming the feature."""
  values, lengths = np.asarray(ragged.values), np.asarray(ragged.row_lengths)
  if lengths.shape != (num_examples,):
    raise ValueError(
      f"feature '{name}': row_lengths of shape {lengths.shape}, for {num_examples} examples"
      f" (the rows of dense) it must be ({num_examples},)"
    )
  if not np.issubdtype(lengths.dtype, np.integer) or (lengths < 0).any():
    raise ValueError(f"feature '{name}': row_lengths must be integers >= 0, got {lengths.dtype}")
  total = int(lengths.sum())
  if values.ndim != 1 or values.shape[0] != total:
    raise ValueError(
      f"feature '{name}': values of shape {values.shape}, its row_lengths sum to {total}: it"
      f" must be ({total},)"
    )
  if values.size and not np.issubdtype(values.dtype, np.integer):
    raise ValueError(f"feature '{name}': ids must be integers, got {values.dtype}")
  return values.astype(np.int64)


def combined_embeddings(
  tables: Mapping[str, Any], features: Sequence[Mapping[str, Any]], batch: ExampleBatch
) -> dict[str, np.ndarray]:
  """{feature: [B, dim] float32} for the examples of `batch`.

  Raises:
    ValueError: a feature is missing from the batch, an id is outside its
      table's vocabulary (naming the feature and the id), or a feature's
      combiner is not sum, mean or sqrtn.
  """
  num_examples = int(np.shape(batch.dense)[0])
  out = {}
  for feature in features:
    name = feature["name"]
    if name not in batch.sparse:
      raise ValueError(f"the examples have no feature '{name}' (they have {sorted(batch.sparse)})")
    ragged = batch.sparse[name]
    values = _checked_ids(name, ragged, num_examples)
    vocab = int(feature["vocab_size"])
    bad = np.flatnonzero((values < 0) | (values >= vocab))
    if bad.size:
      raise ValueError(
        f"feature '{name}': id {int(values[bad[0]])} is outside its vocabulary [0, {vocab})"
      )
    weights = ragged.weights if feature.get("weighted") else None
    combiner = check_combiner(feature.get("combiner"), f"feature '{name}'")
    out[name] = _combined(tables[feature["table"]], values, ragged.row_lengths, weights, combiner)
  return out

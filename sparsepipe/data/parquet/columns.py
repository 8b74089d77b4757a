"""The columns a Parquet conversion reads: their roles, the Arrow types each role takes.

`ParquetColumns` checks the arguments once (each column one role, vocab
sizes, weight pairs), then every input file's schema (the columns exist
once, with a type their role can use) before any data is read, and turns
each record batch into an ExampleBatch (arrays.py does the work).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pyarrow as pa

from sparsepipe.data.convert.dense_stats import DenseStats
from sparsepipe.data.convert.text_input import THRESHOLD_HINT, checked_threshold
from sparsepipe.data.convert.text_input import column_transforms
from sparsepipe.data.convert.vocab_sizing import parse_vocab_sizes
from sparsepipe.data.example import ExampleBatch
from sparsepipe.data.parquet import arrays
from sparsepipe.data.schema import ExampleSchema, SparseFeatureSchema

_ROLE_NAMES = {
  "label": "the label",
  "dense": "a dense column",
  "sparse": "a sparse column",
  "weight": "a weight column",
}


def _numeric(t: pa.DataType) -> bool:
  return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _category(t: pa.DataType, integer_only: bool) -> bool:
  """Integers (ids or hashed) or strings (hashed), also dictionary-encoded."""
  if pa.types.is_dictionary(t):
    t = t.value_type
  if integer_only:
    return pa.types.is_integer(t)
  return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)


def comparable_type(t: pa.DataType) -> pa.DataType:
  """`t` less what writers vary and a conversion ignores: dictionary encoding, the name
  and nullability of list items (two files agree on a column if these are equal)."""
  if pa.types.is_dictionary(t):
    return comparable_type(t.value_type)
  if pa.types.is_large_list(t):
    return pa.large_list(comparable_type(t.value_type))
  if pa.types.is_fixed_size_list(t):
    return pa.list_(comparable_type(t.value_type), t.list_size)
  if pa.types.is_list(t):
    return pa.list_(comparable_type(t.value_type))
  return t


def parse_weight_columns(
  entries: Mapping[str, str] | Sequence[str], sparse_columns: Sequence[str]
) -> dict[str, str]:
  """`["genres=genre_weights"]` or {feature: weight column} -> {feature: weight column}."""
  if not isinstance(entries, Mapping):
    pairs = {}
    for entry in entries:
      feature, sep, column = str(entry).partition("=")
      if not sep or not feature.strip() or not column.strip():
        raise ValueError(
          f"weight_columns (--weight_columns) entry {entry!r} is not feature=weight_column"
        )
      pairs[feature.strip()] = column.strip()
    entries = pairs
  stray = [f for f in entries if f not in sparse_columns]
  if stray:
    raise ValueError(
      f"weight columns given for {stray}, which are not among the sparse columns"
      f" {list(sparse_columns)}"
    )
  return dict(entries)


class ParquetColumns:
  """Column roles of a conversion; see convert.py for what each role does with its values."""

  def __init__(
    self,
    *,
    label_column: str,
    dense_columns: Sequence[str] = (),
    sparse_columns: Sequence[str] = (),
    integer_id_columns: Sequence[str] = (),
    vocab_sizes: Mapping[str, int] | Sequence[str] | int = 1_000_000,
    weight_columns: Mapping[str, str] | Sequence[str] = (),
    dense_transform: str | Mapping[str, str] = "none",
    label_threshold: float | None = None,
  ):
    stray = [c for c in integer_id_columns if c not in sparse_columns]
    if stray:
      raise ValueError(
        f"integer id columns {stray} are not among the sparse columns {list(sparse_columns)}"
      )
    self.dense_transforms = column_transforms(dense_transform, dense_columns)
    self.weights = parse_weight_columns(weight_columns, sparse_columns)
    self.roles = [(label_column, "label")]
    self.roles += [(c, "dense") for c in dense_columns]
    self.roles += [(c, "sparse") for c in sparse_columns]
    self.roles += [(c, "weight") for c in self.weights.values()]
    _check_one_role_each(self.roles)
    if not isinstance(vocab_sizes, Mapping):
      vocab_sizes = parse_vocab_sizes(vocab_sizes, sparse_columns)
    self.schema = ExampleSchema(
      num_dense=len(dense_columns),
      sparse=tuple(
        SparseFeatureSchema(c, vocab_sizes[c], c in self.weights) for c in sparse_columns
      ),
      dense_names=tuple(dense_columns),
      label_name=label_column,
    )
    self.names = [name for name, _ in self.roles]
    self._integer = set(integer_id_columns)
    self._hashers = {
      c: arrays.BatchHasher(vocab_sizes[c]) for c in sparse_columns if c not in self._integer
    }
    self._log1p = [self.dense_transforms[c] == "log1p" for c in dense_columns]
    self.dense_stats = DenseStats(dense_columns)
    self._threshold = checked_threshold(label_threshold)
    # The sparse columns of list type, one id per item: what the CSV converter's
    # multivalent_columns are (set by check_file; every input has the same types).
    self.multivalent: list[str] = []

  def check_file(self, schema: pa.Schema, path: str) -> dict[str, pa.DataType]:
    """{column: Arrow type} of the used columns of a file; ValueError naming the file if a
    column is missing, appears twice, or has a type its role cannot take."""
    names = list(schema.names)
    missing = [c for c in self.names if c not in names]
    if missing:
      raise ValueError(f"'{path}': columns {missing} are not in the schema {names}")
    for name in self.names:
      where = [i + 1 for i, n in enumerate(names) if n == name]
      if len(where) > 1:
        raise ValueError(
          f"'{path}': the schema names column '{name}' {len(where)} times (fields {where})"
        )
    types = {name: schema.field(name).type for name in self.names}
    for name, role in self.roles:
      self._check_type(name, role, types, path)
    self.multivalent = [f.name for f in self.schema.sparse if arrays.is_list(types[f.name])]
    return types

  def _check_type(self, name: str, role: str, types: Mapping[str, pa.DataType], path: str) -> None:
    t = types[name]
    item = t.value_type if arrays.is_list(t) else t
    if role in ("label", "dense"):
      ok, need = _numeric(t), "numbers (integer, floating point or bool)"
    elif role == "sparse" and name in self._integer:
      ok, need = _category(item, True), "integers or lists of integers (--integer_id_columns)"
    elif role == "sparse":
      ok, need = _category(item, False), "integers or strings, or lists of them"
    else:
      feature = next(f for f, w in self.weights.items() if w == name)
      listed = arrays.is_list(types[feature])
      ok = _numeric(item) and arrays.is_list(t) == listed
      need = f"{'lists of numbers' if listed else 'numbers'} (one per value of column {feature})"
    if not ok:
      role_name = "the label column" if role == "label" else f"{role} column"
      raise ValueError(f"'{path}': {role_name} '{name}' has Arrow type {t}; it must hold {need}")

  def convert(self, batch: pa.RecordBatch, rows: arrays.Rows) -> ExampleBatch:
    """The examples of one record batch (columns: at least the used ones)."""
    label = self.schema.label_name
    labels = arrays.label_values(batch.column(label), label, self._threshold, THRESHOLD_HINT, rows)
    dense = np.zeros((batch.num_rows, self.schema.num_dense), np.float32)
    for j, name in enumerate(self.schema.dense_names):
      dense[:, j] = arrays.dense_values(batch.column(name), name, self._log1p[j], rows)
    missing = [batch.column(name).null_count for name in self.schema.dense_names]
    self.dense_stats.add(dense, missing)
    sparse = {}
    for f in self.schema.sparse:
      weight_name = self.weights.get(f.name)
      sparse[f.name] = arrays.sparse_ids(
        batch.column(f.name),
        f.name,
        vocab=f.vocab_size,
        hasher=self._hashers.get(f.name),
        rows=rows,
        weights=None if weight_name is None else (batch.column(weight_name), weight_name),
      )
    return ExampleBatch(labels, dense, sparse)


def _check_one_role_each(roles: Sequence[tuple[str, str]]) -> None:
  """A column may be read once: as the label, a dense, a sparse or a weight column."""
  seen: dict[str, str] = {}
  for name, role in roles:
    if name in seen:
      first, second = _ROLE_NAMES[seen[name]], _ROLE_NAMES[role]
      if first == second:
        raise ValueError(f"column '{name}' is named twice as {first}: name it once")
      raise ValueError(
        f"column '{name}' is named twice: as {first} and as {second} (a column takes one role)"
      )
    seen[name] = role

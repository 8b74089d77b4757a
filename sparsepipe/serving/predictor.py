"""Predictions from an export: `Predictor.load(E, deltas=[...]).predict(batch)`.

The Predictor holds the tables (memory-mapped when read from a full export
alone), the dense parameters and the deserialized predict function
(jax.export, run on the CPU or another platform it was lowered for). It
scores decoded examples (`predict`: dense floats and per-feature id lists,
the data layer's ExampleBatch) or raw rows as the training data's converter
read them (`predict_rows`: the same hashing and id rules), returning click
probabilities. No examples give an empty array, as numpy's functions do;
examples of another dense width are an error naming both widths.
"""

from __future__ import annotations

import os
from typing import Any, Collection, Iterable, Mapping, Sequence

import jax
import numpy as np

from sparsepipe.data.convert.arguments import name_list
from sparsepipe.data.convert.raw_rows import examples_from_rows
from sparsepipe.data.convert.raw_rows import row_columns
from sparsepipe.data.example import ExampleBatch
from sparsepipe.data.schema import ExampleSchema
from sparsepipe.serving import delta as delta_lib
from sparsepipe.serving.export_format import PREDICT_FILENAME
from sparsepipe.serving.export_format import ExportError
from sparsepipe.serving.export_format import ExportInfo
from sparsepipe.serving.export_format import load_array
from sparsepipe.serving.export_format import load_params
from sparsepipe.serving.export_format import read_info
from sparsepipe.serving.export_format import table_filename
from sparsepipe.serving.host_lookup import combined_embeddings


def load_predict_function(directory: str) -> jax.export.Exported:
  """The export's serialized predict function."""
  try:
    with open(os.path.join(directory, PREDICT_FILENAME), "rb") as f:
      return jax.export.deserialize(bytearray(f.read()))
  except (OSError, ValueError) as e:
    raise ExportError(f"export '{directory}': file '{PREDICT_FILENAME}' is unreadable ({e})") from e


def load_chain(
  export_dir: str, deltas: Sequence[str]
) -> tuple[ExportInfo, ExportInfo, dict[str, Any], list[np.ndarray]]:
  """(base info, newest info, tables, dense params) of a full export and its deltas."""
  base = read_info(export_dir)
  if base.kind != "full":
    raise ExportError(
      f"export '{export_dir}' is a delta: load its full export with the deltas after it"
    )
  chain = [(delta_dir, read_info(delta_dir)) for delta_dir in name_list(deltas, "deltas")]
  delta_lib.check_chain(export_dir, base, chain)
  if deltas:
    tables = delta_lib.writable_tables(export_dir, base)
  else:
    tables = {t: load_array(export_dir, table_filename(t), mmap=True) for t in base.tables}
  newest, newest_dir = base, export_dir
  for delta_dir, info in chain:
    delta_lib.apply_delta(tables, info, delta_dir)
    newest, newest_dir = info, delta_dir
  return base, newest, tables, load_params(newest_dir, int(newest.params["count"]))


class Predictor:
  """A loaded export (see the module docstring)."""

  def __init__(
    self,
    info: ExportInfo,
    tables: Mapping[str, Any],
    params: list[np.ndarray],
    predict_fn: jax.export.Exported,
    *,
    directory: str | None = None,
  ):
    self.info = info
    self.where = f"export '{directory}'" if directory else "the export"
    self.tables = dict(tables)
    self.params = params
    self._predict = predict_fn
    self._schema = ExampleSchema.from_dict(info.converter["schema"])

  @classmethod
  def load(cls, export_dir: str, deltas: Sequence[str] = ()) -> Predictor:
    """A full export, with the deltas made after it applied in order."""
    base, newest, tables, params = load_chain(export_dir, deltas)
    predict_fn = load_predict_function(export_dir)
    return cls(newest, tables, params, predict_fn, directory=export_dir)

  @property
  def columns(self) -> tuple[str, ...]:
    """The raw columns predict_rows reads: the training data converter's label, dense
    and sparse columns (ValueError if that data was not converted from raw rows)."""
    return row_columns(self.info.converter["info"])

  def predict(self, batch: ExampleBatch) -> np.ndarray:
    """[B] float32 click probabilities of decoded examples ([0] for none).

    Raises:
      ValueError: the examples have another number of dense values than the
        export's dense_dim, lack a feature, or hold an id outside its
        vocabulary.
    """
    if not isinstance(batch, ExampleBatch):
      raise TypeError(
        f"predict takes an ExampleBatch (e.g. data.decode_batch's), not a {type(batch).__name__}"
      )
    dense = np.asarray(batch.dense, np.float32)
    width = dense.shape[1] if dense.ndim == 2 else None
    if width != self.info.dense_dim:
      raise ValueError(
        f"the examples have {width if width is not None else dense.shape} dense values"
        f" per example, {self.where} takes {self.info.dense_dim} (dense_dim)"
      )
    if batch.num_examples == 0:
      return np.zeros(0, np.float32)
    embeddings = combined_embeddings(self.tables, self.info.features, batch)
    scores = self._predict.call(self.params, dense, embeddings)
    return np.asarray(jax.device_get(scores), np.float32)

  def predict_rows(
    self, rows: Iterable[Mapping[str, Any]], *, ignore_columns: Collection[str] = ()
  ) -> np.ndarray:
    """[len(rows)] click probabilities of raw rows, converted as the training data was.

    Each row is {column: value}, the value text (as the converter read it),
    a number, None (a missing value: the same as an empty field, or the
    column left out) or, for a multivalent column, a list of values (the
    same ids as the field joined with the column's separator). `rows` may
    be any iterable of them (a list, a generator, a csv.DictReader); `[]`
    gives an empty array.

    A column the converter never read is an error naming it and the
    training data's columns (`self.columns`), not a warning: a misspelt
    column would otherwise score as a missing value, and a warning is easy
    to miss in a serving loop. Name columns the rows carry on purpose (an
    id, a timestamp) in `ignore_columns`.

    Raises:
      InputFormatError: a row that is not a mapping, has a column the
        converter did not read, or a value it cannot convert (naming the
        row as line i of 'rows', and the column).
      ValueError: the training data was not converted from raw rows.
    """
    info = self.info.converter["info"]
    examples = examples_from_rows(info, self._schema, rows, ignore_columns=ignore_columns)
    return self.predict(examples)

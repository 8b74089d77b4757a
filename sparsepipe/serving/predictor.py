"""Predictions from an export: `Predictor.load(E, deltas=[...]).predict(batch)`.

The Predictor holds the tables (memory-mapped when read from a full export
alone), the dense parameters and the deserialized predict function
(jax.export, run on the CPU or another platform it was lowered for). It
scores decoded examples (`predict`: dense floats and per-feature id lists,
the data layer's ExampleBatch) or raw rows as the training data's converter
read them (`predict_rows`: the same hashing and id rules), returning click
probabilities.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from sparsepipe.data.convert.rows import examples_from_rows
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
from sparsepipe.serving.lookup import combined_embeddings


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
  chain = [(delta_dir, read_info(delta_dir)) for delta_dir in deltas]
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
  ):
    self.info = info
    self.tables = dict(tables)
    self.params = params
    self._predict = predict_fn
    self._schema = ExampleSchema.from_dict(info.converter["schema"])

  @classmethod
  def load(cls, export_dir: str, deltas: Sequence[str] = ()) -> Predictor:
    """A full export, with the deltas made after it applied in order."""
    base, newest, tables, params = load_chain(export_dir, deltas)
    return cls(newest, tables, params, load_predict_function(export_dir))

  def predict(self, batch: ExampleBatch) -> np.ndarray:
    """[B] float32 click probabilities of decoded examples."""
    embeddings = combined_embeddings(self.tables, self.info.features, batch)
    dense = np.asarray(batch.dense, np.float32).reshape(-1, self.info.dense_dim)
    scores = self._predict.call(self.params, dense, embeddings)
    return np.asarray(jax.device_get(scores), np.float32)

  def predict_rows(self, rows: Sequence[Mapping[str, str]]) -> np.ndarray:
    """[len(rows)] click probabilities of raw rows ({column: text}, as a converter read them)."""
    info = self.info.converter["info"]
    return self.predict(examples_from_rows(info, self._schema, rows))

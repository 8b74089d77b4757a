"""The dataset a column converter writes: its rows as records, and how they were made.

The CSV and Parquet converters record in the manifest's `info` the
converter, the inputs, the hashing rule and every column option, which is
what `examples_from_rows` (and so serving's `predict_rows`) reads back to
map raw values to the same ids.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from sparsepipe.data.progress import Progress
from sparsepipe.data.example import ExampleBatch
from sparsepipe.data.manifest import Manifest
from sparsepipe.data.schema import ExampleSchema
from sparsepipe.data.writer import write_batches

HASH_RULE = "blake2b-64 little-endian, mod vocab"


def write_converted(
  name: str,
  inputs: Sequence[str],
  columns: Mapping[str, Any],
  output_dir: str,
  schema: ExampleSchema,
  batches: Iterable[ExampleBatch],
  *,
  total: int | None = None,
  show_progress: bool = False,
  **writer_options: Any,
) -> Manifest:
  """Writes `batches` with converter `name`'s info; `writer_options` as write_batches'."""
  info = {
    "converter": f"sparsepipe.data.{name}",
    "inputs": list(inputs),
    "hash": HASH_RULE,
    **{k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in columns.items()},
  }
  progress = Progress(name, total) if show_progress else None
  return write_batches(output_dir, schema, batches, info=info, progress=progress, **writer_options)

"""A converter's output: where it may write its dataset, and the dataset it writes.

Where: a converter's --output (and --eval_output) is refused, before anything
is read or written, when it lies inside saved work (a workdir, a dataset or an
export: core.saved_work), when it is a workdir, an export or a symbolic
link, and when it is a folder that holds saved work. An existing dataset
there is replaced only with --overwrite, and a folder of other files gets
the dataset beside them (data.writer). The launcher's own data
(`<workdir>/data`) is written through the writer, not these commands.

What: the rows as records, and how they were made. The CSV and Parquet
converters record in the manifest's `info` the converter, the inputs, the
hashing rule and every column option, which is what `examples_from_rows`
(and so serving's `predict_rows`) reads back to map raw values to the same
ids.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping, Sequence

from sparsepipe.core.saved_work import refuse_holding_saved_work
from sparsepipe.core.saved_work import refuse_inside_saved_work
from sparsepipe.core.saved_work import refuse_other_saved_work
from sparsepipe.core.saved_work import refuse_symbolic_link
from sparsepipe.data.progress import Progress
from sparsepipe.data.example import ExampleBatch
from sparsepipe.data.manifest import Manifest
from sparsepipe.data.schema import ExampleSchema
from sparsepipe.data.writer import write_batches

HASH_RULE = "blake2b-64 little-endian, mod vocab"


def check_dataset_output(output: str, flag: str = "--output") -> None:
  """Raises OutputPathError unless a converter may write a dataset at `output`."""
  given, real = os.path.abspath(output), os.path.realpath(output)
  refuse_inside_saved_work(given, real, "dataset", flag)
  refuse_symbolic_link(given, flag)
  if not refuse_other_saved_work(given, real, flag, "dataset", "a dataset"):
    refuse_holding_saved_work(given, real, flag, "a dataset goes")


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

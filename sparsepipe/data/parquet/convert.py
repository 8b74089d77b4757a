"""Converts Parquet files into a sharded ArrayRecord dataset.

Command line: `python -m sparsepipe.data.parquet` (__main__.py).

Inputs are Parquet files or directories; a directory stands for the
`.parquet` files under it (any depth, sorted by path; names starting with
`_` or `.` skipped, as Spark's `_SUCCESS` and `.crc` files). Files are read
one record batch at a time, row group by row group, and only the columns
used, so memory stays bounded whatever the file size. Columns are chosen
by name and converted as the CSV converter does, so the same table gives
the same examples from CSV and from Parquet:
- label: a numeric column (nulls refused), which must lie in [0, 1], or with
  `label_threshold t` 1.0 if value >= t else 0.0.
- dense columns: numeric, as float32 (null -> 0.0, as an empty CSV field);
  with `dense_transform="log1p"`, x -> log(1 + max(x, 0)); "auto" (the
  converter's default) as the CSV converter's. Stored values must be
  finite as float32.
- sparse columns: integer or string columns (dictionary-encoded too) give
  one id per row; list<...> columns of them (also large_list and
  fixed_size_list) give a multivalent feature, one id per item (no separator involved). A null, an
  empty string, a null list and a null item inside a list give no id (as
  the CSV converter skips empty fields and empty pieces). Values are hashed
  into the column's vocabulary with sparsepipe.data.hashing (an integer as
  its decimal text, as it reads in a CSV file), except `integer_id_columns`,
  integer columns whose values are the ids and must lie in [0, vocab).
- weight columns: `weight_columns={feature: column}` (or `["feature=column"]`)
  makes the feature weighted; the column holds one number per value of the
  feature's column (a list of the same length per row for a list column),
  and the weights of values that give no id are dropped.
A dense or sparse column null in every row of a file is a warning naming
the column and the file; one null in every row of every file is an error
(nulls.py). Every file must have the used columns once each, with the same Arrow
types (dictionary encoding and the names and nullability of list items
may differ). A bad value raises InputFormatError naming the file and row
(counted from 0 in the file); a file that cannot be read names the file,
and the row group for damaged data.
"""

from __future__ import annotations

import errno
import os
from typing import Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from sparsepipe.data.convert.text_input import InputFormatError
from sparsepipe.data.example import ExampleBatch
from sparsepipe.data.manifest import Manifest
from sparsepipe.data.parquet.arrays import Rows
from sparsepipe.data.parquet.columns import ParquetColumns, comparable_type
from sparsepipe.data.parquet.nulls import NullColumns
from sparsepipe.data.writer import DEFAULT_EXAMPLES_PER_RECORD, DEFAULT_MAX_RECORDS_PER_SHARD
from sparsepipe.data.convert.arguments import checked_columns
from sparsepipe.data.convert.arguments import name_list
from sparsepipe.data.convert.from_data import resolve_from_data
from sparsepipe.data.convert.arguments import check_each_once
from sparsepipe.data.convert.outputs import write_converted
from sparsepipe.data.convert.vocab_sizing import parse_vocab_sizes
from sparsepipe.data.parquet.scan import scan_parquet

DEFAULT_BATCH_ROWS = 65_536


def parquet_files(inputs: Sequence[str]) -> list[str]:
  """The input files: each file as given, each directory's .parquet files in path order."""
  files = []
  for path in name_list(inputs, "inputs"):
    if os.path.isdir(path):
      found = []
      for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = [d for d in dirnames if not d.startswith(("_", "."))]
        found += [
          os.path.join(dirpath, n)
          for n in filenames
          if n.endswith(".parquet") and not n.startswith(("_", "."))
        ]
      if not found:
        raise ValueError(f"'{path}' holds no .parquet files")
      files += sorted(found)
    elif os.path.exists(path):
      files.append(path)
    else:
      raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
  if not files:
    raise ValueError("no input files")
  check_each_once(files)
  return files


def _open(path: str) -> pq.ParquetFile:
  """Opens a file (reads its footer); a file that is not Parquet, or cut short, is named."""
  try:
    # Pages that carry a CRC (e.g. from Spark) are checked, so a damaged page is an error.
    return pq.ParquetFile(path, page_checksum_verification=True)
  except pa.ArrowException as e:
    raise ValueError(
      f"'{path}' is not a readable Parquet file (truncated or damaged?): {' '.join(str(e).split())}"
    ) from None


def _record_batches(
  file: pq.ParquetFile, path: str, columns: Sequence[str], batch_rows: int
) -> Iterator[tuple[int, pa.RecordBatch]]:
  """(file row of the batch's first row, batch), row group by row group."""
  start = 0
  for group in range(file.num_row_groups):
    size = file.metadata.row_group(group).num_rows
    batches = file.iter_batches(batch_size=batch_rows, row_groups=[group], columns=columns)
    while True:
      try:
        batch = next(batches, None)
      except (pa.ArrowException, OSError) as e:
        raise InputFormatError(
          path,
          group,
          f"the data of rows {start} to {start + size - 1} cannot be read (the file is damaged"
          f" or truncated): {' '.join(str(e).split())}",
          unit="row group",
        ) from None
      if batch is None:
        break
      yield start, batch
      start += batch.num_rows


def read_parquet(
  inputs: Sequence[str], *, batch_rows: int = DEFAULT_BATCH_ROWS, **columns
) -> tuple[ParquetColumns, int, Iterator[ExampleBatch]]:
  """Checks every input's schema; returns the columns (their schema and dense
  statistics), the row count and the batches.

  `columns` are ParquetColumns' keyword arguments (label_column, ...).
  """
  if batch_rows < 1:
    raise ValueError(f"batch_rows={batch_rows} must be >= 1")
  files = parquet_files(inputs)
  wanted = ParquetColumns(**columns)
  first_types, total = None, 0
  for path in files:
    with _open(path) as file:
      types = wanted.check_file(file.schema_arrow, path)
      total += file.metadata.num_rows
    if first_types is None:
      first_types = types
    for name in wanted.names:
      if comparable_type(types[name]) != comparable_type(first_types[name]):
        raise ValueError(
          f"'{path}': column '{name}' has Arrow type {types[name]}, but '{files[0]}' has"
          f" {first_types[name]} (every input must give a column the same type)"
        )

  def batches() -> Iterator[ExampleBatch]:
    nulls = NullColumns(wanted.roles)  # columns null in every row (nulls.py)
    for path in files:
      with _open(path) as file:
        for start, batch in _record_batches(file, path, wanted.names, batch_rows):
          nulls.add(batch)
          yield wanted.convert(batch, Rows(path, start))
      nulls.end_file(path)
    nulls.check(files)

  return wanted, total, batches()


def convert_parquet(
  inputs: Sequence[str],
  output_dir: str,
  *,
  batch_rows: int = DEFAULT_BATCH_ROWS,
  examples_per_record: int = DEFAULT_EXAMPLES_PER_RECORD,
  max_records_per_shard: int = DEFAULT_MAX_RECORDS_PER_SHARD,
  overwrite: bool = False,
  show_progress: bool = False,
  eval_output: str | None = None,
  eval_fraction: float = 0.0,
  split_seed: int = 0,
  **columns,
) -> Manifest:
  """Converts Parquet files or directories into a dataset; returns the manifest.

  `columns` as in ParquetColumns (label_column, dense_columns,
  sparse_columns, integer_id_columns, vocab_sizes, weight_columns,
  dense_transform, label_threshold), but with convert_csv's defaults from
  the data: unsized columns sized by their distinct values, and
  dense_transform "auto" (a first pass, parquet/scan.py). `batch_rows` rows are read and
  converted at a time. With `eval_output`, a deterministic `eval_fraction`
  of the examples (by their index in the input, as in convert_csv) goes to
  a second dataset there; the manifest returned is the train split's.
  """
  files = parquet_files(inputs)
  columns = checked_columns(columns)
  sparse = list(columns.get("sparse_columns", ()))
  given = parse_vocab_sizes(columns.get("vocab_sizes"), sparse, allow_unsized=True)

  def scan(hashed, integer, dense):
    checked = {**columns, "vocab_sizes": 1, "dense_transform": "none"}
    read_parquet(files, batch_rows=batch_rows, **checked)  # names missing or mistyped columns

    def record_batches(names):
      for path in files:
        with _open(path) as file:
          for _, batch in _record_batches(file, path, names, batch_rows):
            yield batch

    return scan_parquet(record_batches, hashed, integer, dense)

  columns = resolve_from_data(columns, given, scan)
  sizing = columns.pop("vocab_sizing")
  wanted, total, batches = read_parquet(files, batch_rows=batch_rows, **columns)
  return write_converted(
    "parquet",
    files,
    {**columns, "vocab_sizing": sizing, "multivalent_columns": wanted.multivalent},
    output_dir,
    wanted.schema,
    batches,
    final_info=lambda: {"dense_stats": wanted.dense_stats.to_dict(wanted.dense_transforms)},
    total=total,
    show_progress=show_progress,
    examples_per_record=examples_per_record,
    max_records_per_shard=max_records_per_shard,
    overwrite=overwrite,
    eval_output=eval_output,
    eval_fraction=eval_fraction,
    split_seed=split_seed,
  )

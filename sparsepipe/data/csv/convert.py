"""Converts a CSV file with a header row into a sharded ArrayRecord dataset.

Command line: `python -m sparsepipe.data.csv` (csv.py).

Columns are named by the header row (quoted fields follow RFC 4180, so a
title like "Bridges of Madison County, The (1995)" is one field).
- label: the number, which must lie in [0, 1], or with `--label_threshold t`
  1.0 if value >= t else 0.0 (e.g. ratings 1..5).
- dense columns: the number as float32 (empty -> 0.0); with
  `--dense_transform log1p`, x -> log(1 + max(x, 0)); with `auto` (the
  converter's default) log1p for a column whose values are all >= 0 and
  reach above 100, the number for the others (dense_stats.py). Stored values
  must be finite as float32. The manifest records each column's transform
  and statistics (info["dense_stats"]).
- sparse columns: one id per field; a multivalent column is split on the
  separator ("Comedy|Drama" -> 2 ids, empty pieces skipped); an empty field
  gives no id (an empty row). Values are hashed into the column's vocabulary
  with the stable 64-bit BLAKE2b hash of sparsepipe.data.hashing
  (id = h % vocab), except `--integer_id_columns`, whose values are used as
  ids directly and must lie in [0, vocab).
- vocab sizes: `--vocab_sizes` is a list of `N` (the default for every
  column) and `column=N` entries; a column with neither is sized from its
  distinct values (4x, a power of two, at most 2**20; an integer-id column
  from its largest id: vocab_sizing.py), counted in a first pass over the
  input (csv/scan.py).
Every input file must have the same header (UTF-8), which names each
column used once. A malformed line raises InputFormatError naming the file
and line (for a row that spans lines, e.g. an unclosed quote, the line it
starts on).
"""

from __future__ import annotations

import contextlib
import csv as _csv
from typing import Any, Iterator, Mapping, Sequence

from sparsepipe.data.example import ExampleBatch, ExampleBatchBuilder
from sparsepipe.data.hashing import CategoryHasher
from sparsepipe.data.manifest import Manifest
from sparsepipe.data.schema import ExampleSchema, SparseFeatureSchema
from sparsepipe.data.convert.arguments import checked_columns
from sparsepipe.data.convert.arguments import check_text_files
from sparsepipe.data.convert.text_input import (
  InputFormatError,
  check_label,
  log1p_clamped,
  parse_float,
)
from sparsepipe.data.convert.text_input import THRESHOLD_HINT, checked_threshold, column_transforms
from sparsepipe.data.convert.text_input import read_lines, resolve_delimiter
from sparsepipe.data.writer import DEFAULT_EXAMPLES_PER_RECORD, DEFAULT_MAX_RECORDS_PER_SHARD
from sparsepipe.data.convert.dense_stats import DenseStats
from sparsepipe.data.convert.vocab_sizing import parse_vocab_sizes
from sparsepipe.data.convert.from_data import resolve_from_data
from sparsepipe.data.csv.scan import scan_csv
from sparsepipe.data.convert.outputs import write_converted
from sparsepipe.data.convert.row_values import ROWS, field_text
from sparsepipe.data.convert.raw_rows import RowReader, register_row_reader

_CHUNK = 4096


class CsvParser:
  """Turns CSV rows into columnar batches for the chosen columns."""

  def __init__(
    self,
    header: Sequence[str],
    *,
    label_column: str,
    dense_columns: Sequence[str] = (),
    sparse_columns: Sequence[str] = (),
    multivalent_columns: Sequence[str] = (),
    separator: str = "|",
    vocab_sizes: Mapping[str, int] | Sequence[str] | int = 1_000_000,
    integer_id_columns: Sequence[str] = (),
    dense_transform: str | Mapping[str, str] = "none",
    label_threshold: float | None = None,
    source: str = "the header",
  ):
    header = [h.strip() for h in header]
    self.header = header
    wanted = [label_column, *dense_columns, *sparse_columns]
    missing = [c for c in wanted if c not in header]
    if missing:
      raise ValueError(f"columns {missing} are not in {source} {header}")
    for what, cols in (("multivalent", multivalent_columns), ("integer id", integer_id_columns)):
      stray = [c for c in cols if c not in sparse_columns]
      if stray:
        raise ValueError(
          f"{what} columns {stray} are not among the sparse columns {list(sparse_columns)}"
        )
    transforms = column_transforms(dense_transform, dense_columns)
    if multivalent_columns and not separator:
      raise ValueError("multivalent columns need a non-empty separator")
    if not isinstance(vocab_sizes, Mapping):
      vocab_sizes = parse_vocab_sizes(vocab_sizes, sparse_columns)
    self.schema = ExampleSchema(
      num_dense=len(dense_columns),
      sparse=tuple(SparseFeatureSchema(c, vocab_sizes[c]) for c in sparse_columns),
      dense_names=tuple(dense_columns),
      label_name=label_column,
    )
    self._label = header.index(label_column)
    self._dense = [header.index(c) for c in dense_columns]
    self._dense_names = list(dense_columns)
    self._log1p = [transforms[c] == "log1p" for c in dense_columns]
    self.dense_transforms = transforms
    self.dense_stats = DenseStats(dense_columns)
    self._missing = [0] * len(dense_columns)
    self._threshold = checked_threshold(label_threshold)
    self._sep = separator
    self._sparse = []
    for c in sparse_columns:
      integer = c in integer_id_columns
      self._sparse.append(
        (
          header.index(c),
          c,
          c in multivalent_columns,
          None if integer else CategoryHasher(vocab_sizes[c]),
          vocab_sizes[c],
        )
      )
    self._width = len(header)
    self._builder = ExampleBatchBuilder(self.schema)

  def add_row(self, row: Sequence[str], path: str, line_no: int) -> None:
    if len(row) != self._width:
      raise InputFormatError(path, line_no, f"expected {self._width} fields, got {len(row)}")
    text = row[self._label]
    if not text:
      raise InputFormatError(path, line_no, f"the label column '{self.schema.label_name}' is empty")
    label = parse_float(text, path, line_no, self.schema.label_name, float32=False)
    if self._threshold is not None:
      label = 1.0 if label >= self._threshold else 0.0
    check_label(label, text, path, line_no, self.schema.label_name, THRESHOLD_HINT)
    dense = []
    for k, (j, name, log1p) in enumerate(zip(self._dense, self._dense_names, self._log1p)):
      if not row[j]:
        self._missing[k] += 1
      x = parse_float(row[j], path, line_no, name, float32=not log1p)
      dense.append(log1p_clamped(x) if log1p else x)
    ids = []
    for j, name, multi, hasher, vocab in self._sparse:
      value = row[j]
      pieces = [p for p in value.split(self._sep) if p] if multi else ([value] if value else [])
      if hasher is not None:
        ids.append([hasher(p) for p in pieces])
      else:
        ids.append([self._integer_id(p, name, vocab, path, line_no) for p in pieces])
    self._builder.add(label, dense, ids)

  @staticmethod
  def _integer_id(text: str, name: str, vocab: int, path: str, line_no: int) -> int:
    try:
      value = int(text)
    except ValueError:
      raise InputFormatError(
        path, line_no, f"column {name} value {text!r} is not an integer id"
      ) from None
    if not 0 <= value < vocab:
      raise InputFormatError(path, line_no, f"column {name} id {value} out of range [0, {vocab})")
    return value

  def __len__(self) -> int:
    return len(self._builder)

  def take(self) -> ExampleBatch:
    """The pending examples; their dense values are added to `dense_stats`."""
    batch = self._builder.take()
    self.dense_stats.add(batch.dense, self._missing)
    self._missing = [0] * len(self._missing)
    return batch


def read_header(paths: Sequence[str], delimiter: str) -> tuple[str, list[str]]:
  """(the delimiter, the first file's header row)."""
  if not paths:
    raise ValueError("no input files")
  with contextlib.closing(read_lines(paths[0])) as lines:
    first = next(lines, "")
  if not first:
    raise ValueError(f"'{paths[0]}' is empty (a header row is required)")
  delim = resolve_delimiter(delimiter, first)
  try:
    return delim, next(_csv.reader([first], delimiter=delim))
  except _csv.Error as e:
    if "\r" in first.rstrip("\r\n"):  # lines ended by a bare carriage return (old Mac files)
      raise InputFormatError(
        paths[0],
        1,
        "lines end in a carriage return alone (\\r): convert them to \\n, e.g. with tr '\\r' '\\n'",
      ) from None
    raise InputFormatError(paths[0], 1, f"the header row does not parse: {e}") from None


def read_csv(
  paths: Sequence[str], *, delimiter: str = ",", chunk_size: int = _CHUNK, **columns
) -> tuple[CsvParser, Iterator[ExampleBatch]]:
  """Opens the inputs; returns the parser (its schema, dense statistics) and an
  iterator of columnar batches.

  `columns` are CsvParser's keyword arguments (label_column, ...).
  """
  check_text_files(paths)
  delim, header = read_header(paths, delimiter)
  _check_unique(header, paths[0], columns)
  parser = CsvParser(header, **columns, source=f"the header of '{paths[0]}'")

  def batches() -> Iterator[ExampleBatch]:
    for path in paths:
      reader = _csv.reader(read_lines(path), delimiter=delim)
      file_header = [h.strip() for h in next(reader, [])]
      if file_header != parser.header:
        raise InputFormatError(path, 1, f"header {file_header} differs from {parser.header}")
      for start, row in _rows(reader, path):
        if not row or (len(row) == 1 and not row[0].strip()):
          continue  # blank line
        try:
          parser.add_row(row, path, start)
        except InputFormatError as e:
          if reader.line_num > start:  # a quoted field ran over line ends
            raise InputFormatError(
              path,
              start,
              f"{e.reason} (this row runs from line {start} to line"
              f" {reader.line_num}: is a quote left open on line {start}?)",
            ) from None
          raise
        if len(parser) >= chunk_size:
          yield parser.take()
    if len(parser):
      yield parser.take()

  return parser, batches()


def _rows(reader, path: str) -> Iterator[tuple[int, list[str]]]:
  """(line the row starts on, row) for the rows of a csv.reader; csv errors name that line."""
  while True:
    start = reader.line_num + 1
    try:
      row = next(reader)
    except StopIteration:
      return
    except _csv.Error as e:
      raise InputFormatError(
        path, start, f"{e} (in the row starting on this line; is a quote left open?)"
      ) from None
    yield start, row


def _check_unique(header: Sequence[str], path: str, columns: Mapping[str, object]) -> None:
  """The columns the converter uses must each appear once in the header."""
  names = [h.strip() for h in header]
  used = [
    columns.get("label_column"),
    *columns.get("dense_columns", ()),
    *columns.get("sparse_columns", ()),
  ]
  for name in dict.fromkeys(c for c in used if c is not None):
    where = [i + 1 for i, h in enumerate(names) if h == name]
    if len(where) > 1:
      raise InputFormatError(
        path, 1, f"the header names column '{name}' {len(where)} times (fields {where})"
      )


def convert_csv(
  inputs: Sequence[str],
  output_dir: str,
  *,
  delimiter: str = ",",
  examples_per_record: int = DEFAULT_EXAMPLES_PER_RECORD,
  max_records_per_shard: int = DEFAULT_MAX_RECORDS_PER_SHARD,
  overwrite: bool = False,
  show_progress: bool = False,
  eval_output: str | None = None,
  eval_fraction: float = 0.0,
  split_seed: int = 0,
  **columns,
) -> Manifest:
  """Converts CSV files into a dataset; `columns` as in CsvParser. Returns the manifest.

  Unlike CsvParser's, the defaults come from the data: a sparse column
  without a `vocab_sizes` entry gets a vocabulary sized by its distinct
  values (sparsepipe.data.convert.vocab_sizing) and `dense_transform`
  defaults to "auto" (sparsepipe.data.convert.dense_stats), both found by a
  first pass over the inputs (csv/scan.py). The manifest records the
  resulting sizes and per-column transforms, and how they were chosen
  (info["vocab_sizing"]), with the dense statistics (info["dense_stats"]).

  With `eval_output`, a deterministic `eval_fraction` of the examples goes
  to a second dataset there instead (see sparsepipe.data.split); the
  manifest returned is the train split's.
  """
  check_text_files(inputs)
  columns = _resolve_from_data(inputs, delimiter, checked_columns(columns))
  sizing = columns.pop("vocab_sizing")
  parser, batches = read_csv(inputs, delimiter=delimiter, **columns)
  return write_converted(
    "csv",
    inputs,
    {**columns, "vocab_sizing": sizing},
    output_dir,
    parser.schema,
    batches,
    final_info=lambda: {"dense_stats": parser.dense_stats.to_dict(parser.dense_transforms)},
    show_progress=show_progress,
    examples_per_record=examples_per_record,
    max_records_per_shard=max_records_per_shard,
    overwrite=overwrite,
    eval_output=eval_output,
    eval_fraction=eval_fraction,
    split_seed=split_seed,
  )


def _resolve_from_data(
  inputs: Sequence[str], delimiter: str, columns: Mapping[str, object]
) -> dict[str, object]:
  """resolve_from_data with the CSV scan (csv/scan.py) of `inputs`."""
  sparse = list(columns.get("sparse_columns", ()))
  given = parse_vocab_sizes(columns.get("vocab_sizes"), sparse, allow_unsized=True)

  def scan(hashed, integer, dense):
    delim, header = read_header(inputs, delimiter)
    header = [h.strip() for h in header]
    _check_unique(header, inputs[0], columns)
    missing = [c for c in [*hashed, *integer, *dense] if c not in header]
    if missing:
      raise ValueError(f"columns {missing} are not in the header of '{inputs[0]}' {header}")
    multi = set(columns.get("multivalent_columns", ()))
    return scan_csv(
      inputs,
      delim,
      header,
      hashed={c: c in multi for c in hashed},
      integer=integer,
      dense=dense,
      separator=str(columns.get("separator", "|")),
    )

  return resolve_from_data(columns, given, scan)


# CsvParser's keyword arguments, as the CSV converter records them in its info.
_ROW_KEYS = (
  "label_column",
  "dense_columns",
  "sparse_columns",
  "multivalent_columns",
  "separator",
  "vocab_sizes",
  "integer_id_columns",
  "dense_transform",
  "label_threshold",
)


def _row_header(info: Mapping[str, Any]) -> list[str]:
  """The columns a CSV conversion of `info` read: its label, dense and sparse columns."""
  dense, sparse = info.get("dense_columns", ()), info.get("sparse_columns", ())
  return [info["label_column"], *dense, *sparse]


def _row_examples(
  info: Mapping[str, Any], schema: ExampleSchema | None, rows: Sequence[Mapping[str, Any]]
) -> ExampleBatch:
  """Raw rows ({column: value}) as the CSV conversion of `info` parsed its rows
  (convert/raw_rows.py); `schema` is not needed: the info names every column option."""
  del schema
  columns = {k: info[k] for k in _ROW_KEYS if k in info}
  header = _row_header(info)
  parser = CsvParser(header, **columns)
  multivalent = set(columns.get("multivalent_columns", ()))
  separators = [columns.get("separator", "|") if c in multivalent else None for c in header]
  hashed = set(columns.get("sparse_columns", ())) - set(columns.get("integer_id_columns", ()))
  for i, row in enumerate(rows):
    fields = [
      field_text(row.get(c), c, sep, i + 1, hashed=c in hashed)
      for c, sep in zip(header, separators)
    ]
    fields[0] = fields[0] or "0"  # the label
    parser.add_row(fields, ROWS, i + 1)
  return parser.take()


register_row_reader("sparsepipe.data.csv", RowReader(_row_header, _row_examples))

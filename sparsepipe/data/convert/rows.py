"""Raw rows -> examples, with the rules a dataset's converter applied (its manifest info).

A trained model must see the ids its training data had: the same hashing
(`sparsepipe.data.hashing`), the same integer-id columns, separators and
dense transforms. `examples_from_rows` reads them from the manifest's info
and schema and runs the converter's own parser on rows given as
{column: text}: CSV columns by name (sparsepipe.data.csv), or Criteo's
label, I1..I13, C1..C26. A missing label column is taken as 0 (rows to
score have none); any other missing column is empty. Values are Python
objects (row_values.py): None is a missing value, a list a multivalent
column's values. A column the converter never read (a typo, or a column
of the raw data the dataset left out) is an error naming it, unless it is
in `ignore_columns`: a misspelt column would otherwise be a silently
empty feature.
"""

from __future__ import annotations

from typing import Any, Collection, Iterable, Mapping, Sequence

from sparsepipe.data.criteo import convert as criteo
from sparsepipe.data.csv import convert as csv
from sparsepipe.data.example import ExampleBatch
from sparsepipe.data.convert.arguments import name_list
from sparsepipe.data.convert.row_values import ROWS, check_columns, field_text
from sparsepipe.data.convert.text_input import InputFormatError
from sparsepipe.data.schema import ExampleSchema

# CsvParser's keyword arguments, as the CSV converter records them in its info.
_CSV_KEYS = (
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


def _csv_header(info: Mapping[str, Any]) -> list[str]:
  dense, sparse = info.get("dense_columns", ()), info.get("sparse_columns", ())
  return [info["label_column"], *dense, *sparse]


def _csv_examples(info: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> ExampleBatch:
  columns = {k: info[k] for k in _CSV_KEYS if k in info}
  header = _csv_header(info)
  parser = csv.CsvParser(header, **columns)
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


def _criteo_examples(info: Mapping[str, Any], schema: ExampleSchema, rows) -> ExampleBatch:
  parser = criteo.CriteoParser(schema, empty_category=info.get("empty_category", "drop"))
  names = _CRITEO_COLUMNS
  for i, row in enumerate(rows):
    fields = [field_text(row.get(n), n, None, i + 1, n in _CRITEO_HASHED) for n in names]
    fields[0] = fields[0] or "0"  # the label
    for name, text in zip(names, fields):
      if any(c in text for c in "\t\r\n"):
        raise InputFormatError(
          ROWS, i + 1, f"column {name} value {text!r} holds a tab or line break"
        )
    parser.add_line("\t".join(fields), "\t", ROWS, i + 1)
  return parser.take()


_CRITEO_COLUMNS = ("label", *criteo.DENSE_NAMES, *criteo.SPARSE_NAMES)
_CRITEO_HASHED = frozenset(criteo.SPARSE_NAMES)


def row_columns(info: Mapping[str, Any]) -> tuple[str, ...]:
  """The columns the converter of `info` read: the label, dense and sparse columns.

  Raises:
    ValueError: the dataset was not made from raw rows by sparsepipe.data.csv
      or sparsepipe.data.criteo.
  """
  converter = info.get("converter")
  if converter == "sparsepipe.data.csv":
    return tuple(_csv_header(info))
  if converter == "sparsepipe.data.criteo":
    return _CRITEO_COLUMNS
  raise ValueError(
    f"the training data was made by {converter or 'a generator'!r}, not from raw rows by"
    " sparsepipe.data.csv or sparsepipe.data.criteo: score decoded examples with predict()"
  )


def examples_from_rows(
  info: Mapping[str, Any],
  schema: ExampleSchema,
  rows: Iterable[Mapping[str, Any]],
  *,
  ignore_columns: Collection[str] = (),
) -> ExampleBatch:
  """Columnar examples of `rows`, converted as the dataset of `info` and `schema` was.

  Args:
    info, schema: the dataset's manifest info and schema.
    rows: {column: value} mappings, any iterable of them, e.g. a csv.DictReader
      (see the module docstring).
    ignore_columns: columns the rows may carry that the converter did not
      read; any other such column is an error.

  Raises:
    ValueError: the dataset was not made by a converter of raw rows (e.g.
      generated), or a row is malformed, not a mapping or has a column the
      converter did not read (InputFormatError names row i as line i of
      "rows").
  """
  if isinstance(rows, Mapping) or not isinstance(rows, Iterable):
    raise TypeError(
      f"rows must be an iterable of {{column: value}} mappings, not a {type(rows).__name__}"
      + (": give one row as [row]" if isinstance(rows, Mapping) else "")
    )
  rows = list(rows)  # read twice below; a reader or generator is read once
  known = set(row_columns(info))
  ignore = set(name_list(ignore_columns, "ignore_columns"))
  label = info.get("label_column", "label")
  read = sorted((ignore & known) - {label})
  if read:
    raise ValueError(
      f"ignore_columns names column(s) {read} that the model reads: they cannot be left"
      " out (a missing value is None, or the column left out of the row)"
    )
  for i, row in enumerate(rows):
    if not isinstance(row, Mapping):
      raise InputFormatError(
        ROWS,
        i + 1,
        f"a {type(row).__name__}, not a {{column: text}} mapping (e.g. dict(zip(header, fields)))",
      )
    check_columns(row, known, ignore, i + 1)
  if label in ignore:  # as a row without its label (taken as 0): the model reads no label
    rows = [{c: v for c, v in row.items() if c != label} for row in rows]
  if info.get("converter") == "sparsepipe.data.csv":
    return _csv_examples(info, rows)
  return _criteo_examples(info, schema, rows)

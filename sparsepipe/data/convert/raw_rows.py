"""Raw rows -> examples, with the rules a dataset's converter applied (its manifest info).

A trained model must see the ids its training data had: the same hashing
(`sparsepipe.data.hashing`), the same integer-id columns, separators and
dense transforms. `examples_from_rows` reads them from the manifest's info
and schema and runs the converter's own parser on rows given as
{column: text}: each converter of raw rows registers its RowReader here
(`register_row_reader`: CSV columns by name in sparsepipe.data.csv,
Criteo's label, I1..I13, C1..C26 in sparsepipe.data.criteo; the package
sparsepipe.data imports both). A missing label column is taken as 0 (rows to
score have none); any other missing column is empty. Values are Python
objects (row_values.py): None is a missing value, a list a multivalent
column's values. A column the converter never read (a typo, or a column
of the raw data the dataset left out) is an error naming it, unless it is
in `ignore_columns`: a misspelt column would otherwise be a silently
empty feature.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Iterable, Mapping, NamedTuple, Sequence

from sparsepipe.data.example import ExampleBatch
from sparsepipe.data.convert.arguments import name_list
from sparsepipe.data.convert.row_values import ROWS, check_columns
from sparsepipe.data.convert.text_input import InputFormatError
from sparsepipe.data.schema import ExampleSchema


class RowReader(NamedTuple):
  """How one converter reads raw rows (see the module).

  columns(info): the columns the converter of `info` read, the label first.
  examples(info, schema, rows): the examples of `rows` ({column: value}
    mappings, each column among `columns(info)`), as the converter's own
    parser makes them.
  """

  columns: Callable[[Mapping[str, Any]], Sequence[str]]
  examples: Callable[[Mapping[str, Any], ExampleSchema, Sequence[Mapping[str, Any]]], ExampleBatch]


# {converter, as its manifest info names it: its RowReader}.
_READERS: dict[str, RowReader] = {}


def register_row_reader(converter: str, reader: RowReader) -> None:
  """Makes `reader` read the raw rows of datasets made by `converter` (info["converter"])."""
  _READERS[converter] = reader


def _reader(info: Mapping[str, Any]) -> RowReader:
  converter = info.get("converter")
  reader = _READERS.get(converter)
  if reader is None:
    raise ValueError(
      f"the training data was made by {converter or 'a generator'!r}, not from raw rows by"
      f" {' or '.join(sorted(_READERS))}: score decoded examples with predict()"
    )
  return reader


def row_columns(info: Mapping[str, Any]) -> tuple[str, ...]:
  """The columns the converter of `info` read: the label, dense and sparse columns.

  Raises:
    ValueError: the dataset was not made from raw rows by a converter that
      registered its RowReader (sparsepipe.data.csv or sparsepipe.data.criteo).
  """
  return tuple(_reader(info).columns(info))


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
  reader = _reader(info)
  known = set(reader.columns(info))
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
  return reader.examples(info, schema, rows)

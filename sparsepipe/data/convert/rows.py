"""Raw rows -> examples, with the rules a dataset's converter applied (its manifest info).

A trained model must see the ids its training data had: the same hashing
(`sparsepipe.data.hashing`), the same integer-id columns, separators and
dense transforms. `examples_from_rows` reads them from the manifest's info
and schema and runs the converter's own parser on rows given as
{column: text}: CSV columns by name (sparsepipe.data.csv), or Criteo's
label, I1..I13, C1..C26. A missing label column is taken as 0 (rows to
score have none); any other missing column is empty.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from sparsepipe.data.criteo import convert as criteo
from sparsepipe.data.csv import convert as csv
from sparsepipe.data.example import ExampleBatch
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


def _csv_examples(info: Mapping[str, Any], rows: Sequence[Mapping[str, str]]) -> ExampleBatch:
  columns = {k: info[k] for k in _CSV_KEYS if k in info}
  label = columns["label_column"]
  header = [label, *columns.get("dense_columns", ()), *columns.get("sparse_columns", ())]
  parser = csv.CsvParser(header, **columns)
  for i, row in enumerate(rows):
    values = {**row, label: row.get(label) or "0"}
    parser.add_row([str(values.get(c, "")) for c in header], "rows", i + 1)
  return parser.take()


def _criteo_examples(info: Mapping[str, Any], schema: ExampleSchema, rows) -> ExampleBatch:
  parser = criteo.CriteoParser(schema, empty_category=info.get("empty_category", "drop"))
  names = ("label", *criteo.DENSE_NAMES, *criteo.SPARSE_NAMES)
  for i, row in enumerate(rows):
    values = {**row, "label": row.get("label") or "0"}
    parser.add_line("\t".join(str(values.get(n, "")) for n in names), "\t", "rows", i + 1)
  return parser.take()


def examples_from_rows(
  info: Mapping[str, Any], schema: ExampleSchema, rows: Sequence[Mapping[str, str]]
) -> ExampleBatch:
  """Columnar examples of `rows`, converted as the dataset of `info` and `schema` was.

  Raises:
    ValueError: the dataset was not made by a converter of raw rows (e.g.
      generated), or a row is malformed or not a mapping (InputFormatError
      names row i as line i of "rows").
  """
  for i, row in enumerate(rows):
    if not isinstance(row, Mapping):
      raise InputFormatError(
        "rows",
        i + 1,
        f"a {type(row).__name__}, not a {{column: text}} mapping (e.g. dict(zip(header, fields)))",
      )
  converter = info.get("converter")
  if converter == "sparsepipe.data.csv":
    return _csv_examples(info, rows)
  if converter == "sparsepipe.data.criteo":
    return _criteo_examples(info, schema, rows)
  raise ValueError(
    f"the training data was made by {converter or 'a generator'!r}, not from raw rows by"
    " sparsepipe.data.csv or sparsepipe.data.criteo: score decoded examples with predict()"
  )

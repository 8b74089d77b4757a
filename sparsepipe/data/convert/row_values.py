"""A raw row's Python values as the text fields a converter reads.

Rows to score come from code, not files, so their values are Python
objects. Each becomes the field text the training data's converter would
have read, or an InputFormatError naming the row and column:
- None: a missing value, the same as an empty field (a dense 0.0, no id);
- a list, tuple or 1-D numpy array, for a multivalent column: its items
  are the ids' values, exactly as the field "a|b" split on the column's
  separator (None and "" items give no id, as empty pieces do); an item
  holding the separator is refused (no converted field has one), and so
  is a list for any other column;
- str as it is; an int, float or numpy number as str() writes it
  (1 -> "1", as in a CSV file); anything else (bytes, a dict, a set) is
  refused rather than hashed as its repr. A float for a hashed column
  (a category, not a dense value or an integer id) is refused too: its
  text need not be the file's (4.0 is "4.0", the file's "4" another id),
  as when a column of ints came out of pandas as floats.
"""

from __future__ import annotations

from typing import Any, Collection, Iterable, Mapping

import numpy as np

from sparsepipe.data.convert.text_input import InputFormatError

ROWS = "rows"  # how InputFormatError names the input: "'rows' line i" is row i (from 1)


def check_columns(
  row: Mapping[str, Any], known: Collection[str], ignore: Collection[str], line: int
) -> None:
  """InputFormatError naming the columns of `row` the converter never read.

  A typo'd column would otherwise be a silently missing value.
  """
  unknown = [c for c in row if c not in known and c not in ignore]
  if unknown:
    raise InputFormatError(
      ROWS,
      line,
      f"column(s) {unknown} are not among the training data's columns {sorted(known)}"
      " (correct the name, or pass ignore_columns= to leave a column out)",
    )


def field_text(
  value: Any, column: str, separator: str | None, line: int, hashed: bool = False
) -> str:
  """The field text of `value` (see the module); `separator` None: not a multivalent column;
  `hashed`: the column's text is hashed into ids."""
  if value is None:
    return ""
  if isinstance(value, (list, tuple, np.ndarray)):
    if separator is None:
      raise InputFormatError(
        ROWS,
        line,
        f"column {column} takes one value, not a {type(value).__name__}"
        " (only multivalent columns take lists)",
      )
    return separator.join(_items(value, column, separator, line, hashed))
  return _scalar_text(value, column, line, hashed)


def _items(values: Any, column: str, separator: str, line: int, hashed: bool) -> Iterable[str]:
  if isinstance(values, np.ndarray) and values.ndim != 1:
    raise InputFormatError(
      ROWS, line, f"column {column} is an array of shape {values.shape}, not a list of values"
    )
  for value in values:
    if value is None:
      continue
    text = _scalar_text(value, column, line, hashed)
    if separator in text:
      raise InputFormatError(
        ROWS,
        line,
        f"column {column} item {text!r} holds the column's separator {separator!r}"
        " (give each value as its own item)",
      )
    yield text


def _scalar_text(value: Any, column: str, line: int, hashed: bool) -> str:
  if isinstance(value, str):
    return value
  if hashed and isinstance(value, (float, np.floating)):
    raise InputFormatError(
      ROWS,
      line,
      f"column {column} value {value!r} is a float, but the column is hashed from its text"
      f" ({str(value)!r} is not the id of the training file's text, e.g. '4' for 4.0): give"
      " the text as the file has it, or an int",
    )
  if isinstance(value, (int, float, np.integer, np.floating)):
    return str(value)
  raise InputFormatError(
    ROWS,
    line,
    f"column {column} value {value!r} is a {type(value).__name__}, not text, a number,"
    " None or (for a multivalent column) a list",
  )

"""Lists of names given to the Python API, checked: a string is not a list.

The command line splits `--sparse_columns a,b` into a list; a Python caller
writing `sparse_columns="a,b"` (or one input path, or one delta, as a
string) would otherwise have it read character by character, and see an
error about columns 'a', ',' and 'b'.
"""

from __future__ import annotations

from typing import Any


def name_list(value: Any, what: str) -> list[str]:
  """`value` (a list, tuple or other iterable of names) as a list; TypeError for a
  string or bytes, naming `what` and the list that was meant."""
  if isinstance(value, (str, bytes, bytearray)):
    text = value.decode() if isinstance(value, (bytes, bytearray)) else value
    meant = [part.strip() for part in text.split(",")] if "," in text else [text]
    raise TypeError(f"{what} must be a list, not the string {text!r}: e.g. {what}={meant!r}")
  return list(value)


# The converters' column options that take a list of column names.
COLUMN_LISTS = ("dense_columns", "sparse_columns", "multivalent_columns", "integer_id_columns")


def checked_columns(columns: dict[str, Any]) -> dict[str, Any]:
  """A converter's column options with every list of names checked (name_list)."""
  return {k: name_list(v, k) if k in COLUMN_LISTS else v for k, v in columns.items()}

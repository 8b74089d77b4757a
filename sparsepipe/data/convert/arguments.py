"""A converter's arguments, checked: lists of names, and input files each read once.

Lists of names given to the Python API: a string is not a list. The command
line splits `--sparse_columns a,b` into a list; a Python caller writing
`sparse_columns="a,b"` (or one input path, or one delta, as a string) would
otherwise have it read character by character, and see an error about
columns 'a', ',' and 'b'.

Input files: a folder and a file in it, overlapping shell globs or a link to
a file given as well name one file twice, and a converter reads its inputs
in turn: its rows would be in the dataset twice (and in both splits). The
paths are compared resolved (os.path.realpath).
"""

from __future__ import annotations

import os
from typing import Any, Sequence


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


def check_each_once(paths: Sequence[str]) -> None:
  """ValueError naming the first input file given twice, by either of its paths."""
  seen: dict[str, str] = {}
  for path in paths:
    real = os.path.realpath(path)
    if real in seen:
      also = "" if seen[real] == path else f" (as '{seen[real]}')"
      raise ValueError(
        f"input '{path}' is given twice{also}: its rows would be converted twice; give each"
        " file once"
      )
    seen[real] = path


def check_text_files(paths: Sequence[str]) -> None:
  """Raises unless every path is a file, each given once (check_each_once): the text
  converters (CSV, Criteo) read files, not folders, and expand no glob."""
  name_list(paths, "inputs")
  for path in paths:
    if os.path.isdir(path):
      raise IsADirectoryError(f"input '{path}' is a folder: give the files in it")
    if not os.path.exists(path) and any(c in path for c in "*?["):
      raise FileNotFoundError(
        f"input '{path}' does not exist (a pattern is not expanded here: leave it unquoted for"
        " the shell to expand)"
      )
  check_each_once(paths)

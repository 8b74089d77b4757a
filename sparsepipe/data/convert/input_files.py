"""The converters' input files: each one read once, and what a text converter reads.

A folder and a file in it, overlapping shell globs or a link to a file given
as well name one file twice, and a converter reads its inputs in turn: its
rows would be in the dataset twice (and in both splits). The paths are
compared resolved (os.path.realpath).
"""

from __future__ import annotations

import os
from typing import Sequence

from sparsepipe.data.convert.arguments import name_list


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

"""Shared pieces of the text converters: opening files, delimiters, errors."""

from __future__ import annotations

import gzip
import io
import math
from typing import TextIO


class InputFormatError(ValueError):
  """A line of a text input that does not parse; names the file and line."""

  def __init__(self, path: str, line: int, reason: str):
    self.path = path
    self.line = line
    self.reason = reason
    super().__init__(f"'{path}' line {line}: {reason}")


def open_text(path: str) -> TextIO:
  """Opens a text file for reading; `.gz` files are decompressed on the fly."""
  if path.endswith(".gz"):
    return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
  return open(path, encoding="utf-8", newline="")


_NAMED = {"tab": "\t", "comma": ",", "semicolon": ";", "pipe": "|", "space": " "}


def resolve_delimiter(name: str, first_line: str) -> str:
  """'auto' picks a tab if the first line has one, else a comma; names or a character."""
  if name == "auto":
    return "\t" if "\t" in first_line else ","
  if name in _NAMED:
    return _NAMED[name]
  if name == "\\t":
    return "\t"
  if len(name) != 1:
    raise ValueError(f"delimiter {name!r} must be one character, 'auto' or one of {sorted(_NAMED)}")
  return name


def parse_float(text: str, path: str, line: int, column: str, default: float = 0.0) -> float:
  """A finite float from text; empty text gives `default`."""
  if not text:
    return default
  try:
    value = float(text)
  except ValueError:
    raise InputFormatError(path, line, f"column {column} value {text!r} is not a number") from None
  if value != value or value in (float("inf"), float("-inf")):
    raise InputFormatError(path, line, f"column {column} value {text!r} is not finite")
  return value


def log1p_clamped(x: float) -> float:
  """log(1 + max(x, 0)): the usual click-log dense normalisation."""
  return math.log1p(x) if x > 0 else 0.0

"""Shared pieces of the text converters: reading lines, numbers, delimiters, errors."""

from __future__ import annotations

import gzip
import math
from typing import Iterator, Mapping, Sequence
import zlib


class InputFormatError(ValueError):
  """A line of a text input that does not parse; names the file and line.

  `unit` names what `line` counts in other inputs: a Parquet file's "row"
  or "row group".
  """

  def __init__(self, path: str, line: int, reason: str, *, unit: str = "line"):
    self.path = path
    self.line = line
    self.reason = reason
    super().__init__(f"'{path}' {unit} {line}: {reason}")


# Values at or past this magnitude round to +-inf when stored as float32:
# the largest float32 plus half a unit in the last place.
FLOAT32_OVERFLOW = (2.0 - 2.0**-24) * 2.0**127


def read_lines(path: str) -> Iterator[str]:
  """The lines of a UTF-8 text file (`.gz` decompressed), ends kept, a leading BOM dropped.

  Lines are decoded one at a time, so a byte that is not UTF-8 is reported
  at its own line; a truncated or damaged `.gz` stream is reported after
  the last line it gave. Both raise InputFormatError.
  """
  opener = gzip.open if path.endswith(".gz") else open
  line_no = 0
  with opener(path, "rb") as f:
    try:
      for raw in f:
        line_no += 1
        try:
          line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
          raise InputFormatError(
            path,
            line_no,
            f"byte {e.start + 1} ({raw[e.start : e.start + 1]!r}) is not UTF-8"
            " text; convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)",
          ) from None
        yield line[1:] if line_no == 1 and line.startswith("\ufeff") else line
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
      raise InputFormatError(
        path, line_no + 1, f"the gzip data is truncated or damaged after line {line_no} ({e})"
      ) from None


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


def parse_float(
  text: str, path: str, line: int, column: str, default: float = 0.0, *, float32: bool = True
) -> float:
  """A finite float from text; empty text gives `default`.

  With `float32` (for values stored as they are) the value must also be
  finite as a float32: 1e39 would be stored as inf.
  """
  if not text:
    return default
  try:
    value = float(text)
  except ValueError:
    raise InputFormatError(path, line, f"column {column} value {text!r} is not a number") from None
  if value != value or value in (math.inf, -math.inf):
    raise InputFormatError(path, line, f"column {column} value {text!r} is not finite")
  if float32 and abs(value) >= FLOAT32_OVERFLOW:
    raise InputFormatError(
      path,
      line,
      f"column {column} value {text!r} is not finite as float32 (magnitude at most 3.4028235e+38)",
    )
  return value


def check_label(
  label: float, text: str, path: str, line: int, column: str, hint: str = ""
) -> float:
  """The label if it lies in [0, 1] (what sigmoid cross-entropy expects), else InputFormatError."""
  if not 0.0 <= label <= 1.0:
    raise InputFormatError(
      path, line, f"label column {column} value {text!r} is outside [0, 1]{hint}"
    )
  return label


def parse_size(text: str | int, what: str) -> int:
  """A positive integer count (a vocabulary size) from text; `what` names it in errors."""
  try:
    value = int(str(text).strip())
  except ValueError:
    raise ValueError(f"{what}: {str(text)!r} is not an integer (write 1000000, not 1e6)") from None
  if value < 1:
    raise ValueError(f"{what}: {value} must be >= 1")
  return value


# Transforms of dense columns the column converters (CSV, Parquet) offer.
DENSE_TRANSFORMS = ("none", "log1p")
# Appended to a label-range error of a column converter.
THRESHOLD_HINT = (
  "; map such values to 0/1 with --label_threshold T (label_threshold=T: 1 if value >= T)"
)


def checked_threshold(threshold: float | None) -> float | None:
  """The label threshold, a finite number (or None): NaN made every label 0 and
  -inf every label 1, without a word."""
  if threshold is not None and not math.isfinite(threshold):
    raise ValueError(f"label_threshold={threshold} must be a finite number")
  return threshold


def log1p_clamped(x: float) -> float:
  """log(1 + max(x, 0)): the usual click-log dense normalisation."""
  return math.log1p(x) if x > 0 else 0.0


def column_transforms(
  dense_transform: str | Mapping[str, str], dense_columns: Sequence[str]
) -> dict[str, str]:
  """{column: "none" | "log1p"} from one transform for all or a mapping (as the manifest
  of an `auto` conversion records it)."""
  if isinstance(dense_transform, Mapping):
    missing = [c for c in dense_columns if c not in dense_transform]
    if missing:
      raise ValueError(f"dense_transform names no transform for dense columns {missing}")
    out = {c: dense_transform[c] for c in dense_columns}
  else:
    out = dict.fromkeys(dense_columns, dense_transform)
  given = [dense_transform] if isinstance(dense_transform, str) else []
  for value in dict.fromkeys([*out.values()] or given):
    if value not in DENSE_TRANSFORMS:
      raise ValueError(
        f"dense_transform={value!r} is not one of {DENSE_TRANSFORMS}"
        + (" ('auto' is chosen from the data by convert_csv)" if value == "auto" else "")
      )
  return out

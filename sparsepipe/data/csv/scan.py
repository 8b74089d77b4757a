"""The CSV converter's first pass: what sizing vocabularies and `--dense_transform auto` need.

Run only when a sparse column has no `--vocab_sizes` entry or a dense
column's transform is `auto`. It reads the rows as the conversion will and
collects, per column asked for: the distinct values of a hashed column
(pieces of a multivalent one), the largest integer id, and the raw dense
values' statistics. Rows the conversion will refuse are passed over here:
the second pass reports them, with their file and line.
"""

from __future__ import annotations

import csv as _csv
import math
from typing import Mapping, Sequence

from sparsepipe.data.convert.dense_stats import DenseStats
from sparsepipe.data.convert.from_data import ColumnScan
from sparsepipe.data.convert.text_input import read_lines
from sparsepipe.data.convert.vocab_sizing import DistinctCounter

_CHUNK = 4096


def _number(text: str) -> float:
  """The value the conversion stores before its transform (empty or bad -> 0.0)."""
  try:
    x = float(text) if text else 0.0
  except ValueError:
    return 0.0
  return x if math.isfinite(x) else 0.0


def _integer(text: str) -> int:
  try:
    return int(text)
  except ValueError:
    return -1


def scan_csv(
  paths: Sequence[str],
  delimiter: str,
  header: Sequence[str],
  *,
  hashed: Mapping[str, bool],
  integer: Sequence[str],
  dense: Sequence[str],
  separator: str,
) -> ColumnScan:
  """Reads `paths` once. `hashed`: {column: multivalent} to count; `integer`: columns of
  ids whose largest to find; `dense`: columns whose raw statistics to take."""
  width = len(header)
  hashed_at = [(c, header.index(c), multi) for c, multi in hashed.items()]
  integer_at = [(c, header.index(c)) for c in integer]
  dense_at = [header.index(c) for c in dense]
  scan = ColumnScan(
    {c: DistinctCounter() for c in hashed}, dict.fromkeys(integer, -1), DenseStats(dense)
  )
  pieces: dict[str, list[str]] = {c: [] for c in hashed}
  rows: list[list[float]] = []

  def flush() -> None:
    for c, values in pieces.items():
      scan.distinct[c].add(values)
      values.clear()
    if dense_at:
      scan.raw_dense.add(rows)
    rows.clear()

  for path in paths:
    reader = _csv.reader(read_lines(path), delimiter=delimiter)
    next(reader, None)  # the header
    try:
      for row in reader:
        if len(row) != width:
          continue  # blank or malformed: the conversion skips or reports it
        for c, j, multi in hashed_at:
          value = row[j]
          if multi:
            pieces[c].extend(p for p in value.split(separator) if p)
          elif value:
            pieces[c].append(value)
        for c, j in integer_at:
          scan.largest_id[c] = max(scan.largest_id[c], _integer(row[j]))
        if dense_at:
          rows.append([_number(row[j]) for j in dense_at])
        if len(rows) >= _CHUNK or sum(map(len, pieces.values())) >= _CHUNK * 8:
          flush()
    except _csv.Error:
      pass  # an unclosed quote: the conversion names its line
  flush()
  return scan

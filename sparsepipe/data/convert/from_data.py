"""The column converters' options the data decides: vocabulary sizes and `auto` transforms.

The CSV and Parquet converters take, per sparse column, a vocabulary size
or none (size it from the data: vocab_sizing.py), and a dense transform
that may be "auto" (dense_stats.py). When the data decides any of them a
first pass over the input (the converter's `ColumnScan`) collects what is
needed; `resolve_from_data` turns it into the explicit options the parser
takes and the manifest records.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from sparsepipe.data.convert.dense_stats import DenseStats, resolve_transforms
from sparsepipe.data.convert.vocab_sizing import DistinctCounter
from sparsepipe.data.convert.vocab_sizing import data_vocab_size, integer_vocab_size


@dataclasses.dataclass
class ColumnScan:
  """What a first pass found: distinct counters of hashed columns, the largest id of
  integer-id columns, the raw (untransformed) values' statistics of dense columns."""

  distinct: dict[str, DistinctCounter]
  largest_id: dict[str, int]
  raw_dense: DenseStats


# scan(hashed columns, integer-id columns, dense columns) -> ColumnScan
ScanFn = Callable[[Sequence[str], Sequence[str], Sequence[str]], ColumnScan]


def resolve_from_data(
  columns: Mapping[str, Any], given: Mapping[str, int], scan: ScanFn
) -> dict[str, Any]:
  """`columns` with vocab_sizes ({column: size}), vocab_sizing ({column: how}) and
  dense_transform ({column: transform}) made explicit.

  `given`: the sizes the user gave. `scan` runs only if a column is unsized
  or the transform is "auto" (the default).
  """
  columns = dict(columns)
  sparse = list(columns.get("sparse_columns", ()))
  dense = list(columns.get("dense_columns", ()))
  integer = set(columns.get("integer_id_columns", ()))
  option = columns.get("dense_transform", "auto")
  unsized = [c for c in sparse if c not in given]
  auto = option == "auto" and bool(dense)
  found = None
  if unsized or auto:
    found = scan(
      [c for c in unsized if c not in integer],
      [c for c in unsized if c in integer],
      dense if auto else [],
    )
  sizing: dict[str, dict[str, Any]] = {}
  for c in sparse:
    if c in given:
      sizing[c] = {"vocab_size": int(given[c]), "from": "flag"}
    elif c in integer:
      largest = max(found.largest_id[c], 0)
      size = integer_vocab_size(c, largest)
      sizing[c] = {"vocab_size": size, "from": "ids", "largest_id": largest}
    else:
      count = found.distinct[c].count
      sizing[c] = {"vocab_size": data_vocab_size(count), "from": "data", "distinct": count}
  columns["vocab_sizes"] = {c: sizing[c]["vocab_size"] for c in sparse}
  columns["vocab_sizing"] = sizing
  if dense:
    columns["dense_transform"] = resolve_transforms(
      option, dense, found.raw_dense if auto else None
    )
  else:
    columns["dense_transform"] = "none" if option == "auto" else option
  return columns

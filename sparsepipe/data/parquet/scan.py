"""The Parquet converter's first pass: what sizing vocabularies and `auto` transforms need.

Reads only the columns asked for, a record batch at a time (as the
conversion does), and collects the distinct non-empty values of hashed
columns (integers as their decimal text, as they are hashed), the largest
id of integer-id columns and the raw dense values' statistics (null as
0.0). Values the conversion refuses are its to report, with file and row.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparsepipe.data.convert.dense_stats import DenseStats
from sparsepipe.data.convert.from_data import ColumnScan
from sparsepipe.data.convert.vocab_sizing import DistinctCounter


def _items(column: pa.Array) -> pa.Array:
  """A list column's items, or a scalar column's values; dictionaries decoded."""
  if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
    column = column.flatten()
  elif pa.types.is_fixed_size_list(column.type):
    column = column.flatten()
  if pa.types.is_dictionary(column.type):
    column = column.dictionary_decode()
  return column


def scan_parquet(
  record_batches: Callable[[Sequence[str]], Iterable[pa.RecordBatch]],
  hashed: Sequence[str],
  integer: Sequence[str],
  dense: Sequence[str],
) -> ColumnScan:
  """Reads the columns once (see the module docstring); `record_batches(columns)`
  gives the input's record batches of those columns, as the conversion reads them."""
  scan = ColumnScan(
    {c: DistinctCounter() for c in hashed}, dict.fromkeys(integer, -1), DenseStats(dense)
  )
  for batch in record_batches(list(dict.fromkeys([*hashed, *integer, *dense]))):
    for c in hashed:
      values = pc.unique(_items(batch.column(c)).drop_null())
      try:
        text = [str(v) for v in values.to_pylist()]
      except UnicodeDecodeError:
        continue  # text that is not UTF-8: the conversion names its file, row and column
      scan.distinct[c].add(v for v in text if v)
    for c in integer:
      top = pc.max(_items(batch.column(c))).as_py()
      if top is not None:
        scan.largest_id[c] = max(scan.largest_id[c], int(top))
    if dense:
      x = np.stack(
        [
          pc.fill_null(batch.column(c).cast(pa.float64(), safe=False), 0.0).to_numpy(
            zero_copy_only=False
          )
          for c in dense
        ],
        axis=1,
      )
      scan.raw_dense.add(np.where(np.isfinite(x), x, 0.0))
  return scan

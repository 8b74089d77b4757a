"""Vocabulary sizes from the data: a feature's distinct values with headroom.

A converter given no vocabulary size for a sparse column counts the
column's distinct values in a first pass over the input and sizes its
table as

    vocab = min(VOCAB_CAP, next power of two >= HEADROOM * distinct)

(at least MIN_VOCAB). Hashed values are spread over the whole table with
`id = h % vocab` (sparsepipe.data.hashing), so the headroom bounds the
collisions among the values seen: of n values hashed into 4n to 8n rows
about 1 - exp(-n / rows), 12% to 22%, share their id with another value
(1,000,000 rows made that 0.4% for 3,706 movies, at 250x the memory).
Values first seen after conversion hash into the same table, and a
smaller table means more collisions for them too. That is the usual trade-off of a
hashed vocabulary; give `--vocab_sizes` for a larger table (e.g. for
data that will grow), or one that matches an existing model's tables.

Integer-id columns are not hashed: their values are the ids, so the table
must hold the largest one. Their size is the next power of two above it,
not capped (ids past the cap must not be dropped) but within the schema's
MAX_VOCAB_SIZE.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np

from sparsepipe.data.convert.text_input import parse_size
from sparsepipe.data.schema import MAX_VOCAB_SIZE

HEADROOM = 4
VOCAB_CAP = 1 << 20
MIN_VOCAB = 8
_MERGE_EVERY = 1 << 16


def next_power_of_two(n: int) -> int:
  """The smallest power of two >= n (1 for n <= 1)."""
  return 1 << max(int(n) - 1, 0).bit_length()


def data_vocab_size(distinct: int, *, reserved: int = 0) -> int:
  """The table size for a hashed column of `distinct` values (module docstring).

  `reserved` low ids (e.g. Criteo's id 0 for an empty field) are added to
  the values before sizing.
  """
  size = next_power_of_two(HEADROOM * (int(distinct) + reserved))
  return max(MIN_VOCAB, min(VOCAB_CAP, size))


def integer_vocab_size(name: str, largest_id: int) -> int:
  """The table size for an integer-id column whose largest id is `largest_id`."""
  size = max(MIN_VOCAB, next_power_of_two(int(largest_id) + 1))
  if size > MAX_VOCAB_SIZE:
    raise ValueError(
      f"integer id column '{name}': its largest id {largest_id} needs a vocabulary above"
      f" {MAX_VOCAB_SIZE}; map the ids to a smaller range or hash the column"
    )
  return size


class DistinctCounter:
  """Counts the distinct strings of one column, exactly, up to a limit.

  Values are kept as 64-bit hashes (Python's `hash`, which is stable within
  one process: enough for counting) in a sorted numpy array, 8 bytes per
  distinct value, merged in chunks. Past `limit` distinct values the
  column's table is at the cap anyway, so counting stops (`saturated`).
  """

  def __init__(self, limit: int = VOCAB_CAP // HEADROOM):
    self.limit = limit
    self._seen = np.zeros((0,), np.int64)
    self._pending: set[str] = set()
    self.saturated = False

  def add(self, values: Iterable[str]) -> None:
    if self.saturated:
      return
    self._pending.update(values)
    if len(self._pending) >= _MERGE_EVERY:
      self._merge()

  def _merge(self) -> None:
    if self._pending:
      new = np.fromiter((hash(v) for v in self._pending), np.int64, len(self._pending))
      self._seen = np.union1d(self._seen, new)
      self._pending.clear()
    if len(self._seen) > self.limit:
      self.saturated = True
      self._seen = np.zeros((0,), np.int64)

  @property
  def count(self) -> int:
    """Distinct values seen (a number above `limit` once saturated)."""
    self._merge()
    return self.limit + 1 if self.saturated else len(self._seen)


def sizing_lines(sizing: Mapping[str, Mapping[str, int | str]]) -> list[str]:
  """The conversion's lines on how each feature's vocabulary was chosen (none if all
  were given).

  `sizing`: {feature: {"vocab_size": n, "from": "data" | "flag" | "ids",
  "distinct": count (data), "largest_id": id (ids)}}, as in the manifest's
  info["vocab_sizing"].
  """
  lines = []
  for name, s in sizing.items():
    size = int(s["vocab_size"])
    if s["from"] == "data":
      count = int(s["distinct"])
      seen = f"over {count - 1:,}" if count > VOCAB_CAP // HEADROOM else f"{count:,}"
      capped = ", the cap" if size == VOCAB_CAP and count > VOCAB_CAP // HEADROOM else ""
      lines.append(f"  feature '{name}': {seen} distinct values -> vocab {size:,}{capped}")
    elif s["from"] == "ids":
      lines.append(
        f"  feature '{name}': integer ids up to {int(s['largest_id']):,} -> vocab {size:,}"
      )
    else:
      lines.append(f"  feature '{name}': vocab {size:,} (--vocab_sizes)")
  if all(s["from"] == "flag" for s in sizing.values()):
    return []
  lines.insert(
    0,
    f"vocabulary sizes from the data ({HEADROOM}x the distinct values, rounded up to a power"
    f" of two, at most {VOCAB_CAP:,}; --vocab_sizes to choose them):",
  )
  return lines


def parse_vocab_sizes(
  entries: Sequence[str] | Mapping[str, int] | int | None,
  columns: Sequence[str],
  *,
  allow_unsized: bool = False,
) -> dict[str, int]:
  """`["1000", "user_id=6041"]` (or {"user_id": 6041}, or 1000) -> {column: size} for
  every sparse column.

  With `allow_unsized`, a column without an entry (and no default N) is left
  out: the converter sizes it from the data (data_vocab_size, integer_vocab_size).
  """
  if isinstance(entries, int):
    entries = [str(entries)]
  elif isinstance(entries, Mapping):
    entries = [f"{name}={size}" for name, size in entries.items()]
  default, sizes = None, {}
  for entry in entries or ():
    entry = str(entry).strip()
    if "=" in entry:
      name, value = entry.split("=", 1)
      if name not in columns:
        raise ValueError(
          f"vocab size given for '{name}', which is not a sparse column {list(columns)}"
        )
      if name in sizes:
        raise ValueError(f"vocab_sizes (--vocab_sizes) gives '{name}' twice: '{entry}'")
      sizes[name] = parse_size(value, f"vocab_sizes (--vocab_sizes) entry '{entry}'")
    elif default is not None:
      raise ValueError(
        f"vocab_sizes (--vocab_sizes) gives two sizes for every column ({default} and"
        f" '{entry}'): give one N, and column=N for the others"
      )
    else:
      default = parse_size(entry, "vocab_sizes (--vocab_sizes)")
  for name in columns:
    if name not in sizes:
      if default is None and allow_unsized:
        continue
      if default is None:
        raise ValueError(f"no vocab size for sparse column '{name}' (give N or {name}=N)")
      sizes[name] = default
  return sizes

"""Converts Criteo click logs (TSV) into a sharded ArrayRecord dataset.

Command line: `python -m sparsepipe.data.criteo` (criteo.py).

Each line: label, 13 integer columns I1..I13, 26 hexadecimal categorical
columns C1..C26 (40 fields; any field may be empty). Tab-separated in the
public logs; `--delimiter auto` (default) takes a comma instead when the
first line has no tab, and `--header auto` skips a first line made of
column names (e.g. `label,I1,...,C26`: every field of the label and integer
columns a name, none empty or a number); any other first line is data, so a
damaged first line is an error like any other. `.gz` inputs are read
directly (UTF-8).

Transforms (the manifest records them):
- label: the number as float32; it must lie in [0, 1].
- dense: x -> log(1 + max(x, 0)) as float32; an empty field counts as 0
  (so it becomes 0.0), negative values (e.g. I2 = -1) also become 0.0.
- categorical: the string is hashed with a stable 64-bit BLAKE2b hash
  (sparsepipe.data.hashing) into the feature's vocabulary:
  id = h % vocab (`--empty_category drop`, the default: an empty field gives
  the example no id for that feature, an empty row), or id = 1 + h % (vocab-1)
  with id 0 reserved for "empty" (`--empty_category reserve`: an empty field
  gives the single id 0). Without `--vocab_sizes` each feature's vocabulary
  is sized from its distinct values (sparsepipe.data.convert.vocab_sizing),
  counted in a first pass over the input.
Blank lines are skipped; any other malformed line raises InputFormatError
naming the file and line.
"""

from __future__ import annotations

import re
from typing import Any, Iterator, Mapping, Sequence

from sparsepipe.data.example import ExampleBatch, ExampleBatchBuilder
from sparsepipe.data.hashing import CategoryHasher
from sparsepipe.data.manifest import Manifest
from sparsepipe.data.convert.arguments import check_text_files
from sparsepipe.data.progress import Progress
from sparsepipe.data.schema import ExampleSchema, SparseFeatureSchema
from sparsepipe.data.convert.text_input import (
  InputFormatError,
  check_label,
  log1p_clamped,
  parse_float,
)
from sparsepipe.data.convert.text_input import parse_size, read_lines, resolve_delimiter
from sparsepipe.data.writer import DEFAULT_EXAMPLES_PER_RECORD, DEFAULT_MAX_RECORDS_PER_SHARD
from sparsepipe.data.convert.outputs import HASH_RULE
from sparsepipe.data.writer import write_batches
from sparsepipe.data.convert.dense_stats import DenseStats
from sparsepipe.data.convert.vocab_sizing import DistinctCounter, data_vocab_size
from sparsepipe.data.convert.row_values import ROWS, field_text
from sparsepipe.data.convert.raw_rows import RowReader, register_row_reader

NUM_DENSE = 13
NUM_SPARSE = 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_SPARSE
DENSE_NAMES = tuple(f"I{i + 1}" for i in range(NUM_DENSE))
SPARSE_NAMES = tuple(f"C{i + 1}" for i in range(NUM_SPARSE))
EMPTY_CATEGORY_MODES = ("drop", "reserve")
_CHUNK = 4096
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\- ]*")


def criteo_schema(vocab_sizes: int | str | Sequence[int | str]) -> ExampleSchema:
  """13 dense features I1..I13 and 26 unweighted sparse features C1..C26."""
  if isinstance(vocab_sizes, (int, str)):
    vocab_sizes = [vocab_sizes]
  sizes = [parse_size(v, "vocab_sizes (--vocab_sizes)") for v in vocab_sizes]
  if len(sizes) == 1:
    sizes = sizes * NUM_SPARSE
  if len(sizes) != NUM_SPARSE:
    raise ValueError(f"vocab_sizes has {len(sizes)} entries, expected 1 or {NUM_SPARSE}")
  return ExampleSchema(
    num_dense=NUM_DENSE,
    sparse=tuple(SparseFeatureSchema(n, s) for n, s in zip(SPARSE_NAMES, sizes)),
    dense_names=DENSE_NAMES,
  )


class CriteoParser:
  """Parses Criteo lines into columnar batches for one schema."""

  def __init__(self, schema: ExampleSchema, *, empty_category: str = "drop"):
    if empty_category not in EMPTY_CATEGORY_MODES:
      raise ValueError(f"empty_category={empty_category!r} is not one of {EMPTY_CATEGORY_MODES}")
    reserve = empty_category == "reserve"
    for f in schema.sparse:
      if reserve and f.vocab_size < 2:
        raise ValueError(
          f"feature '{f.name}': vocab_size={f.vocab_size} leaves no room after reserving id 0"
        )
    self.schema = schema
    self._empty_row = [0] if reserve else []
    self._hashers = [CategoryHasher(f.vocab_size, num_reserved=int(reserve)) for f in schema.sparse]
    self._builder = ExampleBatchBuilder(schema)
    self.dense_stats = DenseStats(DENSE_NAMES)
    self._missing = [0] * NUM_DENSE

  def add_line(self, line: str, delimiter: str, path: str, line_no: int) -> bool:
    """Parses one line into the pending batch; False for a blank line."""
    line = line.rstrip("\r\n")
    if not line.strip():
      return False
    fields = line.split(delimiter)
    if len(fields) != NUM_FIELDS:
      raise InputFormatError(path, line_no, f"expected {NUM_FIELDS} fields, got {len(fields)}")
    if not fields[0]:
      raise InputFormatError(path, line_no, "the label field is empty")
    label = parse_float(fields[0], path, line_no, "label")
    check_label(label, fields[0], path, line_no, "label")
    dense = [
      log1p_clamped(parse_float(fields[1 + j], path, line_no, DENSE_NAMES[j], float32=False))
      for j in range(NUM_DENSE)
    ]
    for j in range(NUM_DENSE):
      if not fields[1 + j]:
        self._missing[j] += 1
    empty = self._empty_row
    ids = [[h(c)] if c else empty for h, c in zip(self._hashers, fields[1 + NUM_DENSE :])]
    self._builder.add(label, dense, ids)
    return True

  def __len__(self) -> int:
    return len(self._builder)

  def take(self) -> ExampleBatch:
    """The pending examples; their dense values are added to `dense_stats`."""
    batch = self._builder.take()
    self.dense_stats.add(batch.dense, self._missing)
    self._missing = [0] * NUM_DENSE
    return batch


def _data_lines(
  paths: Sequence[str], delimiter: str, header: str
) -> Iterator[tuple[str, int, str, str]]:
  """(path, line number, line, delimiter) of every line that is not a header."""
  if header not in ("auto", "yes", "no"):
    raise ValueError(f"header={header!r} is not one of ('auto', 'yes', 'no')")
  for path in paths:
    delim = None
    for line_no, line in enumerate(read_lines(path), start=1):
      if line_no == 1:
        delim = resolve_delimiter(delimiter, line)
        if header == "yes" or (header == "auto" and is_header(line, delim)):
          continue
      yield path, line_no, line, delim


def count_categories(
  paths: Sequence[str], *, delimiter: str = "auto", header: str = "auto"
) -> list[int]:
  """The distinct non-empty values of C1..C26 (a first pass, for data-sized
  vocabularies); malformed lines are passed over (the conversion reports them)."""
  counters = [DistinctCounter() for _ in SPARSE_NAMES]
  pending: list[list[str]] = [[] for _ in SPARSE_NAMES]
  for n, (_, _, line, delim) in enumerate(_data_lines(paths, delimiter, header), start=1):
    fields = line.rstrip("\r\n").split(delim)
    if len(fields) == NUM_FIELDS:
      for values, c in zip(pending, fields[1 + NUM_DENSE :]):
        if c:
          values.append(c)
    if n % _CHUNK == 0:
      for counter, values in zip(counters, pending):
        counter.add(values)
        values.clear()
  for counter, values in zip(counters, pending):
    counter.add(values)
  return [counter.count for counter in counters]


def read_criteo(
  paths: Sequence[str],
  schema: ExampleSchema,
  *,
  empty_category: str = "drop",
  delimiter: str = "auto",
  header: str = "auto",
  chunk_size: int = _CHUNK,
  parser: CriteoParser | None = None,
) -> Iterator[ExampleBatch]:
  """Yields columnar batches of the examples in `paths`, in file order (parsed by
  `parser` if given, e.g. to read its dense statistics after)."""
  if parser is None:
    parser = CriteoParser(schema, empty_category=empty_category)
  for path, line_no, line, delim in _data_lines(paths, delimiter, header):
    parser.add_line(line, delim, path, line_no)
    if len(parser) >= chunk_size:
      yield parser.take()
  if len(parser):
    yield parser.take()


def is_header(line: str, delimiter: str) -> bool:
  """Whether a line names the columns: the label and integer fields are all names.

  Data has numbers (or empty fields) there, so a data line with a damaged
  label is not mistaken for a header.
  """
  fields = line.rstrip("\r\n").split(delimiter)
  return len(fields) == NUM_FIELDS and all(
    _NAME.fullmatch(f.strip()) and not _is_number(f) for f in fields[: 1 + NUM_DENSE]
  )


def _is_number(text: str) -> bool:
  try:
    float(text)
    return True
  except ValueError:
    return False


def convert_criteo(
  inputs: Sequence[str],
  output_dir: str,
  *,
  vocab_sizes: int | Sequence[int] | None = None,
  empty_category: str = "drop",
  delimiter: str = "auto",
  header: str = "auto",
  examples_per_record: int = DEFAULT_EXAMPLES_PER_RECORD,
  max_records_per_shard: int = DEFAULT_MAX_RECORDS_PER_SHARD,
  overwrite: bool = False,
  show_progress: bool = False,
  eval_output: str | None = None,
  eval_fraction: float = 0.0,
  split_seed: int = 0,
) -> Manifest:
  """Converts Criteo files into a dataset; returns its manifest.

  `vocab_sizes`: one size for all 26 features, or 26; None (or empty): each
  feature's from its distinct values, counted in a first pass over the
  inputs (sparsepipe.data.convert.vocab_sizing; info["vocab_sizing"] records
  the counts).

  With `eval_output`, a deterministic `eval_fraction` of the examples goes
  to a second dataset there instead (see sparsepipe.data.split); the
  manifest returned is the train split's.
  """
  check_text_files(inputs)
  if vocab_sizes is None or (not isinstance(vocab_sizes, (int, str)) and not len(vocab_sizes)):
    counts = count_categories(inputs, delimiter=delimiter, header=header)
    reserved = int(empty_category == "reserve")
    vocab_sizes = [data_vocab_size(n, reserved=reserved) for n in counts]
    sizing = {
      name: {"vocab_size": size, "from": "data", "distinct": n}
      for name, size, n in zip(SPARSE_NAMES, vocab_sizes, counts)
    }
  else:
    sizing = None
  schema = criteo_schema(vocab_sizes)
  if sizing is None:
    sizing = {f.name: {"vocab_size": f.vocab_size, "from": "flag"} for f in schema.sparse}
  info = {
    "converter": "sparsepipe.data.criteo",
    "inputs": list(inputs),
    "dense_transform": "log(1 + max(x, 0)); empty -> 0",
    "hash": HASH_RULE,
    "empty_category": empty_category,
    "vocab_sizing": sizing,
  }
  parser = CriteoParser(schema, empty_category=empty_category)
  transforms = dict.fromkeys(DENSE_NAMES, "log1p")
  return write_batches(
    output_dir,
    schema,
    read_criteo(inputs, schema, delimiter=delimiter, header=header, parser=parser),
    final_info=lambda: {"dense_stats": parser.dense_stats.to_dict(transforms)},
    examples_per_record=examples_per_record,
    max_records_per_shard=max_records_per_shard,
    overwrite=overwrite,
    info=info,
    progress=Progress("criteo") if show_progress else None,
    eval_output=eval_output,
    eval_fraction=eval_fraction,
    split_seed=split_seed,
  )


_ROW_COLUMNS = ("label", *DENSE_NAMES, *SPARSE_NAMES)
_ROW_HASHED = frozenset(SPARSE_NAMES)


def _row_columns(info: Mapping[str, Any]) -> tuple[str, ...]:
  """The columns every Criteo conversion read: label, I1..I13, C1..C26."""
  del info
  return _ROW_COLUMNS


def _row_examples(
  info: Mapping[str, Any], schema: ExampleSchema, rows: Sequence[Mapping[str, Any]]
) -> ExampleBatch:
  """Raw rows ({column: value}) as the Criteo conversion of `info` and `schema` parsed
  its lines (convert/raw_rows.py)."""
  parser = CriteoParser(schema, empty_category=info.get("empty_category", "drop"))
  for i, row in enumerate(rows):
    fields = [field_text(row.get(n), n, None, i + 1, n in _ROW_HASHED) for n in _ROW_COLUMNS]
    fields[0] = fields[0] or "0"  # the label
    for name, text in zip(_ROW_COLUMNS, fields):
      if any(c in text for c in "\t\r\n"):
        raise InputFormatError(
          ROWS, i + 1, f"column {name} value {text!r} holds a tab or line break"
        )
    parser.add_line("\t".join(fields), "\t", ROWS, i + 1)
  return parser.take()


register_row_reader("sparsepipe.data.criteo", RowReader(_row_columns, _row_examples))

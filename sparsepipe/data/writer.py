"""Writes examples as a sharded ArrayRecord dataset with a manifest.

Examples are packed `examples_per_record` (R) at a time into columnar
records (see codec.py); only the very last record of a dataset may hold
fewer. Shards hold at most `max_records_per_shard` records: ArrayRecord's
random-read cost grows with records per file, so many mid-sized shards (and
packed records) read fastest.

Every record is its own ArrayRecord chunk (group_size 1, for random
access), compressed on its own: records of up to
`SMALL_RECORD_EXAMPLES` examples with snappy, larger ones with zstd
(ArrayRecord's default): zstd's per-chunk cost dominates small chunks. For
records of one criteo-config example snappy's files are 5% larger and
ArrayRecord writes them in 0.3x the CPU time (benchmarks/synthetic.py);
a record of one example of 26 features of 1..20 ids reads in 0.8x
(benchmarks/loader.py). Packed records keep zstd's smaller files. Readers
need no option: each chunk names its compression.

The dataset is written into a temporary directory beside the output
(`.NAME.tmp-HOST-PID`) and moved into place only when complete, so a failed
conversion leaves the output as it was: with `overwrite`, the old dataset
stays intact until the new one is finished (then the directories are
swapped by renames); a train and an eval split (`written_together`) are
both finished before either is moved into place. What a writer killed
outright (SIGKILL, out of memory) leaves, its temporary directory or,
between the renames, the old dataset under its .old name, the next writer
of the same output removes or puts back (core.work_directories). The
manifest records, per sparse feature, the most and the mean ids per example
(`info["ids_per_example"]`), which seed the COO buffer limits of a training
config.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from sparsepipe.core.saved_work import a_kind
from sparsepipe.core.saved_work import refuse_symbolic_link
from sparsepipe.core.saved_work import saved_work
from sparsepipe.core.work_directories import clean_up_after_killed_writers
from sparsepipe.core.work_directories import move_into_place
from sparsepipe.core.work_directories import work_directory
from sparsepipe.core.write_errors import write_errors_named
from sparsepipe.data.bulk_encode import encode_records
from sparsepipe.data.codec import RecordCodec
from sparsepipe.data.example import Example, ExampleBatch, batch_from_examples
from sparsepipe.data.example import concat_batches, select_examples, slice_batch
from sparsepipe.data.manifest import MANIFEST_NAME, Manifest, ShardInfo, write_manifest
from sparsepipe.data.progress import Progress
from sparsepipe.data.schema import ExampleSchema
from sparsepipe.data.split import eval_mask, split_info

SHARD_SUFFIX = ".arrayrecord"
DEFAULT_EXAMPLES_PER_RECORD = 128
DEFAULT_MAX_RECORDS_PER_SHARD = 10_000
_ENCODE_EXAMPLES = 1 << 16  # examples encoded together (at least one record)
SMALL_RECORD_EXAMPLES = 8  # records of at most this many examples: snappy chunks


def array_record_options(examples_per_record: int) -> str:
  """ArrayRecord writer options for records of `examples_per_record` (module doc)."""
  if examples_per_record <= SMALL_RECORD_EXAMPLES:
    return "group_size:1,snappy"
  return "group_size:1"


class ShardedRecordWriter:
  """Streams examples into shards; `close()` writes the manifest.

  Use as a context manager: on an exception the manifest is not written, so
  the half-written directory is never mistaken for a dataset.
  """

  def __init__(
    self,
    directory: str,
    schema: ExampleSchema,
    *,
    examples_per_record: int = DEFAULT_EXAMPLES_PER_RECORD,
    max_records_per_shard: int = DEFAULT_MAX_RECORDS_PER_SHARD,
    overwrite: bool = False,
    info: Mapping[str, Any] | None = None,
    shard_prefix: str = "part",
  ):
    if examples_per_record < 1:
      raise ValueError(f"examples_per_record={examples_per_record} must be >= 1")
    if max_records_per_shard < 1:
      raise ValueError(f"max_records_per_shard={max_records_per_shard} must be >= 1")
    self.directory = os.path.abspath(directory)
    self.schema = schema
    self.examples_per_record = examples_per_record
    self.max_records_per_shard = max_records_per_shard
    self._info = dict(info or {})
    self._prefix = shard_prefix
    self._codec = RecordCodec(schema)
    self._pending: list[ExampleBatch] = []
    self._pending_count = 0
    self._shards: list[ShardInfo] = []
    self._writer = None
    self._shard_records = 0
    self._shard_examples = 0
    self._closed = False
    self._published = False
    self._max_ids = {f.name: 0 for f in schema.sparse}
    self._num_ids = {f.name: 0 for f in schema.sparse}
    self.manifest: Manifest | None = None
    self._prepare_directory(overwrite)

  def _prepare_directory(self, overwrite: bool) -> None:
    """Checks the output directory; creates the temporary one the shards go to."""
    self._overwrite = overwrite
    self._replace_old = self._check_directory(appeared="")
    clean_up_after_killed_writers(self.directory)
    self._work = work_directory(self.directory)

  def _check_directory(self, appeared: str) -> bool:
    """Raises unless the dataset may go to the output (a new folder, one of
    unrelated files, or, with overwrite, a dataset); returns whether it
    replaces a dataset. `appeared`: what a refusal adds when the output
    changed while the dataset was written."""
    refuse_symbolic_link(self.directory, "the output")
    if os.path.lexists(self.directory) and not os.path.isdir(self.directory):
      raise FileExistsError(
        f"'{self.directory}' is a file, not a directory{appeared}: a dataset is a directory of"
        " its own; choose another output"
      )
    found = saved_work(self.directory)
    if found and found[0] != "dataset":
      raise FileExistsError(
        f"'{self.directory}' is {a_kind(found[0])} (it has {found[1]}){appeared}: a dataset"
        " never replaces or writes into one; choose another output"
      )
    entries = os.listdir(self.directory) if os.path.isdir(self.directory) else []
    ours = [e for e in entries if self._is_dataset_file(e)]
    if ours and not self._overwrite:
      shards = [e for e in ours if e.endswith(SHARD_SUFFIX)]
      raise FileExistsError(
        f"'{self.directory}' already holds a dataset ({MANIFEST_NAME} or"
        f" {len(shards)} shard files){appeared}; pass overwrite=True (--overwrite) to replace it"
      )
    foreign = sorted(set(entries) - set(ours))
    if ours and foreign:
      raise FileExistsError(
        f"'{self.directory}' holds a dataset and other files {foreign[:5]}{appeared}:"
        " overwriting replaces the whole directory, so move those files or choose another output"
      )
    return bool(ours)

  def check_output_unchanged(self) -> None:
    """Raises (the same refusals as at the start) if what appeared at the output
    while the dataset was written may not be replaced or written into."""
    self._replace_old = self._check_directory(
      appeared=" (it changed while the dataset was written)"
    )

  def _is_dataset_file(self, name: str) -> bool:
    """A file a writer with this shard prefix makes (finished or temporary)."""
    p = self._prefix
    return (
      name == MANIFEST_NAME
      or name.startswith(f"{MANIFEST_NAME}.tmp-")
      or (name.startswith(f"{p}-") and name.endswith(SHARD_SUFFIX))
      or (name.startswith(f".{p}-") and name.endswith(".tmp"))
    )

  def _publish(self) -> None:
    """Moves the finished dataset from the temporary directory to the output."""
    if not os.path.isdir(self.directory) or not os.listdir(self.directory) or self._replace_old:
      move_into_place(self._work, self.directory)
    else:  # a directory with unrelated files only: move ours in, the manifest last
      for name in [s.path for s in self._shards] + [MANIFEST_NAME]:
        os.replace(os.path.join(self._work, name), os.path.join(self.directory, name))
      os.rmdir(self._work)

  # ------------------------------------------------------------------ API

  def write(self, example: Example) -> None:
    """Adds one example (convenient, slow: prefer write_batch)."""
    self.write_batch(batch_from_examples([example], self.schema))

  def write_batch(self, batch: ExampleBatch) -> None:
    """Adds columnar examples; full records are written as they fill."""
    if self._closed:
      raise ValueError("writer is closed")
    if batch.num_examples == 0:
      return
    for name, rb in batch.sparse.items():
      self._max_ids[name] = max(self._max_ids[name], int(rb.row_lengths.max()))
      self._num_ids[name] += int(rb.row_lengths.sum())
    self._pending.append(batch)
    self._pending_count += batch.num_examples
    if self._pending_count >= self.examples_per_record:
      self._flush(final=False)

  def add_info(self, info: Mapping[str, Any]) -> None:
    """Adds entries to the manifest's info (e.g. statistics known only at the end)."""
    self._info.update(info)

  def close(self) -> Manifest:
    """Finishes the dataset (`finish`) if not yet, then moves it into place,
    unless the output changed meanwhile (`check_output_unchanged`): then the
    new dataset is removed and the output left as it is."""
    manifest = self.finish()
    if manifest is not None and not self._published:
      try:
        self.check_output_unchanged()
      except BaseException:
        self.abort()
        raise
      self._publish()
      self._published = True
    return manifest

  def finish(self) -> Manifest:
    """Writes the last (possibly partial) record, closes the shard, writes the
    manifest: all in the temporary directory, the output unchanged until `close`."""
    if self._closed:
      return self.manifest
    self._flush(final=True)
    self._close_shard()
    self._closed = True
    if not self._shards:
      shutil.rmtree(self._work, ignore_errors=True)
      raise ValueError(f"no examples were written to '{self.directory}'")
    manifest = Manifest(
      directory=self._work,
      schema=self.schema,
      shards=tuple(self._shards),
      examples_per_record=self.examples_per_record,
      info={**self._info, "ids_per_example": self._ids_per_example()},
    )
    write_manifest(manifest)
    self.manifest = dataclasses.replace(manifest, directory=self.directory)
    return self.manifest

  def abort(self) -> None:
    """Closes the open shard and removes the dataset not yet moved into place (also a
    finished one); the output is untouched."""
    if self._published:
      return
    writer, self._writer = self._writer, None
    if writer is not None:
      try:
        writer.close()
      except RuntimeError:  # the write that failed (a full disk): the shard is discarded
        pass
    self._closed = True
    self.manifest = None
    shutil.rmtree(self._work, ignore_errors=True)

  def _ids_per_example(self) -> dict[str, dict[str, float]]:
    """{feature: {"max": most ids in one example, "mean": ids per example}}."""
    n = max(sum(s.num_examples for s in self._shards), 1)
    return {
      name: {"max": self._max_ids[name], "mean": self._num_ids[name] / n} for name in self._max_ids
    }

  def __enter__(self) -> ShardedRecordWriter:
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    if exc_type is None:
      self.close()
    else:
      self.abort()

  @property
  def num_examples(self) -> int:
    """Examples accepted so far (written or pending)."""
    return sum(s.num_examples for s in self._shards) + self._shard_examples + self._pending_count

  # ------------------------------------------------------------ internals

  def _flush(self, final: bool) -> None:
    """Encodes the pending full records (and, if final, the last short one) and writes them."""
    if not self._pending:
      return
    r = self.examples_per_record
    data = concat_batches(self._pending)
    n = data.num_examples
    ready = n if final else n - n % r
    # Encoded a slice at a time: the encoded bytes of a huge write_batch need not fit at once.
    step = r * max(1, _ENCODE_EXAMPLES // r)
    for start in range(0, ready, step):
      part = slice_batch(data, start, min(start + step, ready))
      self._write_records(*encode_records(self._codec, part, r))
    self._pending = [slice_batch(data, ready, n)] if ready < n else []
    self._pending_count = n - ready

  def _write_records(self, records: list[bytes], counts: np.ndarray) -> None:
    """Writes encoded records in order, opening and closing shards as they fill."""
    from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top

    with self._write_errors_named():
      self._write_records_to_shards(records, counts, array_record_module)

  def _write_errors_named(self) -> contextlib.AbstractContextManager[None]:
    """ArrayRecord's RuntimeError on a failed write or close (a full disk) as an OSError
    naming the dataset (core.write_errors): one line, not a traceback from the writer."""
    return write_errors_named("the dataset", self.directory, errors=(RuntimeError, OSError))

  def _write_records_to_shards(self, records, counts, array_record_module) -> None:
    done = 0
    while done < len(records):
      if self._writer is None:
        name = f"{self._prefix}-{len(self._shards):05d}{SHARD_SUFFIX}"
        self._shard_name = name
        self._tmp_path = os.path.join(self._work, f".{name}.tmp")
        self._writer = array_record_module.ArrayRecordWriter(
          self._tmp_path, array_record_options(self.examples_per_record)
        )
      take = min(len(records) - done, self.max_records_per_shard - self._shard_records)
      write = self._writer.write
      for record in records[done : done + take]:
        write(record)  # ArrayRecord's per-record call: the floor for small records
      self._shard_records += take
      self._shard_examples += int(counts[done : done + take].sum())
      done += take
      if self._shard_records >= self.max_records_per_shard:
        self._close_shard()

  def _close_shard(self) -> None:
    if self._writer is None:
      return
    writer, self._writer = self._writer, None
    with self._write_errors_named():
      writer.close()
    os.replace(self._tmp_path, os.path.join(self._work, self._shard_name))
    self._shards.append(ShardInfo(self._shard_name, self._shard_records, self._shard_examples))
    self._shard_records = 0
    self._shard_examples = 0


@contextlib.contextmanager
def written_together(
  directories: Mapping[str, Mapping[str, Any] | None], schema: ExampleSchema, **options: Any
) -> Iterator[list[ShardedRecordWriter]]:
  """Writers of datasets (directory -> manifest info) that are moved into place together.

  All are finished (their last shard and manifest written, in their
  temporary directories) before any is moved into place, so a failure (a
  full disk, an error or a stop while writing) leaves every output as it
  was, never a new split beside an old one; an exception aborts all.
  `options` are ShardedRecordWriter's.
  """
  with contextlib.ExitStack() as stack:
    writers = [
      stack.enter_context(ShardedRecordWriter(directory, schema, info=info, **options))
      for directory, info in directories.items()
    ]
    yield writers
    for writer in writers:
      writer.finish()
    for writer in writers:  # none is moved into place unless all may be
      writer.check_output_unchanged()


def check_apart(output_dir: str, eval_output: str) -> None:
  """ValueError unless the train and eval outputs are two folders, neither inside the other
  (compared as resolved paths)."""
  train = ("train", output_dir, os.path.realpath(output_dir))
  held = ("eval", eval_output, os.path.realpath(eval_output))
  if train[2] == held[2]:
    raise ValueError(f"the eval output '{eval_output}' is the train output '{output_dir}'")
  for inner, outer in ((held, train), (train, held)):
    if os.path.commonpath([inner[2], outer[2]]) == outer[2]:
      raise ValueError(
        f"the {inner[0]} output '{inner[1]}' is inside the {outer[0]} output '{outer[1]}':"
        " give two folders, neither inside the other"
      )


def write_batches(
  output_dir: str,
  schema: ExampleSchema,
  batches: Iterable[ExampleBatch],
  *,
  examples_per_record: int = DEFAULT_EXAMPLES_PER_RECORD,
  max_records_per_shard: int = DEFAULT_MAX_RECORDS_PER_SHARD,
  overwrite: bool = False,
  info: Mapping[str, Any] | None = None,
  progress: Progress | None = None,
  eval_output: str | None = None,
  eval_fraction: float = 0.0,
  split_seed: int = 0,
  final_info: Callable[[], Mapping[str, Any]] | None = None,
) -> Manifest:
  """Writes all of `batches` as one dataset (or a train and an eval split); returns its manifest.

  The converters' common loop. `batches` is consumed inside the writers, so
  an error while reading (a lazy generator) aborts them and the outputs are
  left as they were; `progress`, if given, is updated per batch and closed
  at the end. With `eval_output`, each example goes to the eval dataset
  there with probability `eval_fraction`, decided by a hash of its index in
  the stream and `split_seed` (sparsepipe.data.split), and the manifest
  returned is the train split's. `final_info()`, called once all batches
  are read, adds entries to every manifest's info (e.g. value statistics).
  """
  if eval_output is not None:
    if not 0.0 < eval_fraction < 1.0:
      raise ValueError(f"eval_fraction={eval_fraction} must lie in (0, 1) with an eval output")
    check_apart(output_dir, eval_output)
  options = dict(
    examples_per_record=examples_per_record,
    max_records_per_shard=max_records_per_shard,
    overwrite=overwrite,
  )
  if eval_output is None:
    directories = {output_dir: info}
  else:
    directories = {
      out: {**(info or {}), "split": split_info(part, eval_fraction, split_seed)}
      for part, out in (("train", output_dir), ("eval", eval_output))
    }
  with written_together(directories, schema, **options) as writers:
    train, evals = writers if eval_output is not None else (writers[0], None)
    seen = 0
    for batch in batches:
      if evals is None:
        train.write_batch(batch)
      else:
        mask = eval_mask(seen, batch.num_examples, eval_fraction, split_seed)
        train.write_batch(select_examples(batch, ~mask))
        evals.write_batch(select_examples(batch, mask))
      seen += batch.num_examples
      if progress:
        progress.update(batch.num_examples)
    if not seen:
      inputs = (info or {}).get("inputs") or []
      named = f" {', '.join(map(repr, inputs))}" if inputs else ""
      raise ValueError(f"the input{named} holds no examples: nothing to write to '{output_dir}'")
    for writer, part in ((train, "train"), (evals, "eval")):
      if writer is not None and writer.num_examples == 0:
        raise ValueError(
          f"the {part} split got none of the {seen} examples (eval_fraction={eval_fraction})"
        )
    if final_info is not None:
      extra = final_info()
      for writer in writers:
        writer.add_info(extra)
  if progress:
    progress.close()
  return train.manifest

"""Writes examples as a sharded ArrayRecord dataset with a manifest.

Examples are packed `examples_per_record` (R) at a time into columnar
records (see codec.py); only the very last record of a dataset may hold
fewer. Shards hold at most `max_records_per_shard` records: ArrayRecord's
random-read cost grows with records per file, so many mid-sized shards (and
packed records) read fastest. Each shard is written under a temporary name
and renamed when complete; the manifest is written last, atomically.
"""

from __future__ import annotations

import glob
import os
from typing import Any, Iterable, Mapping

from sparsepipe.data.codec import RecordCodec
from sparsepipe.data.example import Example, ExampleBatch, batch_from_examples
from sparsepipe.data.example import concat_batches, slice_batch
from sparsepipe.data.manifest import MANIFEST_NAME, Manifest, ShardInfo, write_manifest
from sparsepipe.data.progress import Progress
from sparsepipe.data.schema import ExampleSchema

SHARD_SUFFIX = ".arrayrecord"
DEFAULT_EXAMPLES_PER_RECORD = 128
DEFAULT_MAX_RECORDS_PER_SHARD = 10_000


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
    self.manifest: Manifest | None = None
    self._prepare_directory(overwrite)

  def _prepare_directory(self, overwrite: bool) -> None:
    os.makedirs(self.directory, exist_ok=True)
    manifest = os.path.join(self.directory, MANIFEST_NAME)
    old = sorted(glob.glob(os.path.join(self.directory, f"{self._prefix}-*{SHARD_SUFFIX}")))
    if (os.path.exists(manifest) or old) and not overwrite:
      raise FileExistsError(
          f"'{self.directory}' already holds a dataset ({MANIFEST_NAME} or"
          f" {len(old)} shard files); pass overwrite=True to replace it"
      )
    if os.path.exists(manifest):
      os.remove(manifest)  # First, so a crash never leaves a stale manifest.
    for path in old:
      os.remove(path)

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
    self._pending.append(batch)
    self._pending_count += batch.num_examples
    if self._pending_count >= self.examples_per_record:
      self._flush(final=False)

  def close(self) -> Manifest:
    """Writes the last (possibly partial) record, closes the shard, writes the manifest."""
    if self._closed:
      return self.manifest
    self._flush(final=True)
    self._close_shard()
    self._closed = True
    if not self._shards:
      raise ValueError(f"no examples were written to '{self.directory}'")
    self.manifest = Manifest(
        directory=self.directory,
        schema=self.schema,
        shards=tuple(self._shards),
        examples_per_record=self.examples_per_record,
        info=self._info,
    )
    write_manifest(self.manifest)
    return self.manifest

  def abort(self) -> None:
    """Closes the open shard without writing a manifest."""
    if self._writer is not None:
      self._writer.close()
      self._writer = None
    self._closed = True

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
    if not self._pending:
      return
    r = self.examples_per_record
    data = concat_batches(self._pending)
    n = data.num_examples
    full = n - n % r
    for start in range(0, full, r):
      self._write_record(slice_batch(data, start, start + r), r)
    rest = n - full
    if rest and final:
      self._write_record(slice_batch(data, full, n), rest)
      rest = 0
    self._pending = [slice_batch(data, full, n)] if rest else []
    self._pending_count = rest

  def _write_record(self, batch: ExampleBatch, num_examples: int) -> None:
    from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top

    if self._writer is None:
      name = f"{self._prefix}-{len(self._shards):05d}{SHARD_SUFFIX}"
      self._shard_name = name
      self._tmp_path = os.path.join(self.directory, f".{name}.tmp")
      self._writer = array_record_module.ArrayRecordWriter(self._tmp_path, "group_size:1")
    self._writer.write(self._codec.encode_batch(batch))
    self._shard_records += 1
    self._shard_examples += num_examples
    if self._shard_records >= self.max_records_per_shard:
      self._close_shard()

  def _close_shard(self) -> None:
    if self._writer is None:
      return
    self._writer.close()
    self._writer = None
    os.replace(self._tmp_path, os.path.join(self.directory, self._shard_name))
    self._shards.append(ShardInfo(self._shard_name, self._shard_records, self._shard_examples))
    self._shard_records = 0
    self._shard_examples = 0


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
) -> Manifest:
  """Writes all of `batches` as one dataset; returns its manifest.

  The converters' common loop. `batches` is consumed inside the writer, so an
  error while reading (a lazy generator) aborts it and no manifest is written;
  `progress`, if given, is updated per batch and closed at the end.
  """
  with ShardedRecordWriter(
      output_dir,
      schema,
      examples_per_record=examples_per_record,
      max_records_per_shard=max_records_per_shard,
      overwrite=overwrite,
      info=info,
  ) as writer:
    for batch in batches:
      writer.write_batch(batch)
      if progress:
        progress.update(batch.num_examples)
  if progress:
    progress.close()
  return writer.manifest

"""Reader side: all shards of a dataset as one Grain random-access source."""

from __future__ import annotations

from typing import Mapping, Sequence, SupportsIndex

import grain

from sparsepipe.data.codec import UnreadableRecord
from sparsepipe.data.manifest import Manifest, read_manifest

# A reader per shard with no internal thread pool: best on few cores.
DEFAULT_READER_OPTIONS = {"max_parallelism": "0"}
# What ArrayRecord raises for damaged or truncated files (and missing ones).
_READ_ERRORS = (RuntimeError, OSError)


class ShardSource(grain.sources.ArrayRecordDataSource):
  """Grain's ArrayRecord source that turns unreadable records into UnreadableRecord.

  ArrayRecord fails a whole read when one chunk of a shard is damaged (or
  the shard cannot be opened: truncated, missing) and its message does not
  name the file. Here a failed batched read is retried record by record;
  each record that still fails comes back as an UnreadableRecord naming
  the shard, the record index in it and ArrayRecord's reason, so decoding
  reports it like a corrupt record (an error naming file and record, or
  skipped and counted with skip_corrupt). A shard that cannot be opened is
  tried once.
  """

  def __init__(self, paths: Sequence[str], reader_options: Mapping[str, str] | None = None):
    super().__init__(paths, reader_options=dict(reader_options or {}))
    self._unopenable: dict[int, str] = {}

  def _ensure_reader_exists(self, reader_idx: int) -> None:
    if reader_idx in self._unopenable:
      raise RuntimeError(self._unopenable[reader_idx])
    try:
      super()._ensure_reader_exists(reader_idx)
    except _READ_ERRORS as e:
      self._unopenable[reader_idx] = f"the shard cannot be opened: {e}"
      raise RuntimeError(self._unopenable[reader_idx]) from None

  def __getitem__(self, record_key: SupportsIndex) -> bytes:
    try:
      return super().__getitem__(record_key)
    except _READ_ERRORS as e:
      reader_idx, position = self._reader_idx_and_position(record_key)
      path = self._read_instructions[reader_idx].filename
      return UnreadableRecord(f"ArrayRecord cannot read it: {e}", path, position)

  def __getitems__(self, record_keys: Sequence[SupportsIndex]) -> Sequence[bytes]:
    try:
      return super().__getitems__(record_keys)
    except _READ_ERRORS:
      return [self[k] for k in record_keys]


def manifest_source(
    manifest: Manifest | str,
    *,
    reader_options: Mapping[str, str] | None = None,
    verify_shards: bool = False,
) -> ShardSource:
  """A ShardSource (Grain ArrayRecord source) over every shard, in manifest order.

  Global record index i is record `manifest.locate(i)`. Shards are opened
  lazily (the manifest's record counts avoid opening every file up front).

  Args:
    manifest: a Manifest, or a dataset directory to read it from.
    reader_options: ArrayRecord reader options (default {"max_parallelism": "0"}).
    verify_shards: with a directory, check every shard's record count first.
  """
  if isinstance(manifest, str):
    manifest = read_manifest(manifest, verify_shards=verify_shards)
  paths = [f"{p}[0:{s.num_records}]" for p, s in zip(manifest.shard_paths(), manifest.shards)]
  options = dict(DEFAULT_READER_OPTIONS if reader_options is None else reader_options)
  source = ShardSource(paths, reader_options=options)
  if len(source) != manifest.num_records:
    raise ValueError(
        f"source over '{manifest.directory}' has {len(source)} records, manifest says"
        f" {manifest.num_records}"
    )
  return source

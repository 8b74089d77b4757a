"""Reader side: all shards of a dataset as one Grain random-access source."""

from __future__ import annotations

from typing import Mapping, Sequence, SupportsIndex

from array_record.python import array_record_data_source as _ards
from array_record.python import array_record_module
import grain
import numpy as np

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
  skipped and counted with skip_corrupt). A shard that cannot be opened, or
  holds fewer records than the manifest lists, is tried once.

  Shards are opened for random access (no read-ahead) with the file
  reader's default buffer: Grain's reader sets a 32 KiB buffer, which each
  read of a small record fills (benchmarks/converters.py compares the two
  on records of one example and of 128). Relies on the pinned
  array_record's _check_group_size.
  """

  def __init__(self, paths: Sequence[str], reader_options: Mapping[str, str] | None = None):
    super().__init__(paths, reader_options=dict(reader_options or {}))
    self._unopenable: dict[int, str] = {}
    # Global key k is in shard s = searchsorted(ends, k, "right"), at position k + shift[s].
    counts = np.asarray([ri.num_records for ri in self._read_instructions], np.int64)
    self._ends = np.cumsum(counts)
    self._shift = np.asarray([ri.start for ri in self._read_instructions]) - (self._ends - counts)

  def _ensure_reader_exists(self, reader_idx: int) -> None:
    """Opens a shard once, checking it holds the records the manifest lists.

    (ArrayRecord opens some truncated files as holding 0 records and then
    reads empty bytes for every position, silently.)
    """
    if self._readers[reader_idx] is not None:
      return
    with self._lock:
      if self._readers[reader_idx] is not None:
        return
      if reader_idx in self._unopenable:
        raise RuntimeError(self._unopenable[reader_idx])
      filename = self._read_instructions[reader_idx].filename
      try:
        # pylint: disable=protected-access
        reader = array_record_module.ArrayRecordReader(
          filename, options=f"readahead_buffer_size:0,{self._reader_options_string}"
        )
        _ards._check_group_size(filename, reader)
        held = reader.num_records()
      except (*_READ_ERRORS, ValueError) as e:
        self._unopenable[reader_idx] = f"the shard cannot be opened: {_why(e)}"
        raise RuntimeError(self._unopenable[reader_idx]) from None
      needed = self._read_instructions[reader_idx].end
      if held < needed:
        _close_quietly(reader)
        self._unopenable[reader_idx] = (
          f"the shard holds {held} readable records, the manifest lists {needed} (truncated?)"
        )
        raise RuntimeError(self._unopenable[reader_idx])
      self._readers[reader_idx] = reader

  def __getitem__(self, record_key: SupportsIndex) -> bytes:
    try:
      return super().__getitem__(record_key)
    except _READ_ERRORS as e:
      reader_idx, position = self._reader_idx_and_position(record_key)
      path = self._read_instructions[reader_idx].filename
      return UnreadableRecord(f"ArrayRecord cannot read it: {_why(e)}", path, position)

  def __getitems__(self, record_keys: Sequence[SupportsIndex]) -> Sequence[bytes]:
    """Records of `record_keys`, in that order: one ArrayRecord read per shard.

    Grain's version maps every key in Python and starts a thread pool per
    call to read the shards; with single-example records (thousands of keys
    a batch) that took a quarter of the read time. Here keys map to shards
    with numpy and each shard's records come in one ArrayRecord batched read
    (which spreads them over ArrayRecord's own thread pool), shard after
    shard. A shard whose read fails is read again record by record (see the
    class doc).
    """
    keys = np.asarray(record_keys, np.int64).reshape(-1)
    if not keys.size:
      return []
    if keys.min() < 0 or keys.max() >= len(self):
      bad = int(keys.min()) if keys.min() < 0 else int(keys.max())
      raise ValueError(f"record key {bad} is outside [0, {len(self)})")
    shard = np.searchsorted(self._ends, keys, side="right")
    positions = keys + self._shift[shard]
    order = np.argsort(shard, kind="stable")
    cuts = np.flatnonzero(np.diff(shard[order])) + 1
    records: list[bytes] = [b""] * len(keys)
    for group in np.split(order, cuts):
      got = self._read_shard(int(shard[group[0]]), positions[group].tolist(), keys[group].tolist())
      for j, record in zip(group.tolist(), got):
        records[j] = record
    return records

  def _read_shard(self, reader_idx: int, positions: list[int], keys: list[int]) -> list[bytes]:
    """One shard's records at `positions` (global `keys`); record by record if that fails."""
    try:
      self._ensure_reader_exists(reader_idx)
      return self._readers[reader_idx].read(positions)
    except _READ_ERRORS:
      return [self[k] for k in keys]


def _close_quietly(reader) -> None:
  """Closes a reader; ArrayRecord's close raises on a truncated file (after reading it fine)."""
  try:
    reader.close()
  except RuntimeError:
    pass


def _why(error: Exception) -> str:
  """ArrayRecord's message (some of its errors, e.g. on truncated files, have none)."""
  return str(error) or f"{type(error).__name__} with no message (a truncated file?)"


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

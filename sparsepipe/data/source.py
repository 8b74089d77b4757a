"""Reader side: all shards of a dataset as one Grain random-access source."""

from __future__ import annotations

from typing import Mapping

from sparsepipe.data.manifest import Manifest, read_manifest

# A reader per shard with no internal thread pool: best on few cores.
DEFAULT_READER_OPTIONS = {"max_parallelism": "0"}


def manifest_source(
    manifest: Manifest | str,
    *,
    reader_options: Mapping[str, str] | None = None,
    verify_shards: bool = False,
):
  """A `grain.sources.ArrayRecordDataSource` over every shard, in manifest order.

  Global record index i is record `manifest.locate(i)`. Shards are opened
  lazily (the manifest's record counts avoid opening every file up front).

  Args:
    manifest: a Manifest, or a dataset directory to read it from.
    reader_options: ArrayRecord reader options (default {"max_parallelism": "0"}).
    verify_shards: with a directory, check every shard's record count first.
  """
  import grain  # pylint: disable=g-import-not-at-top

  if isinstance(manifest, str):
    manifest = read_manifest(manifest, verify_shards=verify_shards)
  paths = [f"{p}[0:{s.num_records}]" for p, s in zip(manifest.shard_paths(), manifest.shards)]
  options = dict(DEFAULT_READER_OPTIONS if reader_options is None else reader_options)
  source = grain.sources.ArrayRecordDataSource(paths, reader_options=options)
  if len(source) != manifest.num_records:
    raise ValueError(
        f"source over '{manifest.directory}' has {len(source)} records, manifest says"
        f" {manifest.num_records}"
    )
  return source

"""The JSON manifest of a sharded ArrayRecord dataset.

`manifest.json` sits beside the shards and names the schema, the shards in
order with their record and example counts, and the format version. It is
written last and atomically (temporary file + rename): a directory without
it is not a finished dataset.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import os
from typing import Any, Mapping

from sparsepipe.core.saved_work import MANIFEST_FORMAT
from sparsepipe.core.saved_work import MANIFEST_NAME
from sparsepipe.data.codec import FORMAT_VERSION
from sparsepipe.data.schema import ExampleSchema


class ManifestError(ValueError):
  """A missing, malformed or inconsistent manifest, or shards that disagree with it."""


@dataclasses.dataclass(frozen=True)
class ShardInfo:
  """One shard file (path relative to the dataset directory)."""

  path: str
  num_records: int
  num_examples: int


@dataclasses.dataclass(frozen=True)
class Manifest:
  """A finished dataset: schema, shards and counts.

  Attributes:
    directory: absolute dataset directory (not stored in the JSON).
    schema: the example schema.
    shards: shard files in reading order.
    examples_per_record: R, examples packed per record (the last record of a
      dataset may hold fewer).
    format_version: record codec version.
    info: free-form JSON description of how the data was made.
  """

  directory: str
  schema: ExampleSchema
  shards: tuple[ShardInfo, ...]
  examples_per_record: int
  format_version: int = FORMAT_VERSION
  info: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False, compare=False)

  @property
  def num_records(self) -> int:
    return sum(s.num_records for s in self.shards)

  @property
  def num_examples(self) -> int:
    return sum(s.num_examples for s in self.shards)

  def shard_paths(self) -> list[str]:
    return [os.path.join(self.directory, s.path) for s in self.shards]

  def locate(self, index: int) -> tuple[str, int]:
    """(shard file, record index in it) of global record `index`."""
    return RecordLocator.from_manifest(self).locate(index)

  def to_dict(self) -> dict[str, Any]:
    return {
      "format": MANIFEST_FORMAT,
      "format_version": self.format_version,
      "schema": self.schema.to_dict(),
      "examples_per_record": self.examples_per_record,
      "num_records": self.num_records,
      "num_examples": self.num_examples,
      "shards": [dataclasses.asdict(s) for s in self.shards],
      "info": dict(self.info),
    }

  @classmethod
  def from_dict(cls, d: Any, directory: str, *, where: str) -> Manifest:
    """The Manifest of `to_dict`'s JSON for the dataset at `directory`, checked
    as `read_manifest` checks the file; ManifestError naming `where` (the file,
    or a checkpoint's copy of it) otherwise."""
    if not isinstance(d, Mapping):
      raise ManifestError(f"{where}: a manifest is a JSON object, not {type(d).__name__}")
    if d.get("format") != MANIFEST_FORMAT:
      raise ManifestError(f"{where}: format {d.get('format')!r} is not {MANIFEST_FORMAT!r}")
    if d.get("format_version") != FORMAT_VERSION:
      raise ManifestError(
        f"{where}: format_version {d.get('format_version')!r} is not supported"
        f" (expected {FORMAT_VERSION})"
      )
    try:
      shards = tuple(
        ShardInfo(str(s["path"]), int(s["num_records"]), int(s["num_examples"]))
        for s in d["shards"]
      )
      manifest = cls(
        directory=directory,
        schema=ExampleSchema.from_dict(d["schema"]),
        shards=shards,
        examples_per_record=int(d["examples_per_record"]),
        format_version=int(d["format_version"]),
        info=d.get("info", {}),
      )
    except (KeyError, TypeError) as e:
      raise ManifestError(f"{where}: missing or malformed field {e}") from e
    if not shards:
      raise ManifestError(f"{where}: dataset has no shards")
    for key, total in (
      ("num_records", manifest.num_records),
      ("num_examples", manifest.num_examples),
    ):
      if d.get(key) != total:
        raise ManifestError(f"{where}: shards add up to {key}={total}, manifest says {d.get(key)}")
    return manifest


@dataclasses.dataclass(frozen=True)
class RecordLocator:
  """Maps a global record index to (file, index in file); small and picklable."""

  paths: tuple[str, ...]
  ends: tuple[int, ...]  # cumulative record counts

  @classmethod
  def from_manifest(cls, manifest: Manifest) -> RecordLocator:
    return cls(
      tuple(manifest.shard_paths()),
      tuple(itertools.accumulate(s.num_records for s in manifest.shards)),
    )

  @property
  def num_records(self) -> int:
    return self.ends[-1] if self.ends else 0

  def locate(self, index: int) -> tuple[str, int]:
    if not 0 <= index < self.num_records:
      raise IndexError(f"record {index} out of range [0, {self.num_records})")
    shard = bisect.bisect_right(self.ends, index)
    start = self.ends[shard - 1] if shard else 0
    return self.paths[shard], index - start


def write_manifest(manifest: Manifest) -> str:
  """Writes `manifest.json` atomically; returns its path."""
  path = os.path.join(manifest.directory, MANIFEST_NAME)
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(manifest.to_dict(), f, indent=1, sort_keys=True)
    f.write("\n")
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  return path


def read_manifest(directory: str, *, verify_shards: bool = False) -> Manifest:
  """Reads and checks a dataset's manifest.

  Args:
    directory: the dataset directory.
    verify_shards: also open every shard and compare its record count with
      the manifest (catches truncated or replaced files before training).

  Raises:
    ManifestError: missing file, wrong format or version, counts that do not
      add up, or (with verify_shards) a shard that disagrees.
  """
  directory = os.path.abspath(directory)
  path = os.path.join(directory, MANIFEST_NAME)
  if os.path.isfile(directory):
    raise ManifestError(f"'{directory}' is a file, not a dataset (a folder with {MANIFEST_NAME})")
  if not os.path.exists(path):
    raise ManifestError(f"no {MANIFEST_NAME} in '{directory}' (not a finished dataset)")
  try:
    with open(path) as f:
      d = json.load(f)
  except json.JSONDecodeError as e:
    raise ManifestError(f"'{path}' is not valid JSON: {e}") from e
  manifest = Manifest.from_dict(d, directory, where=f"'{path}'")
  if verify_shards:
    from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top

    for shard, full in zip(manifest.shards, manifest.shard_paths()):
      if not os.path.exists(full):
        raise ManifestError(f"shard '{full}' listed in '{path}' does not exist")
      try:
        reader = array_record_module.ArrayRecordReader(full)
        n = reader.num_records()
        try:
          reader.close()
        except RuntimeError:  # raised for a truncated file, whose count below tells more
          pass
      except (RuntimeError, ValueError) as e:  # ArrayRecord's message names no file
        why = str(e) or f"{type(e).__name__} with no message"
        raise ManifestError(
          f"shard '{full}' cannot be read (damaged or truncated): {why}"
        ) from None
      if n != shard.num_records:
        raise ManifestError(f"shard '{full}' holds {n} records, manifest says {shard.num_records}")
  return manifest

"""The export directory: a trained model without the training topology
(docs/reference/export_format.md).

    E/export.json            what the export is (ExportInfo), every file's sha256,
                             and its own ("sha256": of the canonical JSON of the rest)
    E/params.npz             the dense parameters, leaf i as "p<i>" (flatten order)
    E/tables/<table>.npy     a table's rows [vocabulary_size, dim] float32
                             (a delta: only the rows that changed, and
    E/tables/<table>.ids.npy their ids, int64)
    E/predict.jaxexport      the serialized predict function (jax.export)

Plain numpy files and JSON: no pickle (read with allow_pickle=False). An
export is written beside its destination and moved into place when
complete, so a reader never sees a partial one; a file that is missing or
does not match its sha256 is an ExportError naming it, and so is an
export.json that does not match its own (format_version 2 on). Exports of
sparsepipe 0.3 (format_version 1, no digest of export.json) are still read,
with a warning that their export.json cannot be checked: a re-export needs
the checkpoint, which may be gone, and a changed export_id would orphan the
deltas made on top of them. Damage cannot pass a version 2 export off as
one of version 1: that takes both the version and the digest key changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import uuid
from typing import Any, Mapping

from absl import logging
import numpy as np

from sparsepipe.checkpointing.integrity.digests import DIGEST_KEY
from sparsepipe.checkpointing.integrity.digests import digest
from sparsepipe.checkpointing.integrity.digests import seal
from sparsepipe.core.saved_work import EXPORT_FORMAT
from sparsepipe.core.saved_work import EXPORT_INFO_FILENAME
from sparsepipe.core.specs import check_combiner
from sparsepipe.core.work_directories import clean_up_after_killed_writers
from sparsepipe.core.work_directories import move_into_place
from sparsepipe.core.work_directories import work_directory
from sparsepipe.core.write_errors import write_error

# 2: export.json carries the sha256 of its own canonical JSON; 1 (sparsepipe 0.3): it does not.
EXPORT_VERSION = 2
UNSEALED_VERSION = 1
INFO_FILENAME = EXPORT_INFO_FILENAME
PARAMS_FILENAME = "params.npz"
PREDICT_FILENAME = "predict.jaxexport"


class ExportError(ValueError):
  """An export that cannot be read or used: names the directory and the file."""


@dataclasses.dataclass(frozen=True)
class ExportInfo:
  """export.json.

  Attributes:
    kind: "full" (every row of every table) or "delta" (the rows changed
      since `since`).
    export_id: this export's identity (a delta names its base by it).
    job_id: the training job's identity (the same in all its checkpoints).
    checkpoint_step, batches_trained: the checkpoint exported.
    updates_applied: batches whose embedding updates the tables hold (one
      less than batches_trained at a checkpoint inside a pipelined run).
    since: for a delta, {"export_id", "updates_applied"} of the export it
      applies to; None for a full export.
    model: {"name", "factory", "config"}: config.model of the job.
    dense_dim: width of the dense input.
    features: per feature {"name", "table", "vocab_size", "dim", "combiner",
      "weighted", "max_ids"}.
    tables: per table {"vocab_size", "dim", "rows"} (rows: in this export).
    converter: how raw values became ids (the train dataset's manifest info
      and schema): what `Predictor.predict_rows` applies.
    params: {"count": leaves, "paths": their key paths}.
    platforms: the platforms the predict function was lowered for.
    files: {relative path: sha256} of every other file.
  """

  kind: str
  export_id: str
  job_id: str | None
  checkpoint_step: int
  batches_trained: int
  updates_applied: int
  since: Mapping[str, Any] | None
  model: Mapping[str, Any]
  dense_dim: int
  features: tuple[Mapping[str, Any], ...]
  tables: Mapping[str, Mapping[str, int]]
  converter: Mapping[str, Any]
  params: Mapping[str, Any]
  platforms: tuple[str, ...]
  files: Mapping[str, str] = dataclasses.field(default_factory=dict)

  def to_json(self) -> dict[str, Any]:
    body = {k: getattr(self, k) for k in (f.name for f in dataclasses.fields(self))}
    body["features"] = list(self.features)
    body["platforms"] = list(self.platforms)
    return {"format": EXPORT_FORMAT, "format_version": EXPORT_VERSION, **body}

  @classmethod
  def from_json(cls, data: Mapping[str, Any], where: str) -> ExportInfo:
    """The info of a parsed export.json, checked against its own sha256 (see the module)."""
    data = _unsealed(data, where)
    names = [f.name for f in dataclasses.fields(cls)]
    missing = [n for n in names if n not in data]
    if missing:
      raise ExportError(f"{where}: {INFO_FILENAME} lacks {missing}")
    values = {n: data[n] for n in names}
    values["features"] = tuple(values["features"])
    values["platforms"] = tuple(values["platforms"])
    for feature in values["features"]:
      try:
        check_combiner(feature.get("combiner"), f"{where}: feature '{feature.get('name')}'")
      except ValueError as e:
        raise ExportError(str(e)) from None
    return cls(**values)


def _unsealed(data: Any, where: str) -> dict[str, Any]:
  """export.json without its digest: ExportError if it does not match, or is not an export's."""
  if not isinstance(data, Mapping) or data.get("format") != EXPORT_FORMAT:
    raise ExportError(f"{where}: {INFO_FILENAME} is not a sparsepipe export")
  version = data.get("format_version")
  if not isinstance(version, int):
    raise ExportError(f"{where}: {INFO_FILENAME} has format_version {version!r}, not a number")
  if version > EXPORT_VERSION:  # a newer format may seal otherwise: name the version
    raise ExportError(
      f"{where} has export format_version {version}; this sparsepipe reads"
      f" {EXPORT_VERSION} and older"
    )
  body = {k: v for k, v in data.items() if k != DIGEST_KEY}
  if DIGEST_KEY in data:
    if digest(body) != data[DIGEST_KEY]:
      raise ExportError(
        f"{where}: file '{INFO_FILENAME}' does not match its sha256 (damaged or altered)"
      )
  elif version != UNSEALED_VERSION:
    raise ExportError(f"{where}: file '{INFO_FILENAME}' carries no sha256 (damaged or altered)")
  else:
    logging.warning(
      "%s was written by sparsepipe 0.3 (export format_version 1): its %s carries no sha256,"
      " so damage to it cannot be detected; export the checkpoint again to have it checked",
      where,
      INFO_FILENAME,
    )
  return body


def new_export_id() -> str:
  return uuid.uuid4().hex


def table_filename(table: str, *, ids: bool = False) -> str:
  return os.path.join("tables", f"{table}.ids.npy" if ids else f"{table}.npy")


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def write_export(
  output: str,
  info: ExportInfo,
  *,
  params: list[np.ndarray],
  tables: Mapping[str, np.ndarray],
  ids: Mapping[str, np.ndarray] | None,
  predict: bytes,
  overwrite: bool = False,
) -> str:
  """Writes the export beside `output`, then moves it into place; returns its path.

  An existing `output` is an error unless `overwrite`; then it is replaced
  only once the new export is complete.
  """
  output = os.path.abspath(output)
  clean_up_after_killed_writers(output)  # also puts back one a killed --overwrite moved
  if os.path.exists(output) and not overwrite:
    raise FileExistsError(f"'{output}' exists: give --overwrite to replace it, or another --output")
  tmp = work_directory(output)
  os.makedirs(os.path.join(tmp, "tables"))
  try:
    np.savez(os.path.join(tmp, PARAMS_FILENAME), **{f"p{i}": p for i, p in enumerate(params)})
    for table, values in tables.items():
      np.save(os.path.join(tmp, table_filename(table)), values)
      if ids is not None:
        np.save(os.path.join(tmp, table_filename(table, ids=True)), ids[table])
    with open(os.path.join(tmp, PREDICT_FILENAME), "wb") as f:
      f.write(predict)
    files = {}
    for root, _, names in os.walk(tmp):
      for name in names:
        path = os.path.join(root, name)
        files[os.path.relpath(path, tmp)] = _sha256(path)
    body = seal(dataclasses.replace(info, files=dict(sorted(files.items()))).to_json())
    with open(os.path.join(tmp, INFO_FILENAME), "w") as f:
      json.dump(body, f, indent=1, sort_keys=True)
    move_into_place(tmp, output)
  except OSError as error:
    shutil.rmtree(tmp, ignore_errors=True)
    raise write_error(error, "the export", output) from error
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return output


def read_info(directory: str, *, verify: bool = True) -> ExportInfo:
  """export.json of an export, with every file checked against its sha256."""
  where = f"export '{directory}'"
  path = os.path.join(directory, INFO_FILENAME)
  try:
    with open(path) as f:
      data = json.load(f)
  except FileNotFoundError:
    raise ExportError(f"{where} has no {INFO_FILENAME} (not an export, or a partial one)") from None
  except (OSError, ValueError) as e:
    raise ExportError(f"{where}: {INFO_FILENAME} is unreadable ({type(e).__name__}: {e})") from e
  info = ExportInfo.from_json(data, where)
  if verify:
    for name, digest in info.files.items():
      file = os.path.join(directory, name)
      if not os.path.isfile(file):
        raise ExportError(f"{where}: file '{name}' is missing")
      if _sha256(file) != digest:
        raise ExportError(f"{where}: file '{name}' does not match its sha256 (damaged or altered)")
  return info


def load_array(directory: str, name: str, *, mmap: bool = False) -> np.ndarray:
  """One .npy of an export (no pickle; `mmap` maps a big table instead of reading it)."""
  try:
    return np.load(
      os.path.join(directory, name), mmap_mode="r" if mmap else None, allow_pickle=False
    )
  except (OSError, ValueError) as e:
    raise ExportError(f"export '{directory}': file '{name}' is unreadable ({e})") from e


def load_params(directory: str, count: int) -> list[np.ndarray]:
  """The dense parameter leaves, in flatten order."""
  try:
    with np.load(os.path.join(directory, PARAMS_FILENAME), allow_pickle=False) as npz:
      return [npz[f"p{i}"] for i in range(count)]
  except (OSError, ValueError, KeyError) as e:
    raise ExportError(f"export '{directory}': file '{PARAMS_FILENAME}' is unreadable ({e})") from e

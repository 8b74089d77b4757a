"""Incremental exports: a delta holds the rows changed since an export, and applies to it.

A delta made with `launch.export --since E` holds, per table, the ids of the
rows whose embedding update landed after E's (`updated` > E's
updates_applied; see pipeline.EmbeddingVariables) and those rows' new
values, plus all dense parameters. Applied to E (and a chain to E's
predecessors in order), it gives the tables and parameters of a full export
at its own checkpoint, bit for bit: every other row is untouched since E.
A delta applies only to the export it names (its export_id), or to an
export `serving.apply` made with it as the newest delta (which keeps its
export_id), and to an export of its own job (job_id).
"""

from __future__ import annotations

from typing import Mapping, MutableMapping, Sequence

import numpy as np

from sparsepipe.serving.export_format import ExportError
from sparsepipe.serving.export_format import ExportInfo
from sparsepipe.serving.export_format import load_array
from sparsepipe.serving.export_format import table_filename


def check_applies(
  base: ExportInfo,
  delta: ExportInfo,
  base_dir: str,
  delta_dir: str,
  given: Mapping[str, str] | None = None,
) -> None:
  """Raises ExportError unless `delta` was made on top of `base`.

  The error names both exports (checkpoint, batches) and what to do; `given`
  ({export_id: directory} of the deltas given with it) lets it name the one
  to give first.
  """
  where = f"export '{delta_dir}'"
  if delta.kind != "delta":
    raise ExportError(f"{where} is a full export, not a delta: load it on its own")
  if base.job_id is None or delta.job_id != base.job_id:
    raise ExportError(
      f"{where} is a delta of job {delta.job_id}, '{base_dir}' an export of job {base.job_id}:"
      " a delta applies only to an export of its own job"
    )
  since_id, since_batch = delta.since["export_id"], delta.since["updates_applied"]
  if since_id == base.export_id:
    return
  if delta.export_id == base.export_id:
    if base.kind == "delta":  # the delta before it in the chain is itself
      raise ExportError(f"{where} is given twice (export {base.export_id[:8]}): give each once")
    raise ExportError(
      f"{where} is already applied in '{base_dir}' (the same export {base.export_id[:8]}):"
      " give each delta once"
    )
  if given and since_id in given:
    what = f"give '{given[since_id]}' before it"
  elif since_batch > base.updates_applied:
    what = f"the delta(s) from batch {base.updates_applied} to batch {since_batch} are missing"
  elif since_batch < base.updates_applied:
    what = (
      "it was made on an older export: apply it to that one, or give the deltas in the"
      " order they were made"
    )
  else:
    what = f"give the export it was made on top of ({since_id[:8]}) instead"
  raise ExportError(
    f"{where} (delta of checkpoint {delta.checkpoint_step}) was made on top of export"
    f" {since_id[:8]} (after batch {since_batch}), not on top of '{base_dir}' (export"
    f" {base.export_id[:8]}, checkpoint {base.checkpoint_step}, after batch"
    f" {base.updates_applied}): {what}"
  )


def check_chain(base_dir: str, base: ExportInfo, deltas: Sequence[tuple[str, ExportInfo]]) -> None:
  """Raises ExportError unless each of `deltas` ((directory, info), in order) was made on
  top of the one before it, the first on top of the full export `base`."""
  given = {info.export_id: directory for directory, info in deltas}
  previous, previous_dir = base, base_dir
  for delta_dir, info in deltas:
    check_applies(previous, info, previous_dir, delta_dir, given)
    previous, previous_dir = info, delta_dir


def apply_delta(tables: MutableMapping[str, np.ndarray], info: ExportInfo, delta_dir: str) -> None:
  """Writes the rows of the delta in `delta_dir` (described by `info`) into `tables`."""
  for table in info.tables:
    ids = load_array(delta_dir, table_filename(table, ids=True))
    rows = load_array(delta_dir, table_filename(table))
    target = tables[table]
    if ids.size and (ids.min() < 0 or ids.max() >= target.shape[0]):
      raise ExportError(f"export '{delta_dir}': table '{table}' ids outside [0, {target.shape[0]})")
    target[ids] = rows


def changed_rows(updated: np.ndarray, since: int) -> np.ndarray:
  """Ids of the rows whose last update came after batch `since` (int64, sorted)."""
  return np.flatnonzero(np.asarray(updated) > since).astype(np.int64)


def writable_tables(base_dir: str, info: ExportInfo) -> dict[str, np.ndarray]:
  """The base export's tables as arrays a delta can write into."""
  return {t: np.array(load_array(base_dir, table_filename(t))) for t in info.tables}


def same_tables(a: Mapping[str, Mapping[str, int]], b: Mapping[str, Mapping[str, int]]) -> bool:
  """Whether two exports have the same tables (names, vocabularies, dims)."""
  strip = lambda t: {n: (v["vocab_size"], v["dim"]) for n, v in t.items()}
  return strip(a) == strip(b)


def rows_to_export(
  tables: Mapping[str, tuple[np.ndarray, np.ndarray | None]],
  previous: ExportInfo | None,
  *,
  job_id: str | None,
  updates_applied: int,
  where: str,
  previous_dir: str = "",
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None]:
  """({table: rows to write}, {table: their ids} or None) of a full export or a delta.

  Args:
    tables: {table: (its rows, the last batch that updated each row or None)}.
    previous: the export a delta is made on top of, or None for a full one.
    job_id, updates_applied: of the checkpoint exported.
    where: names the checkpoint in errors.
    previous_dir: names the earlier export in errors.
  """
  earlier = f"the earlier export '{previous_dir}'" if previous_dir else "the earlier export"
  if previous is None:
    return {t: rows for t, (rows, _) in tables.items()}, None
  if previous.job_id is None or previous.job_id != job_id:
    raise ExportError(
      f"{earlier} is of job {previous.job_id}, {where} of job {job_id}: a delta is"
      " made on top of an export of the same job"
    )
  if previous.updates_applied > updates_applied:
    raise ExportError(
      f"{earlier} holds the updates of {previous.updates_applied} batches, {where}"
      f" only {updates_applied}: a delta goes forward from an older export"
    )
  values, ids = {}, {}
  for table, (rows, updated) in tables.items():
    if updated is None:
      raise ExportError(f"{where} does not record which rows were updated: export it in full")
    ids[table] = changed_rows(updated, previous.updates_applied)
    values[table] = np.asarray(rows[ids[table]])
  return values, ids

"""python -m sparsepipe.launch.export --workdir W --output E [--step N] [--since E_prev]

Writes a checkpoint of a job as an export (docs/reference/export_format.md): one
table per feature with exactly its vocabulary's rows (unstacked, unsharded,
unpadded), the dense parameters, the model and its config, the features
and the converters' hashing, and the predict function serialized with
jax.export for the CPU and the `--platforms` asked for. Any checkpoint of
any device count; the export reads it on one CPU device. With `--since
E_prev` it writes a delta: only the rows updated since E_prev, which
`python -m sparsepipe.serving.apply` (or `Predictor.load(E_prev,
deltas=[...])`) applies. It reads the checkpoint only (the features and the
converter's rules come from its copy of the training data's manifest: the
data may be gone). Nothing in the workdir changes.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

from absl import app
from absl import flags
import numpy as np

# Nothing here imports JAX, Orbax or Grain (the functions do, seconds): --help and a
# bad flag answer at once (command_line.py).
from sparsepipe import command_line


# The platforms jax.export lowers for (it records any other name unchecked).
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


def check_platforms(platforms: tuple[str, ...]) -> None:
  """ValueError naming the first of `platforms` that is not one of PLATFORMS."""
  for platform in platforms:
    if platform not in PLATFORMS:
      raise ValueError(
        f"--platforms: unknown platform '{platform}' (the predict function is lowered"
        f" for any of {', '.join(PLATFORMS)})"
      )


@contextlib.contextmanager
def _checkpoint(workdir: str, step: int | None) -> Iterator[Any]:
  """(model on one CPU device, restored model) of a workdir's checkpoint; the training
  data's description comes from the checkpoint (its data need not be there)."""
  import jax  # pylint: disable=g-import-not-at-top

  from sparsepipe import checkpointing  # pylint: disable=g-import-not-at-top
  from sparsepipe import core  # pylint: disable=g-import-not-at-top
  from sparsepipe.launch.job import checkpoints  # pylint: disable=g-import-not-at-top
  from sparsepipe.launch.job import training_data  # pylint: disable=g-import-not-at-top
  from sparsepipe.launch.job.model import JobModel  # pylint: disable=g-import-not-at-top

  saved = checkpoints.saved_job(workdir, step)
  # The job's compilation cache (core/compile_cache.py), before anything compiles.
  core.compile_cache.enable(
    saved.config.get("compilation_cache_dir", core.compile_cache.AUTO), refused="warn"
  )
  mesh = core.make_mesh(jax.devices("cpu")[:1])
  manifest = training_data.training_manifest(saved, workdir)
  model = JobModel(saved.config, manifest, mesh)
  run = checkpointing.RunInfo.create(saved.config, mesh, data_worker_count=0)
  restored = checkpoints.restore_saved_model(saved.directory, model, run, step)
  training_data.check_training_data(saved.directory, restored.checkpoint_step, manifest)
  yield model, restored


def _tables(model: Any, restored: Any) -> dict[str, Any]:
  """{table: EmbeddingVariables of numpy} of the restored (one-device) embeddings."""
  from sparsepipe import pipeline  # pylint: disable=g-import-not-at-top

  return pipeline.unstack_embedding_variables(
    restored.train_state.embedding_variables,
    restored.feature_specs,
    num_sc_per_device=model.num_sc,
    global_device_count=1,
  )


def _serialized_predict(model: Any, leaves: list[np.ndarray], treedef: Any, features, platforms):
  """The predict function, `(param leaves, dense, {feature: [B, dim]}) -> probabilities`."""
  import jax  # pylint: disable=g-import-not-at-top

  def predict(param_leaves, dense, embeddings):
    params = jax.tree.unflatten(treedef, param_leaves)
    return jax.nn.sigmoid(model.model.apply(params, dense, embeddings))

  (b,) = jax.export.symbolic_shape("b")
  args = (
    [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves],
    jax.ShapeDtypeStruct((b, model.num_dense), np.float32),
    {f["name"]: jax.ShapeDtypeStruct((b, f["dim"]), np.float32) for f in features},
  )
  lowered_for = ("cpu", *[p for p in platforms if p != "cpu"])
  exported = jax.export.export(jax.jit(predict), platforms=lowered_for)(*args)
  return exported.serialize(), lowered_for


def _features(model: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
  """(features of the export, the converter section: manifest info and schema)."""
  from sparsepipe import pipeline  # pylint: disable=g-import-not-at-top

  manifest = model.manifest
  dims = pipeline.feature_dims_of(model.base_specs)
  features = []
  for name, feature in sorted(model.config.features.items()):
    features.append(
      {
        "name": name,
        "table": name,
        "vocab_size": int(feature.vocab_size),
        "dim": int(dims[name]),
        "combiner": str(feature.combiner),
        "weighted": bool(manifest.schema.feature(name).weighted),
        "max_ids": int(feature.max_ids),
      }
    )
  return features, {"info": dict(manifest.info), "schema": manifest.schema.to_dict()}


def _info(model, restored, *, features, converter, params, tables, previous, platforms) -> Any:
  """The export's ExportInfo (its files are listed when they are written)."""
  import jax  # pylint: disable=g-import-not-at-top

  from sparsepipe import serving  # pylint: disable=g-import-not-at-top
  from sparsepipe.pipeline.models.registry import model_name  # pylint: disable=g-import-not-at-top

  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  since = None
  if previous is not None:
    since = {"export_id": previous.export_id, "updates_applied": previous.updates_applied}
  return serving.ExportInfo(
    kind="full" if previous is None else "delta",
    export_id=serving.new_export_id(),
    job_id=restored.job_id,
    checkpoint_step=restored.checkpoint_step,
    batches_trained=restored.position.batches_trained,
    updates_applied=restored.position.updates_applied,
    since=since,
    model={
      "name": model_name(model.config.model),
      "factory": str(model.config.model.get("factory", "") or ""),
      "config": model.config.model.to_dict(),
    },
    dense_dim=model.num_dense,
    features=tuple(features),
    tables=tables,
    converter=converter,
    params={"count": len(paths), "paths": paths},
    platforms=tuple(platforms),
  )


def export_checkpoint(
  workdir: str,
  output: str,
  *,
  step: int | None = None,
  since: str | None = None,
  platforms: tuple[str, ...] = (),
  overwrite: bool = False,
) -> Any:
  """Writes checkpoint `step` (default: the newest) of `workdir` as an export; returns its info.

  With `since` (an earlier export of the same job), a delta of the rows
  updated after it. `output` is checked before anything is read
  (serving.check_export_output): never inside or over a workdir, a dataset,
  another export or the inputs; `overwrite` replaces only an export.
  """
  import jax  # pylint: disable=g-import-not-at-top

  from sparsepipe import serving  # pylint: disable=g-import-not-at-top

  check_platforms(platforms)
  inputs = [("the --workdir", workdir)] + ([("the --since export", since)] if since else [])
  serving.check_export_output(output, overwrite=overwrite, inputs=inputs)
  previous = serving.read_info(since) if since else None
  with _checkpoint(workdir, step) as (model, restored):
    tables = _tables(model, restored)
    values, ids = serving.rows_to_export(
      {t: (v.table, v.updated) for t, v in tables.items()},
      previous,
      job_id=restored.job_id,
      updates_applied=restored.position.updates_applied,
      where=f"checkpoint {restored.checkpoint_step} of '{workdir}'",
      previous_dir=since or "",
    )
    params = jax.device_get(restored.train_state.params)
    leaves, treedef = jax.tree.flatten(params)
    features, converter = _features(model)
    predict, lowered_for = _serialized_predict(model, leaves, treedef, features, platforms)
    shapes = {
      t: {"vocab_size": int(v.table.shape[0]), "dim": int(v.table.shape[1]), "rows": len(values[t])}
      for t, v in tables.items()
    }
    info = _info(
      model,
      restored,
      features=features,
      converter=converter,
      params=params,
      tables=shapes,
      previous=previous,
      platforms=lowered_for,
    )
  serving.write_export(
    output,
    info,
    params=[np.asarray(x) for x in leaves],
    tables=values,
    ids=ids,
    predict=predict,
    overwrite=overwrite,
  )
  return serving.read_info(output)


def _define_flags() -> None:
  flags.DEFINE_string("workdir", None, "The job's workdir.", required=True)
  flags.DEFINE_string("output", None, "The export directory to write.", required=True)
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the newest intact one).")
  flags.DEFINE_string("since", None, "An earlier export of the job: write only what changed.")
  flags.DEFINE_list("platforms", [], "Also lower the predict function for these (cuda, tpu).")
  flags.DEFINE_bool("overwrite", False, "Replace an existing export (only an export) at --output.")
  flags.DEFINE_bool("verbose", False, "On an error, print the traceback.")


def main(argv) -> int:
  command_line.start_command(argv)
  import jax  # pylint: disable=g-import-not-at-top

  jax.config.update("jax_platforms", "cpu")
  f = flags.FLAGS
  info = export_checkpoint(
    f.workdir,
    f.output,
    step=f.step,
    since=f.since,
    platforms=tuple(f.platforms),
    overwrite=f.overwrite,
  )
  rows = sum(t["rows"] for t in info.tables.values())
  what = "delta" if info.kind == "delta" else "export"
  print(
    f"{what} of checkpoint {info.checkpoint_step} (after batch {info.batches_trained}):"
    f" {len(info.tables)} tables, {rows:,} rows, {len(info.params['paths'])} dense"
    f" parameter arrays; predict for {', '.join(info.platforms)}: {f.output}"
  )
  if info.kind == "delta" and info.since["updates_applied"] == info.updates_applied:
    print(
      f"note: '{f.since}' holds the same {info.updates_applied} updates: no row changed (train"
      " on, then export the delta)"
    )
  return 0


if __name__ == "__main__":
  _define_flags()
  sys.exit(app.run(command_line.reports_errors(main), flags_parser=command_line.parse_flags))

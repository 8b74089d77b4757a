"""The dataset a job reads: the configured one, or a generated synthetic one;
and the one its checkpoints were trained on, whose manifest each holds a copy of
(export and evaluate read that copy, a resume checks the data against it).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

from jax.experimental import multihost_utils
import jax

from sparsepipe import checkpointing
from sparsepipe import data
from sparsepipe import transforms
from sparsepipe.data.conversion_rules import manifest_differences
from sparsepipe.launch.config import packing

# The folders of a workdir that hold its generated train and eval data.
GENERATED_DIRNAMES = ("data", "data_eval")


def synthetic_features(config: Any) -> list[data.SyntheticFeature]:
  """The configured features as synthetic-data generators."""
  return [
    data.SyntheticFeature(
      name=name,
      vocab_size=int(f.vocab_size),
      min_ids=int(f.min_ids),
      max_ids=int(f.max_ids),
      zipf_exponent=float(f.zipf_exponent),
    )
    for name, f in config.features.items()
  ]


def ensure_dataset(
  config: Any,
  workdir: str,
  *,
  show_progress: bool = True,
  check_owner: Callable[[], None] = lambda: None,
) -> str:
  """Returns the dataset directory, generating <workdir>/data if needed.

  With config.data.dir set, that dataset must exist. Otherwise process 0
  writes a synthetic dataset from config.synthetic and config.features
  (once: an existing manifest is reused) while the others wait. Reused data
  must have been generated with the same settings (seed, synthetic.*,
  features): a changed setting is an error naming it, not a silent run on
  the old data. `check_owner` runs before data is generated and before
  that error (it raises when the workdir is another job's).
  """
  if config.data.dir:
    return given_dataset("config.data.dir", config.data.dir)
  directory = training_data_dir(config, workdir)
  if jax.process_index() == 0:
    try:
      _resolve_packing(config, data.read_manifest(directory))
    except data.ManifestError:
      check_owner()
      _resolve_packing(config, None)
      synth = config.synthetic
      eval_examples = int(synth.eval_examples)
      data.write_synthetic(
        directory,
        synthetic_features(config),
        num_examples=int(synth.num_examples),
        num_dense=int(synth.num_dense),
        seed=int(config.seed),
        eval_output=_generated_eval_dir(workdir) if eval_examples else None,
        eval_examples=eval_examples or None,
        examples_per_record=int(synth.examples_per_record),
        max_records_per_shard=int(synth.records_per_shard),
        overwrite=True,
        show_progress=show_progress,
      )
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("sparsepipe:dataset_ready")
  manifest = data.read_manifest(directory)
  _resolve_packing(config, manifest)  # the other processes: as process 0 generated it
  converter = manifest.info.get("converter")
  if converter:
    check_owner()
    raise ValueError(
      f"'{directory}' holds a dataset converted by {converter}, not data this job generates:"
      f" give it as --config.data.dir, or use a new --workdir"
    )
  changed = synthetic_changes(manifest, config)
  if changed:
    check_owner()
    raise ValueError(
      f"'{directory}' holds synthetic data generated with other settings ({'; '.join(changed)}):"
      f" use a new --workdir, or delete '{directory}' to generate the data again"
    )
  return directory


def training_data_dir(config: Any, workdir: str) -> str:
  """Where the job's training data is: config.data.dir, else <workdir>/data."""
  return os.path.abspath(config.data.dir or os.path.join(workdir, GENERATED_DIRNAMES[0]))


def _resolve_packing(config: Any, generated: data.Manifest | None) -> None:
  """synthetic.examples_per_record's default (0): the generated data's packing, else
  a new job's (config/packing.py); a resumed job's was set from its checkpoint."""
  known = None if generated is None else generated.examples_per_record
  config.synthetic.examples_per_record = packing.examples_per_record(
    config.synthetic.examples_per_record, known
  )


def _generated_eval_dir(workdir: str) -> str:
  return os.path.join(workdir, GENERATED_DIRNAMES[1])


def given_dataset(field: str, value: str) -> str:
  """The absolute path of `field` (a config field or a flag), a dataset; else a
  ManifestError naming the field."""
  directory = os.path.abspath(value)
  try:
    data.read_manifest(directory)
  except data.ManifestError as e:
    raise data.ManifestError(f"{field}={value!r}: {e}") from None
  return directory


def eval_data_dir(config: Any, workdir: str) -> str:
  """The job's held-out dataset: config.eval.data_dir, else the generated eval
  split (synthetic.eval_examples > 0, no data.dir), else "" (no eval)."""
  if config.eval.data_dir:
    return given_dataset("config.eval.data_dir", config.eval.data_dir)
  if not config.data.dir and int(config.synthetic.eval_examples):
    return _generated_eval_dir(workdir)
  return ""


def synthetic_changes(manifest: data.Manifest, config: Any) -> list[str]:
  """The generation settings in which `manifest`'s data and `config` differ, as 'was X, now Y'."""
  synth = config.synthetic
  changes = []

  def compare(name: str, old: Any, new: Any) -> None:
    if old != new:
      changes.append(f"{name} was {old}, the config says {new}")

  compare("synthetic.num_examples", manifest.num_examples, int(synth.num_examples))
  compare("synthetic.num_dense", manifest.schema.num_dense, int(synth.num_dense))
  compare(
    "synthetic.examples_per_record", manifest.examples_per_record, int(synth.examples_per_record)
  )
  per_shard = int(synth.records_per_shard)
  counts = [s.num_records for s in manifest.shards]
  if any(c != per_shard for c in counts[:-1]) or counts[-1] > per_shard:
    changes.append(
      f"synthetic.records_per_shard: the shards hold {counts} records, the config says {per_shard}"
      if len(counts) <= 4
      else f"synthetic.records_per_shard was {counts[0]}, the config says {per_shard}"
    )
  info = manifest.info
  if "seed" in info:
    compare("seed", info["seed"], int(config.seed))
  if "features" in info:
    old = {f["name"]: f for f in info["features"]}
    new = {f.name: dataclasses.asdict(f) for f in synthetic_features(config)}
    compare("the feature names", sorted(old), sorted(new))
    for name in sorted(old.keys() & new.keys()):
      for key in sorted(old[name].keys() & new[name].keys()):
        compare(f"features.{name}.{key}", old[name][key], new[name][key])
  return changes


def training_manifest(saved: Any, workdir: str) -> data.Manifest:
  """The manifest of the data a saved job (checkpoints.SavedJob) trained on: the
  checkpoint's copy, so that export and evaluate need no training data; for steps
  saved by 0.3 and earlier, which hold none, the dataset's own, which must then be
  there (it is not generated again: export and evaluate change nothing)."""
  data_dir = training_data_dir(saved.config, os.path.abspath(workdir))
  if saved.training_data is not None:
    where = f"checkpoint {saved.step} in '{saved.directory}' (its copy of the data's manifest)"
    return data.Manifest.from_dict(saved.training_data, data_dir, where=where)
  try:
    if saved.config.data.dir:
      return data.read_manifest(given_dataset("config.data.dir", saved.config.data.dir))
    return data.read_manifest(data_dir)
  except data.ManifestError as e:
    raise data.ManifestError(
      f"{e}: checkpoint {saved.step} holds no copy of the training data's manifest (steps"
      " saved by sparsepipe 0.3 and earlier), so the job's dataset must be there"
    ) from None


def check_training_data(directory: str, step: int, manifest: data.Manifest) -> None:
  """ValueError unless `manifest` describes the dataset checkpoint `step` was
  trained on, by the fingerprints its data iterator saved (transforms: schema,
  shards and counts; the conversion's rules where recorded). For steps of 0.3 and
  earlier, whose data export and evaluate read: a dataset converted again since,
  e.g. with another dense transform, gave an export that scored raw rows otherwise
  than the model was trained, without a word."""
  where = os.path.join(directory, str(step))
  if not os.path.isdir(where):  # a running job deleted it since it was read
    return
  (saved, *_) = checkpointing.read_iterator_states(os.path.join(where, "data_iter"), where=where)
  now = {
    "dataset": transforms.dataset_fingerprint(manifest),
    "conversion": transforms.conversion_fingerprint(manifest),
  }
  changed = [
    f"{key} {now[key]} there, {saved['metadata'][key]} in the checkpoint"
    for key in now
    if key in saved["metadata"] and saved["metadata"][key] != now[key]
  ]
  if changed:
    raise ValueError(
      f"the training data '{manifest.directory}' is not the dataset checkpoint {step} was"
      f" trained on (fingerprints: {'; '.join(changed)}): it was converted or generated again"
      " since. Put the job's dataset back there (same inputs and options)"
    )


def check_resumed_data(mngr: checkpointing.TrainingCheckpointManager, now: data.Manifest) -> None:
  """IncompatibleCheckpointError naming what differs when the job's newest checkpoint
  was trained on other data than the dataset `now` at its path (its copy of the
  training data's manifest). The data iterator's check named two fingerprints only.
  Steps without a copy (0.3), or whose metadata is unreadable, are left to the restore."""
  step = mngr.latest_step()
  try:
    saved = None if step is None else mngr.read_metadata(step).training_data
  except checkpointing.CorruptCheckpointError:
    return
  if saved is None:
    return
  trained = data.Manifest.from_dict(saved, now.directory, where=mngr.where(step))
  differences = _differences(now, trained)
  if differences:
    raise checkpointing.IncompatibleCheckpointError(
      f"the data at '{now.directory}' is not the dataset the job in"
      f" {os.path.dirname(str(mngr.directory))} trained on (checkpoint {step}): it was"
      f" converted or generated again since: {'; '.join(differences)}. Put the job's dataset"
      " back there (same inputs and options), or train on this data in a new --workdir (the"
      " checkpoints are left as they are)"
    )


def _differences(now: data.Manifest, trained: data.Manifest) -> list[str]:
  """What differs between the data `now` and the data the job `trained` on
  (data.conversion_rules.manifest_differences; the same data, too: the schema,
  counts, else the records themselves), worded "<what>: <now's> (now), <trained's>
  (trained on)"."""
  names = ("now", "trained on")
  out = manifest_differences(
    (now.info, now.schema), (trained.info, trained.schema), a_name=names[0], b_name=names[1]
  )
  if not out and now.schema != trained.schema:  # the features' order, the label's name
    schemas = [m.schema.to_dict() for m in (now, trained)]
    out.append(f"schema: {schemas[0]} ({names[0]}), {schemas[1]} ({names[1]})")
  counts = [f"{m.num_examples:,} examples in {len(m.shards)} shards" for m in (now, trained)]
  if counts[0] != counts[1]:
    out.append(f"counts: {counts[0]} ({names[0]}), {counts[1]} ({names[1]})")
  if not out and transforms.dataset_fingerprint(now) != transforms.dataset_fingerprint(trained):
    out.append("other records, in the same numbers")
  return out

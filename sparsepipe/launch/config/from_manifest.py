"""Config features from a dataset's manifest, and train/eval manifests that agree.

`configs/dataset.py` trains on whatever `data.dir` holds. Its features
cannot be written in the config file (the file is read before
`--config.data.dir` is applied), so the job calls `apply_manifest(config)`
when `config.features_from_manifest` is set: one `features` entry per
sparse feature of the train manifest:

  vocab_size  the schema's vocab_size;
  max_ids     ids per example, the first of
                manifest.info["ids_per_example"][name]["max"]  (converter stats),
                manifest.info["features"][i]["max_ids"]  (sparsepipe.data.synthetic),
                MULTIVALENT_MAX_IDS if name is in manifest.info["multivalent_columns"]
                  (sparsepipe.data.csv; .parquet: its list columns), else 1;
              it seeds the automatic COO limits (config.limits 0) and sizes
              the COO buffers: a wrong guess is caught by them (an error
              naming the feature or the stack, or counted drops with
              data.allow_id_dropping) and FDO retunes the limits;
  combiner    "sum" for single-id features (max_ids 1), "mean" for multivalent.

`check_manifests_agree` makes a train/eval pair that differ in feature
names, vocab sizes, weights, dense width or the rules their values became
ids by (data.conversion_rules) a clear error (the eval data may have more
ids per example than the train data: `with_recorded_max_ids` gives the eval
step a config whose max_ids are the most of either, so its worst-case
limits fit every eval batch), and
`check_max_ids` a config whose max_ids is below what the data's manifest
records (the job's COO buffers are sized by max_ids: a batch with more ids
would not fit), and `check_vocab_sizes` a config whose tables are smaller
than the data's vocabularies (saying how to convert the data to fit).
"""

from __future__ import annotations

from typing import Any, Mapping

import ml_collections

from sparsepipe.data.conversion_rules import COLUMN_CONVERTERS, dense_transforms
from sparsepipe.data.conversion_rules import maker, manifest_differences
from sparsepipe.data.manifest import Manifest, read_manifest
from sparsepipe.launch.config.base_config import feature

# ids per example assumed for a multivalent feature without recorded statistics.
MULTIVALENT_MAX_IDS = 16


def _recorded_max_ids(manifest: Manifest) -> dict[str, int]:
  """{feature: max ids per example} from the manifest info (see module docstring)."""
  info = manifest.info if isinstance(manifest.info, Mapping) else {}
  found: dict[str, Any] = {}
  for entry in info.get("features", ()) if isinstance(info.get("features"), list) else ():
    if isinstance(entry, Mapping) and "name" in entry and "max_ids" in entry:
      found[str(entry["name"])] = entry["max_ids"]
  stats = info.get("ids_per_example")
  if isinstance(stats, Mapping):
    for name, value in stats.items():
      if isinstance(value, Mapping) and "max" in value:
        found[str(name)] = value["max"]
  out = {}
  for name, value in found.items():
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or value != int(value) or value < 0:
      raise ValueError(
        f"dataset '{manifest.directory}': recorded max ids per example of feature"
        f" '{name}' is {value!r}, not a non-negative integer"
      )
    out[name] = int(value)
  return out


def features_from_manifest(manifest: Manifest) -> ml_collections.ConfigDict:
  """The config's `features` for the sparse features of `manifest`."""
  recorded = _recorded_max_ids(manifest)
  info = manifest.info if isinstance(manifest.info, Mapping) else {}
  listed = info.get("multivalent_columns") or ()
  multivalent = {listed} if isinstance(listed, str) else set(listed)
  features = {}
  for f in manifest.schema.sparse:
    if f.name in recorded:
      max_ids = max(1, recorded[f.name])
    else:
      max_ids = MULTIVALENT_MAX_IDS if f.name in multivalent else 1
    combiner = "sum" if max_ids == 1 else "mean"
    features[f.name] = feature(f.vocab_size, min_ids=0, max_ids=max_ids, combiner=combiner)
  return ml_collections.ConfigDict(features)


def check_max_ids(config: Any, manifest: Manifest) -> None:
  """ValueError naming each configured feature whose max_ids is below the
  most ids of one example the manifest records (no record: not checked)."""
  recorded = _recorded_max_ids(manifest)
  problems = [
    f"'{name}' has examples of {recorded[name]} ids, config.features.{name}.max_ids ="
    f" {int(feature.max_ids)}"
    for name, feature in config.features.items()
    if recorded.get(name, 0) > int(feature.max_ids)
  ]
  if problems:
    raise ValueError(
      f"dataset '{manifest.directory}': feature "
      + "; ".join(problems)
      + " (the COO buffers are sized by max_ids): raise max_ids to at least the data's"
    )


def with_recorded_max_ids(config: Any, manifest: Manifest) -> Any:
  """A copy of `config` whose features' max_ids are at least the most ids of one
  example `manifest` records (a feature without a record keeps its max_ids)."""
  recorded = _recorded_max_ids(manifest)
  out = config.copy_and_resolve_references()
  for name, feature_config in out.features.items():
    feature_config.max_ids = max(int(feature_config.max_ids), recorded.get(name, 0))
  return out


def check_vocab_sizes(config: Any, manifest: Manifest) -> None:
  """ValueError naming each configured feature whose table is smaller than the data's
  vocabulary (ids up to the data's vocab_size would not fit), and what to do."""
  problems = []
  for name, feature_config in config.features.items():
    if name not in manifest.schema.feature_names:
      continue  # named by the input's check, with the data's features
    data_vocab = manifest.schema.feature(name).vocab_size
    if data_vocab > int(feature_config.vocab_size):
      problems.append(
        f"'{name}' has vocab_size {data_vocab:,} in the data,"
        f" config.features.{name}.vocab_size = {int(feature_config.vocab_size):,}"
      )
  if problems:
    shown = "; ".join(problems[:3]) + (
      f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
    )
    raise ValueError(
      f"dataset '{manifest.directory}': the config's tables are smaller than the data's"
      f" vocabularies: feature {shown}. Convert the data with the config's vocabulary sizes"
      " (the converter's --vocab_sizes flag; for --config=criteo its VOCAB_SIZES, see"
      " docs/reference/config.md), or train on this data with --config=dataset (its tables"
      " follow the data's manifest)"
    )


def check_manifests_agree(train: Manifest, evaluation: Manifest) -> None:
  """Raises ValueError listing every difference of converter (CSV and Parquet are
  one), names, vocab sizes, weights, dense width and the conversion's rules
  (data.conversion_rules.manifest_differences), with how to convert the eval data
  alike where --like does."""
  problems = manifest_differences(
    (evaluation.info, evaluation.schema), (train.info, train.schema), a_name="eval", b_name="train"
  )
  if problems:
    raise ValueError(
      f"train data '{train.directory}' and eval data '{evaluation.directory}' disagree: "
      + "; ".join(problems)
      + _like_hint(train, evaluation)
    )


def _like_hint(train: Manifest, evaluation: Manifest) -> str:
  """Says to convert the eval data with --like when that mends a difference found
  above: two column conversions whose vocabulary sizes or dense transforms differ."""
  if not {maker(train.info), maker(evaluation.info)} <= COLUMN_CONVERTERS:
    return ""
  common = [n for n in train.schema.feature_names if n in evaluation.schema.feature_names]
  sizes_differ = any(
    train.schema.feature(n).vocab_size != evaluation.schema.feature(n).vocab_size for n in common
  )
  transforms_differ = train.schema.dense_names == evaluation.schema.dense_names and (
    dense_transforms(train.info, train.schema)
    != dense_transforms(evaluation.info, evaluation.schema)
  )
  if not (sizes_differ or transforms_differ):
    return ""
  if not _still_there(train):
    sizes = ",".join(f"{f.name}={f.vocab_size}" for f in train.schema.sparse)
    return (
      f" (the train data at '{train.directory}' is gone or converted again since the job"
      " trained on it, so --like cannot take its rules from there: convert the eval data"
      f" with --vocab_sizes={sizes} and the dense transforms"
      f" {dense_transforms(train.info, train.schema)!r}, or put the train data back)"
    )
  return (
    f" (convert the eval data with --like={train.directory} to take the train data's"
    " vocabulary sizes and dense transforms)"
  )


def _still_there(train: Manifest) -> bool:
  """Whether `train`'s directory still holds that data, converted by the same rules
  (a job's checkpoint keeps a copy of its training data's manifest: the data may be
  gone, or converted again under the same path)."""
  try:
    there = read_manifest(train.directory)
  except ValueError:  # ManifestError: gone, or no dataset
    return False
  rules = manifest_differences(
    (there.info, there.schema), (train.info, train.schema), a_name="", b_name=""
  )
  return there.schema == train.schema and not rules


def apply_manifest(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of `config` with features and synthetic.num_dense from config.data.dir.

  With config.eval.data_dir set, the eval manifest must agree with the
  train manifest (check_manifests_agree).
  """
  if not config.data.dir:
    raise ValueError(
      "config.features_from_manifest: the features come from the train data, set"
      " --config.data.dir to a dataset directory (with manifest.json)"
    )
  train = read_manifest(config.data.dir)
  eval_dir = config.get("eval", {}).get("data_dir", "")
  if eval_dir:
    check_manifests_agree(train, read_manifest(eval_dir))
  config = ml_collections.ConfigDict(config.to_dict())
  config.features = features_from_manifest(train)
  config.synthetic.num_dense = train.schema.num_dense
  return config

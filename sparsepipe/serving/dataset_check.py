"""Whether a dataset was converted as an export's training data was.

The ids of a dataset mean what the model learned only if its values were
turned into ids (and dense floats) by the same rules: the same features
with the same vocabularies and hashing, the same dense columns in the same
order with the same transform. Scoring a dataset converted otherwise would
give numbers without a word; `check_dataset` compares its manifest with
the export's (`converter`: the training data's manifest info and schema)
and names the first differences. What only describes the data (inputs,
seed, split, ids per example, label threshold) may differ.
"""

from __future__ import annotations

from typing import Any, Mapping

from sparsepipe.data.manifest import Manifest
from sparsepipe.data.schema import ExampleSchema
from sparsepipe.serving.export_format import ExportInfo

# The rules of the converters' info that decide ids and dense values, with
# the value a converter uses when the info does not record the option.
_RULES = {
  "hash": None,
  "empty_category": "drop",
  "integer_id_columns": (),
  "multivalent_columns": (),
  "separator": "|",
  "weight_columns": None,
}
_SHOWN = 3  # differences named in the message


class DatasetMismatchError(ValueError):
  """A dataset converted otherwise than the export's training data; names both."""


def _maker(info: Mapping[str, Any]) -> Any:
  return info.get("converter") or info.get("generator")


def _normalized(key: str, value: Any) -> Any:
  if key in ("integer_id_columns", "multivalent_columns"):
    return sorted(value or ())
  if key == "weight_columns" and isinstance(value, (list, tuple)):  # ["feature=column"]
    return dict(str(v).split("=", 1) for v in value)
  return value


def _dense_transforms(info: Mapping[str, Any], schema: ExampleSchema) -> Any:
  """{dense column: transform} for one transform given for all, as given otherwise."""
  value = info.get("dense_transform", "none")
  if isinstance(value, str) and info.get("converter") != "sparsepipe.data.criteo":
    return dict.fromkeys(schema.dense_names, value)
  return value


def _schema_differences(got: ExampleSchema, want: ExampleSchema) -> list[str]:
  out = []
  if got.num_dense != want.num_dense:
    out.append(
      f"{got.num_dense} dense columns {list(got.dense_names)} there,"
      f" {want.num_dense} {list(want.dense_names)} in the export"
    )
  elif got.dense_names and want.dense_names and got.dense_names != want.dense_names:
    out.append(
      f"dense columns {list(got.dense_names)} there, {list(want.dense_names)} in the export"
    )
  names, wanted = set(got.feature_names), set(want.feature_names)
  if wanted - names:
    out.append(f"no feature(s) {sorted(wanted - names)} there")
  if names - wanted:
    out.append(f"feature(s) {sorted(names - wanted)} there that the export has not")
  for feature in want.sparse:
    if feature.name in names:
      other = got.feature(feature.name)
      if other.vocab_size != feature.vocab_size:
        out.append(
          f"feature '{feature.name}' has vocab_size {other.vocab_size} there,"
          f" {feature.vocab_size} in the export"
        )
      if other.weighted != feature.weighted:
        out.append(
          f"feature '{feature.name}' is {'' if other.weighted else 'not '}weighted there,"
          f" {'' if feature.weighted else 'not '}in the export"
        )
  return out


def dataset_differences(manifest: Manifest, converter: Mapping[str, Any]) -> list[str]:
  """What differs between a dataset's conversion and the export's `converter` section."""
  info, want_info = manifest.info, converter["info"]
  want = ExampleSchema.from_dict(converter["schema"])
  if _maker(info) != _maker(want_info):
    return [f"made by {_maker(info)!r} there, by {_maker(want_info)!r} for the export"]
  out = _schema_differences(manifest.schema, want)
  got_dense = _dense_transforms(info, manifest.schema)
  want_dense = _dense_transforms(want_info, want)
  if manifest.schema.dense_names == want.dense_names and got_dense != want_dense:
    out.append(f"dense_transform {got_dense!r} there, {want_dense!r} in the export")
  for key, default in _RULES.items():
    got, wanted = (_normalized(key, d.get(key, default)) for d in (info, want_info))
    if got != wanted:
      out.append(f"{key} {got!r} there, {wanted!r} in the export")
  return out


def check_dataset(manifest: Manifest, info: ExportInfo, export: str) -> None:
  """DatasetMismatchError naming the dataset, `export` and the first differences."""
  differences = dataset_differences(manifest, info.converter)
  if differences:
    more = len(differences) - _SHOWN
    raise DatasetMismatchError(
      f"dataset '{manifest.directory}' was not converted as the training data of {export}: "
      + "; ".join(differences[:_SHOWN])
      + (f" (and {more} more)" if more > 0 else "")
      + "; convert it with the same columns and options"
    )

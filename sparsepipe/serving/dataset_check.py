"""Whether a dataset was converted as an export's training data was.

Scoring a dataset converted otherwise would give numbers without a word
(data.conversion_rules): `check_dataset` compares its manifest with the
export's (`converter`: the training data's manifest info and schema) and
names the first differences: the converter (CSV and Parquet count as one:
they convert a table by the same rules), the features, their
vocabularies and weights, the dense width, and the conversion's rules.
"""

from __future__ import annotations

from typing import Any, Mapping

from sparsepipe.data.conversion_rules import maker_difference
from sparsepipe.data.conversion_rules import rule_differences
from sparsepipe.data.manifest import Manifest
from sparsepipe.data.schema import ExampleSchema
from sparsepipe.serving.export_format import ExportInfo

_SHOWN = 3  # differences named in the message


class DatasetMismatchError(ValueError):
  """A dataset converted otherwise than the export's training data; names both."""


def _schema_differences(got: ExampleSchema, want: ExampleSchema) -> list[str]:
  out = []
  if got.num_dense != want.num_dense:
    out.append(
      f"{got.num_dense} dense columns {list(got.dense_names)} there,"
      f" {want.num_dense} {list(want.dense_names)} in the export"
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
  maker = maker_difference(info, want_info, there="there", here="for the export")
  if maker:
    return [maker]
  out = _schema_differences(manifest.schema, want)
  got_rules, want_rules = (info, manifest.schema), (want_info, want)
  return out + rule_differences(got_rules, want_rules, there="there", here="in the export")


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

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

from sparsepipe.data.conversion_rules import manifest_differences
from sparsepipe.data.manifest import Manifest
from sparsepipe.data.schema import ExampleSchema
from sparsepipe.serving.export_format import ExportInfo

_SHOWN = 3  # differences named in the message


class DatasetMismatchError(ValueError):
  """A dataset converted otherwise than the export's training data; names both."""


def dataset_differences(manifest: Manifest, converter: Mapping[str, Any]) -> list[str]:
  """What differs between a dataset's conversion and the export's `converter` section."""
  want = (converter["info"], ExampleSchema.from_dict(converter["schema"]))
  return manifest_differences(
    (manifest.info, manifest.schema), want, a_name="dataset", b_name="export"
  )


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

"""The rules by which a dataset's raw values became ids and dense floats.

Two datasets mean the same by the same ids only if their values were turned
into ids (and dense floats) by the same rules: the hashing, how empty
categories, integer ids, multivalent fields and weights were read, and the
same dense columns in the same order with the same transform (and the same
features, vocabulary sizes and weights). A model trained on one and evaluated
or served on the other gives numbers without a word, so serving
(serving.dataset_check), the job's eval data (launch.config.from_manifest) and
a resume (launch.job.training_data) compare two manifests with `manifest_differences`,
which words each difference alike. What only describes the data (inputs, seed,
split, ids per example, label threshold) may differ.
"""

from __future__ import annotations

from typing import Any, Mapping

from sparsepipe.data.schema import ExampleSchema

# The rules of the converters' info that decide ids and dense values, with
# the value a converter uses when the info does not record the option.
RULES = {
  "hash": None,
  "empty_category": "drop",
  "integer_id_columns": (),
  "multivalent_columns": (),
  "separator": "|",
  "weight_columns": None,
}


# The converters of a table's columns (with --like: a held-out file converted as the
# train data was).
COLUMN_CONVERTERS = frozenset({"sparsepipe.data.csv", "sparsepipe.data.parquet"})

# Converters that turn a table's columns into ids and dense floats by the same
# rules: the same table gives the same dataset from either (data.parquet).
_SAME_RULES_AS = {"sparsepipe.data.parquet": "sparsepipe.data.csv"}

# Features named in a difference of vocab sizes (or weights); the others are counted.
_SHOWN_PER_KEY = 3


def maker(info: Mapping[str, Any]) -> Any:
  """The converter (or generator) that made a dataset, as its manifest info names it."""
  return info.get("converter") or info.get("generator")


def _maker_of_rules(info: Mapping[str, Any]) -> Any:
  """The maker whose rules a dataset was made by (CSV's for Parquet's)."""
  made_by = maker(info)
  return _SAME_RULES_AS.get(made_by, made_by)


def _normalized(key: str, value: Any) -> Any:
  if key in ("integer_id_columns", "multivalent_columns"):
    return sorted(value or ())
  if key == "weight_columns":  # ["feature=column"] or {feature: column}; none: None or {}
    if isinstance(value, (list, tuple)):
      value = dict(str(v).split("=", 1) for v in value)
    return value or None
  return value


def _records_list_columns(info: Mapping[str, Any]) -> bool:
  """Whether `info` says which columns were multivalent: Parquet datasets of 0.3 did not
  record their list columns (they are multivalent by type), so theirs is unknown."""
  return maker(info) != "sparsepipe.data.parquet" or "multivalent_columns" in info


def dense_transforms(info: Mapping[str, Any], schema: ExampleSchema) -> Any:
  """{dense column: transform} for one transform given for all, as given otherwise."""
  value = info.get("dense_transform", "none")
  if isinstance(value, str) and info.get("converter") != "sparsepipe.data.criteo":
    return dict.fromkeys(schema.dense_names, value)
  return value


def rules_of(info: Mapping[str, Any], schema: ExampleSchema) -> dict[str, Any]:
  """A dataset's rules as JSON (its maker, dense columns and transforms, RULES): equal
  for datasets whose raw values became ids and dense floats alike."""
  rules = {key: _normalized(key, info.get(key, default)) for key, default in RULES.items()}
  return {
    **rules,
    "maker": _maker_of_rules(info),
    "dense_columns": list(schema.dense_names),
    "dense_transform": dense_transforms(info, schema),
  }


def manifest_differences(
  a: tuple[Mapping[str, Any], ExampleSchema],
  b: tuple[Mapping[str, Any], ExampleSchema],
  *,
  a_name: str,
  b_name: str,
) -> list[str]:
  """What differs between the datasets `a` and `b` (each: manifest info, schema) in what
  their ids and dense floats mean: the maker (CSV and Parquet are one), the features,
  their vocab sizes and weights, the dense columns and the rules (RULES, the dense
  transforms), each worded "<what>: <a's value> (<a_name>), <b's value> (<b_name>)"."""
  (a_info, a_schema), (b_info, b_schema) = a, b
  out = []

  def differ(what: str, a_value: Any, b_value: Any) -> None:
    if a_value != b_value:
      out.append(f"{what}: {a_value!r} ({a_name}), {b_value!r} ({b_name})")

  if _maker_of_rules(a_info) != _maker_of_rules(b_info):
    differ("made by", maker(a_info), maker(b_info))
  a_features, b_features = a_schema.feature_names, b_schema.feature_names
  differ(
    "features the other lacks",
    [n for n in a_features if n not in b_features],
    [n for n in b_features if n not in a_features],
  )
  common = [n for n in b_features if n in a_features]
  for key in ("vocab_size", "weighted"):
    values = [
      (getattr(a_schema.feature(n), key), getattr(b_schema.feature(n), key)) for n in common
    ]
    changed = [(n, x, y) for n, (x, y) in zip(common, values) if x != y]
    for name, a_value, b_value in changed[:_SHOWN_PER_KEY]:
      differ(f"feature '{name}' {key}", a_value, b_value)
    if len(changed) > _SHOWN_PER_KEY:
      out.append(f"the {key} of {len(changed) - _SHOWN_PER_KEY} more features")
  a_dense, b_dense = a_schema.dense_names, b_schema.dense_names
  if a_schema.num_dense != b_schema.num_dense or (a_dense and b_dense and a_dense != b_dense):
    differ(
      "dense columns", list(a_dense) or a_schema.num_dense, list(b_dense) or b_schema.num_dense
    )
  if a_dense == b_dense:
    differ(
      "dense_transform", dense_transforms(a_info, a_schema), dense_transforms(b_info, b_schema)
    )
  for key, default in RULES.items():
    if key == "multivalent_columns" and not all(map(_records_list_columns, (a_info, b_info))):
      continue
    differ(key, *(_normalized(key, i.get(key, default)) for i in (a_info, b_info)))
  return out

"""The rules by which a dataset's raw values became ids and dense floats.

Two datasets mean the same by the same ids only if their values were turned
into ids (and dense floats) by the same rules: the hashing, how empty
categories, integer ids, multivalent fields and weights were read, and the
same dense columns in the same order with the same transform. A model
trained on one and evaluated or served on the other gives numbers without a
word, so serving (serving.dataset_check) and the job's eval data
(launch.config.from_manifest) compare them with `rule_differences`. What
only describes the data (inputs, seed, split, ids per example, label
threshold) may differ.
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


def maker(info: Mapping[str, Any]) -> Any:
  """The converter (or generator) that made a dataset, as its manifest info names it."""
  return info.get("converter") or info.get("generator")


def maker_difference(
  got: Mapping[str, Any], want: Mapping[str, Any], *, there: str, here: str
) -> str | None:
  """ "made by <got's maker> {there}, by <want's> {here}" when the manifest infos
  `got` and `want` come from makers of other rules (CSV and Parquet share theirs)."""
  got_maker, want_maker = maker(got), maker(want)
  if _SAME_RULES_AS.get(got_maker, got_maker) == _SAME_RULES_AS.get(want_maker, want_maker):
    return None
  return f"made by {got_maker!r} {there}, by {want_maker!r} {here}"


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
  made_by = maker(info)
  rules = {key: _normalized(key, info.get(key, default)) for key, default in RULES.items()}
  return {
    **rules,
    "maker": _SAME_RULES_AS.get(made_by, made_by),
    "dense_columns": list(schema.dense_names),
    "dense_transform": dense_transforms(info, schema),
  }


def rule_differences(
  got: tuple[Mapping[str, Any], ExampleSchema],
  want: tuple[Mapping[str, Any], ExampleSchema],
  *,
  there: str,
  here: str,
) -> list[str]:
  """What differs between the rules of `got` and `want` (each: manifest info, schema),
  worded "<rule> <got's value> {there}, <want's value> {here}"."""
  (got_info, got_schema), (want_info, want_schema) = got, want
  out = []
  got_names, want_names = got_schema.dense_names, want_schema.dense_names
  if len(got_names) == len(want_names) and got_names and want_names and got_names != want_names:
    out.append(f"dense columns {list(got_names)} {there}, {list(want_names)} {here}")
  got_dense = dense_transforms(got_info, got_schema)
  want_dense = dense_transforms(want_info, want_schema)
  if got_names == want_names and got_dense != want_dense:
    out.append(f"dense_transform {got_dense!r} {there}, {want_dense!r} {here}")
  for key, default in RULES.items():
    if key == "multivalent_columns" and not all(map(_records_list_columns, (got_info, want_info))):
      continue
    got_rule, want_rule = (_normalized(key, i.get(key, default)) for i in (got_info, want_info))
    if got_rule != want_rule:
      out.append(f"{key} {got_rule!r} {there}, {want_rule!r} {here}")
  return out

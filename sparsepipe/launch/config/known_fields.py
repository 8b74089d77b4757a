"""A config's fields against the base config's: a misspelt one is refused, a missing one
takes its default.

A config file sets fields by assignment, and ml_collections checks that
against nothing: `config.num_stepz = 3` added a field no part reads, and
the job trained its 1000 batches with status 0. `complete_config` refuses
every field `base_config()` lacks, naming the closest one, except under
`model` with a `model.factory` (a user model's own fields,
docs/guide/models.md); and a field the file left out (a config built without
base_config, a feature entry without `combiner`) takes its default from
docs/reference/config.md, as it would have in a file that starts from base_config.
"""

from __future__ import annotations

import difflib
from typing import Any, Iterator, Mapping

import ml_collections

from sparsepipe.launch.config.fields import REQUIRED
from sparsepipe.launch.config.fields import config_fields

# What holds fields (a field of these types is a group, not a value).
_GROUPS = (Mapping, ml_collections.ConfigDict)
# Groups whose fields a config may add: a user model (config.model.factory) reads its own;
# a built-in model's fields are checked as any others.
_OPEN_GROUPS = ("model.",)


def _leaves(node: Any, prefix: str = "") -> Iterator[str]:
  """Dotted names of the values (not groups, nor empty ones) under `node`."""
  for key in node.keys():
    value = node[key]
    if isinstance(value, _GROUPS):
      yield from _leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}"


def _pattern(field: str) -> str:
  """`features.C1.max_ids` -> `features.NAME.max_ids` (config_fields' name for it)."""
  parts = field.split(".")
  if parts[0] == "features" and len(parts) > 1:
    parts[1] = "NAME"
  return ".".join(parts)


def _unknown_field_error(field: str, known: Mapping[str, Any]) -> ValueError:
  pattern = _pattern(field)
  close = difflib.get_close_matches(pattern, list(known), n=1, cutoff=0.75)
  hint = ""
  if close:
    name = close[0].replace("NAME", field.split(".")[1]) if pattern != field else close[0]
    hint = f"; did you mean config.{name}?"
  return ValueError(
    f"config.{field}: the config has no such field{hint} (docs/reference/config.md lists them; a"
    " user model's own fields go under config.model, with config.model.factory)"
  )


def _set(config: ml_collections.ConfigDict, field: str, value: Any) -> None:
  """Sets the dotted `field`, making the groups on the way."""
  *groups, key = field.split(".")
  node = config
  for group in groups:
    if group not in node:
      node[group] = ml_collections.ConfigDict()
    node = node[group]
  node[key] = value


def complete_config(config: Any, overrides_to_come: bool = False) -> ml_collections.ConfigDict:
  """`config` with the defaults of the fields it lacks; ValueError naming a field it sets
  that the base config lacks (see the module docstring). A plain dict becomes a
  ConfigDict. `overrides_to_come`: a config file before its command line, which may
  still give model.factory or features_from_manifest (checked after it)."""
  if isinstance(config, Mapping) and not isinstance(config, ml_collections.ConfigDict):
    config = ml_collections.ConfigDict(config)
  if not isinstance(config, ml_collections.ConfigDict):
    raise ValueError(
      f"the config is a {type(config).__name__}, not an ml_collections.ConfigDict: a config"
      " file's get_config() returns one"
      " (start from sparsepipe.launch.config.base_config.base_config)"
    )
  known = config_fields()
  user_model = overrides_to_come or bool(config.get("model", {}).get("factory", ""))
  for field in _leaves(config):
    own = user_model and field.startswith(_OPEN_GROUPS)
    if _pattern(field) not in known and not own:
      raise _unknown_field_error(field, known)
  features = list(config.get("features", {}).keys())
  manifest = config.get("features_from_manifest", False)
  if not (features or manifest or overrides_to_come):  # the command line may set it
    raise ValueError(
      "config.features names no feature: give each one's vocab_size"
      " (config.features.NAME = sparsepipe.launch.config.base_config.feature(vocab_size)),"
      " or take them from a dataset with features_from_manifest=True (--config=dataset)"
    )
  with config.unlocked():
    for pattern, default in known.items():
      names = features if pattern.startswith("features.NAME.") else [None]
      for name in names:
        field = pattern.replace("NAME", name) if name else pattern
        if _has(config, field):
          continue
        if pattern in REQUIRED:
          raise ValueError(f"config.{field} is required (it has no default)")
        _set(config, field, default)
  return config


def _has(config: ml_collections.ConfigDict, field: str) -> bool:
  node: Any = config
  for key in field.split("."):
    if not isinstance(node, _GROUPS) or key not in node:
      return False
    node = node[key]
  return True

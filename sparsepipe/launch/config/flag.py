"""The launchers' `--config` flag: a shipped config's name or a config file.

ml_collections' config-file flag, with its own command-line overrides
(`--config.num_steps=100`), whose parser also takes the name of a shipped
config (`--config=criteo`) and says in one line what is wrong with a path
that is neither. `config_name` is what names the job's default workdir;
`top_level_field_line` is the error for a field given as a flag of its own
(`--num_steps=80`: it names --config.num_steps=80).
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
from typing import Any, Sequence

from absl import flags
from ml_collections import config_flags

from sparsepipe.launch.config.fields import config_fields
from sparsepipe.launch.config.known_fields import complete_config
from sparsepipe.launch.config.shipped import config_path
from sparsepipe.launch.config.shipped import shipped_config_names


class _FileOrName(flags.ArgumentParser):
  """Wraps ml_collections' config-file parser: shipped names resolve to their files."""

  def __init__(self, file_parser: flags.ArgumentParser):
    self._file_parser = file_parser

  def parse(self, argument: str) -> Any:
    file, _, arg = argument.partition(":")
    resolved = config_path(file) or file
    if not os.path.isfile(resolved):
      names = ", ".join(shipped_config_names())
      raise ValueError(
        f"no config file '{file}' (from {os.getcwd()}); the shipped configs are {names},"
        " e.g. --config=demo"
      )
    # Completed before the command line's overrides, which may set what it left out.
    config = self._file_parser.parse(resolved + (":" + arg if arg else ""))
    return complete_config(config, overrides_to_come=True)

  def flag_type(self) -> str:
    return self._file_parser.flag_type()


def define_config_flag(default: str = "demo") -> flags.FlagHolder:
  """Defines --config (a shipped name or a file) with ml_collections' overrides."""
  holder = config_flags.DEFINE_config_file(
    "config",
    config_path(default),
    "ml_collections config: a shipped config's name "
    f"({', '.join(shipped_config_names())}) or a config file; fields are overridden with"
    " --config.FIELD=VALUE (docs/reference/config.md).",
    lock_config=True,
  )
  flag = flags.FLAGS["config"]
  flag.parser = _FileOrName(flag.parser)
  return holder


def config_help() -> str:
  """What --help adds for the launchers: the config's top-level fields and where
  each field is documented (absl's usage lists flags, not config fields)."""
  config = flags.FLAGS["config"].value  # the default's, or a --config=... given before --help
  fields = []
  for key in sorted(config.keys()):
    value = config[key]
    if key == "features":
      fields.append("features.NAME.*")
    elif hasattr(value, "items"):
      fields.append(f"{key}.*")
    else:
      fields.append(f"{key}={value!r}")
  return "\n".join(
    [
      "Config fields and this config's values (set any with --config.FIELD=VALUE;",
      "docs/reference/config.md lists each field's default, units and meaning):",
      *textwrap.wrap(", ".join(fields), 78, initial_indent="  ", subsequent_indent="  "),
    ]
  )


def config_name(flag_value: str | None) -> str:
  """The config's name (the --config value as given: a shipped name, or a file's stem)."""
  value = (flag_value or "demo").partition(":")[0]
  return os.path.splitext(os.path.basename(value))[0] or "demo"


def parse_flags_or_exit(argv: list[str], parse: Any) -> Any:
  """Runs `parse` (which parses the flags, or defines --config and applies its
  overrides); a bad flag or config field exits with one line and status 1."""
  try:
    return parse(argv)
  except AttributeError as e:
    if "has no attribute 'get_config'" in str(e):  # ml_collections loads it as a module
      file = next((a[len("--config=") :] for a in sys.argv if a.startswith("--config=")), "")
      print(
        f"error: --config file '{file.partition(':')[0]}' defines no get_config(): a config file's"
        " get_config() returns an ml_collections.ConfigDict (docs/reference/config.md)",
        file=sys.stderr,
      )
    else:  # ml_collections: an override of no field
      print(unknown_field_message(e), file=sys.stderr)
  except KeyError as e:  # ml_collections: an override of no field
    print(unknown_field_message(e), file=sys.stderr)
  except SyntaxError as e:  # a config file that is not Python
    print(f"error: --config file '{e.filename}' line {e.lineno}: {e.msg}", file=sys.stderr)
  except flags.Error as e:
    print(f"error: {str(e).removeprefix('flag ')}", file=sys.stderr)
  sys.exit(1)


def unknown_field_message(error: BaseException) -> str:
  """One line for an override of a field the config lacks (ml_collections' 'did you mean')."""
  text = str(error.args[0] if error.args else error)
  match = re.search(r'Did you mean "([^"]+)" instead of "([^"]+)"', text)
  key = match.group(2) if match else re.search(r"(\w+)", text + " ?").group(1)
  given = [a.split("=", 1)[0] for a in sys.argv[1:] if a.startswith("--config.")]
  flag = next((g for g in given if g.split(".")[-1] == key), f"--config.*.{key}")
  if match:
    hint = f"; did you mean {match.group(1)}?"
  else:  # a field of a user model's own, most often
    hint = " (a field of your own goes into a config file: --config=FILE.py, docs/guide/models.md)"
  return f"error: {flag}: the config has no field '{key}'{hint}"


def _pattern(name: str) -> str:
  """`features.C1.max_ids` -> `features.NAME.max_ids` (config_fields' name for it)."""
  parts = name.split(".")
  if parts[0] == "features" and len(parts) == 3:
    parts[1] = "NAME"
  return ".".join(parts)


def _value_after(given: str, argv: Sequence[str]) -> str | None:
  """The argument after `given` in `argv` if it is a value (`--num_steps 80`), else None."""
  args = list(argv[1:])
  at = args.index(given) if given in args else len(args)
  following = args[at + 1] if at + 1 < len(args) else None
  return None if following is None or following.startswith("-") else following


def top_level_field_line(error: flags.UnrecognizedFlagError, argv: Sequence[str]) -> str | None:
  """The line for an unknown flag that names a config field: a --config.FIELD given
  without `config.` (`--num_steps=80`: "did you mean --config.num_steps=80?"); None
  for any other flag (absl's message names it)."""
  shown = given = str(error.flagvalue)
  name, _, value = given.lstrip("-").partition("=")
  fields = config_fields()
  if _pattern(name) not in fields and name.startswith("no") and "=" not in given:
    name, value = name[2:], "false"  # --noFIELD of a bool field
    if not isinstance(fields.get(_pattern(name)), bool):
      return None
  elif _pattern(name) not in fields:
    return None
  elif "=" not in given and not isinstance(fields[_pattern(name)], bool):  # --num_steps 80
    value = _value_after(given, argv)
    shown = given if value is None else f"{given} {value}"
    value = value or "VALUE"
  suggestion = f"--config.{name}" + (f"={value}" if value else "")
  return f"error: {shown}: no such flag; did you mean {suggestion}?"

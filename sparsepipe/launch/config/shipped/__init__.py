"""The shipped configs, installed with the package (`--config=demo`, `--config=criteo`).

`configs/*.py` in a checkout are the same configs by path.
"""

import os

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))


def shipped_config_names() -> list[str]:
  """The names of the shipped configs, sorted."""
  return sorted(n[:-3] for n in os.listdir(CONFIG_DIR) if n.endswith(".py") and n[0] != "_")


def config_path(name: str) -> str | None:
  """The file of shipped config `name` ('demo', 'criteo', ...), or None."""
  path = os.path.join(CONFIG_DIR, f"{name}.py")
  return path if name.isidentifier() and os.path.isfile(path) else None

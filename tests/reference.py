"""jax-tpu-embedding 0.1.0 (the optional `[oracle]` extra), when installed.

Tests that pin a behaviour of the reference assert literal values always,
and compare with the reference itself only where it can be imported, so
they run (and fail on a regression) without it.
"""

import importlib
from types import ModuleType


def reference_module(name: str) -> ModuleType | None:
  """`jax_tpu_embedding.sparsecore.lib.<name>`, or None without the reference."""
  try:
    return importlib.import_module("jax_tpu_embedding.sparsecore.lib." + name)
  except ImportError:  # not installed, or a dependency of it (flax) missing
    return None

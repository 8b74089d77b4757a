"""The job config's values checked before anything is made: one line naming the field.

A launch with a value the job cannot use (a learning rate of NaN or below
0, an unknown optimizer or model, a table dim of 0, -1 data workers, a
checkpoint interval of 0, FDO headroom below 1, a batch the SparseCores do
not divide) used to fail only when the part that reads it was built: after
the data was generated (data/, data_eval/ left in the workdir), after
job.json was written, or after the first batch trained NaN losses;
negative learning rates and epoch counts trained. `check_config` runs
before the data and names each such field and value. The parts check what
they read again, as before.
"""

from __future__ import annotations

import math
from typing import Any

import jax
from jax.sharding import Mesh

from sparsepipe import pipeline
from sparsepipe.launch.config import config_specs


def _number(config: Any, field: str) -> float | None:
  """config's `field` as a finite float; None when the config has no such field."""
  node = config
  for key in field.split("."):
    if key not in node:  # e.g. a config file written against an older base config
      return None
    node = node[key]
  try:
    value = float(node)
  except (TypeError, ValueError):
    raise ValueError(f"config.{field}={node!r} is not a number") from None
  if not math.isfinite(value):
    raise ValueError(f"config.{field}={node!r} must be a finite number")
  return value


def _at_least(config: Any, field: str, least: float, unit: str = "") -> None:
  value = _number(config, field)
  if value is not None and value < least:
    raise ValueError(f"config.{field}={value:g} must be >= {least:g}{unit}")


def _at_most(config: Any, field: str, most: float, unit: str = "") -> None:
  value = _number(config, field)
  if value is not None and value > most:
    raise ValueError(f"config.{field}={value:g} must be <= {most:g}{unit}")


def _check_features(config: Any) -> None:
  """The generated data's skew: a bounded Zipf needs an exponent > 0."""
  for name in sorted(config.features):
    value = _number(config, f"features.{name}.zipf_exponent")
    if value is not None and value <= 0:
      raise ValueError(f"config.features.{name}.zipf_exponent={value:g} must be > 0")


def check_config(config: Any, mesh: Mesh) -> None:
  """Raises ValueError naming the first config field whose value the job cannot use."""
  _at_least(config, "seed", 0)
  _at_most(config, "seed", 2**32 - 1)
  config_specs.check_combiners(config)
  _check_features(config)
  for field in ("embedding_optimizer.learning_rate", "dense_optimizer.learning_rate"):
    _at_least(config, field, 0.0)
  config_specs.embedding_optimizer_spec(config)
  config_specs.dense_optimizer(config, mesh)
  _at_least(config, "model.embedding_dim", 1)
  pipeline.make_model(config.model)
  config_specs.check_stacking(config)
  for field, least, unit in (
    ("num_epochs", 0, ""),
    ("global_batch_size", 0, " (0: set per_host_batch_size)"),
    ("per_host_batch_size", 0, " (0: set global_batch_size)"),
    ("data.num_workers", 0, ""),
    ("checkpoint.every_steps", 1, " (batches)"),
    ("checkpoint.keep", 1, " (checkpoints kept)"),
    ("fdo.headroom", 1, ""),
    ("fdo.steps_per_doubling", 0, " (0: exact limits)"),
    ("fdo.compile_ahead", 0, " (0: never)"),
    ("log_every_steps", 1, " (batches)"),
    ("eval.every_steps", 0, " (0: only at the end)"),
    ("synthetic.num_examples", 1, ""),
    ("synthetic.records_per_shard", 1, ""),
    ("synthetic.eval_examples", 0, " (0: no eval split)"),
    ("limits.for_devices", 0, " (0: any)"),
  ):
    _at_least(config, field, least, unit)
  _at_most(config, "fdo.compile_ahead", 1, " (a fraction of a segment)")
  batch = config_specs.global_batch_size(config, jax.process_count())
  config_specs.check_sparsecores_divide(config, batch, mesh.size)

"""The config every job reads: its fields and their defaults.

Config files (configs/*.py) start from `base_config()` and change what
their job needs; every field can be overridden on the command line
(`--config.num_steps=100`, `--config.model.bottom_mlp_dims="(64,16)"`).
What each field means, in its units, is in fields.py (FIELD_DOCS), from
which docs/reference/config.md is generated.
"""

from __future__ import annotations

from typing import Iterable

import ml_collections


def feature(
  vocab_size: int,
  *,
  min_ids: int = 1,
  max_ids: int = 1,
  zipf_exponent: float = 1.1,
  combiner: str = "sum",
) -> ml_collections.ConfigDict:
  """One `features` entry."""
  return ml_collections.ConfigDict(
    dict(
      vocab_size=vocab_size,
      min_ids=min_ids,
      max_ids=max_ids,
      zipf_exponent=zipf_exponent,
      combiner=combiner,
    )
  )


def base_config(
  features: Iterable[tuple[str, ml_collections.ConfigDict]],
) -> ml_collections.ConfigDict:
  """Every field with its default; `features` are (name, feature(...)) pairs."""
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.num_steps = 1000
  config.num_epochs = 0.0
  config.global_batch_size = 256
  config.per_host_batch_size = 0
  config.num_sc_per_device = 2
  config.log_every_steps = 10
  config.data = ml_collections.ConfigDict(
    dict(
      dir="",
      num_workers=0,
      shuffle=True,
      shuffle_window=-1,  # packing.py: a resumed job's, else 256
      skip_corrupt=False,
      allow_id_dropping=False,
    )
  )
  config.synthetic = ml_collections.ConfigDict(
    dict(
      num_examples=65536,
      num_dense=13,
      examples_per_record=0,  # packing.py: a resumed job's, else 128
      records_per_shard=16384,
      eval_examples=0,
    )
  )
  config.features = ml_collections.ConfigDict(dict(features))
  config.model = ml_collections.ConfigDict(
    dict(
      name="dlrm",
      factory="",
      embedding_dim=16,
      bottom_mlp_dims=(64, 16),
      top_mlp_dims=(64, 32),
      cross_layers=3,
      cross_rank=0,
    )
  )
  config.dense_optimizer = ml_collections.ConfigDict(dict(name="adam", learning_rate=1e-3))
  config.embedding_optimizer = ml_collections.ConfigDict(dict(name="adagrad", learning_rate=0.05))
  config.stacking = "auto"
  config.limits = ml_collections.ConfigDict(
    dict(
      max_ids_per_partition=0,
      max_unique_ids_per_partition=0,
      for_devices=0,
    )
  )
  config.fdo = ml_collections.ConfigDict(
    dict(every_steps=0, first_after=4, headroom=1.5, steps_per_doubling=8, compile_ahead=0.5)
  )
  config.pipelining = "auto"
  config.features_from_manifest = False
  config.compilation_cache_dir = "auto"
  config.eval = ml_collections.ConfigDict(dict(data_dir="", every_steps=0))
  config.checkpoint = ml_collections.ConfigDict(
    dict(
      every_steps=100,
      keep=3,
      async_save=True,
      verify_arrays=True,
      host_copy_gb=0.0,
      data_file_mb=2.0,
    )
  )
  return config

"""The dataset a job reads: the configured one, or a generated synthetic one."""

from __future__ import annotations

import os
from typing import Any

from jax.experimental import multihost_utils
import jax

from sparsepipe import data


def synthetic_features(config: Any) -> list[data.SyntheticFeature]:
  """The configured features as synthetic-data generators."""
  return [
      data.SyntheticFeature(
          name=name,
          vocab_size=int(f.vocab_size),
          min_ids=int(f.min_ids),
          max_ids=int(f.max_ids),
          zipf_exponent=float(f.zipf_exponent),
      )
      for name, f in config.features.items()
  ]


def ensure_dataset(config: Any, workdir: str, *, show_progress: bool = True) -> str:
  """Returns the dataset directory, generating <workdir>/data if needed.

  With config.data.dir set, that dataset must exist. Otherwise process 0
  writes a synthetic dataset from config.synthetic and config.features
  (once: an existing manifest is reused) while the others wait.
  """
  if config.data.dir:
    directory = os.path.abspath(config.data.dir)
    data.read_manifest(directory)  # a clear error if it is not a dataset
    return directory
  directory = os.path.join(workdir, "data")
  if jax.process_index() == 0:
    try:
      data.read_manifest(directory)
    except data.ManifestError:
      synth = config.synthetic
      data.write_synthetic(
          directory,
          synthetic_features(config),
          num_examples=int(synth.num_examples),
          num_dense=int(synth.num_dense),
          seed=int(config.seed),
          examples_per_record=int(synth.examples_per_record),
          max_records_per_shard=int(synth.records_per_shard),
          overwrite=True,
          show_progress=show_progress,
      )
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("sparsepipe:dataset_ready")
  return directory

"""The config every job reads: fields, meanings and defaults.

Config files (configs/*.py) start from `base_config()` and change what
their job needs; every field can be overridden on the command line
(`--config.num_steps=100`, `--config.model.bottom_mlp_dims="(64,16)"`).

  seed: parameter init, data shuffle and generated data.
  num_steps: batches to train (a resumed job may raise it).
  global_batch_size / per_host_batch_size: examples per batch, set exactly
    one (0 means unset). global_batch_size is the same on any number of
    processes, so a checkpoint resumes on another process count with the
    same batches; each host then reads global_batch_size / processes (an
    error if that does not divide). per_host_batch_size fixes the host's
    share instead: the global batch is per_host_batch_size * processes.
    Either way the global batch must be a multiple of devices * SCs.
  num_sc_per_device: "SparseCores" per device, the S of the COO layout (4 on
    TPU v5p/v6e; elsewhere a layout parameter).
  log_every_steps: progress-line interval (batches).
  data.dir: an ArrayRecord dataset (a manifest.json directory); empty means
    <workdir>/data, generated from `synthetic` and `features` if missing.
  data.num_workers: Grain worker processes (0: in the main process); the
    batches do not depend on it, and a resumed job may change it.
  data.shuffle / data.skip_corrupt / data.allow_id_dropping: shuffle
    records; skip and count corrupt records instead of failing; drop (and
    count) ids over the limits instead of failing.
  synthetic: the generated dataset: examples, dense width, examples packed
    per record, records per shard, and eval_examples: a held-out split of
    that many examples from the same click model (0: none).
  features: one entry per sparse feature: vocab_size, min_ids/max_ids per
    example, zipf_exponent (generated data), combiner (sum, mean, sqrtn).
  model: name: a built-in model, "dlrm" or "dcn_v2"; factory:
    "package.module:function" of your own model (called with config.model,
    returns an object with init and apply; see README "Bring your own
    model"), overrides name; embedding_dim: shared by all tables;
    bottom_mlp_dims (dlrm): the bottom MLP, its last width the interaction
    dim; top_mlp_dims (dlrm: the top MLP; dcn_v2: the MLP after the cross
    layers); cross_layers, cross_rank (dcn_v2: cross layers, and the rank
    of their kernels, 0 for full rank).
  dense_optimizer / embedding_optimizer: name (dense: sgd, adagrad, adam;
    embedding: also adagrad_momentum, ftrl, laprop, with their default
    hyperparameters) and learning rate. The dense state is ZeRO-sharded.
  stacking: "auto" stacks compatible tables into one physical table,
    "none" keeps one per feature.
  limits: COO limits per table before FDO tunes them; 0 means the worst
    case of the batch (always safe; large buffers until the first retune).
  fdo.every_steps: batches between FDO retunes (0: never); the pipeline
    drains and the step recompiles at each. fdo.headroom: new limits are
    the observed maxima times this.
  features_from_manifest: take `features` (names, vocab sizes, ids per
    example) from the manifest of data.dir (configs/dataset.py).
  pipelining: True (default) overlaps the lookup of batch i and the update
    of batch i-2 with the dense step of batch i-1; False runs them in order
    per batch (sequential mode: to debug, and to see what pipelining costs).
  eval.data_dir: a held-out dataset with the train set's features (empty:
    the generated eval split when synthetic.eval_examples > 0, else no
    eval); eval.every_steps: batches between evals (0: only at the end; with
    an eval set the job always evaluates at the end).
  checkpoint: every_steps (checkpoint steps, i.e. pipeline steps: a segment
    of n batches takes n + 2, see docs/pipeline_schedule.md), keep (newest
    kept), async_save, verify_arrays (store a fingerprint of every array so a
    garbled file is detected on restore).
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
  config.global_batch_size = 256
  config.per_host_batch_size = 0
  config.num_sc_per_device = 2
  config.log_every_steps = 10
  config.data = ml_collections.ConfigDict(
    dict(
      dir="",
      num_workers=0,
      shuffle=True,
      skip_corrupt=False,
      allow_id_dropping=False,
    )
  )
  config.synthetic = ml_collections.ConfigDict(
    dict(
      num_examples=65536,
      num_dense=13,
      examples_per_record=1,
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
    )
  )
  config.fdo = ml_collections.ConfigDict(dict(every_steps=0, headroom=1.5))
  config.pipelining = True
  config.features_from_manifest = False
  config.eval = ml_collections.ConfigDict(dict(data_dir="", every_steps=0))
  config.checkpoint = ml_collections.ConfigDict(
    dict(
      every_steps=100,
      keep=3,
      async_save=True,
      verify_arrays=True,
    )
  )
  return config

"""Demo config: a tiny DLRM on synthetic data that trains in seconds on a laptop.

Run it with `python -m sparsepipe.launch` (the default config) or
`python -m sparsepipe.launch --config=configs/demo.py --config.num_steps=100`.

Every field can be overridden on the command line. The fields:
  seed: seeds the parameter init, the data shuffle and the synthetic data.
  num_steps: batches to train.
  per_host_batch_size: examples per batch on each host (global batch =
    per_host_batch_size * processes); a multiple of local devices * SCs.
  num_sc_per_device: "SparseCores" per device, the S of the COO layout
    (real on TPU v5p/v6e: 4; a layout parameter elsewhere).
  log_every_steps: progress-line and metrics interval (batches).
  data.dir: ArrayRecord dataset (a manifest.json directory); empty means
    <workdir>/data, generated from `synthetic` if missing.
  data.num_workers: Grain worker processes (0: in the main process).
  synthetic: the generated dataset: examples, dense width, examples packed
    per record, records per shard.
  features: one entry per sparse feature: vocab_size, min_ids/max_ids per
    example, zipf_exponent, combiner; all share model.embedding_dim.
  model: embedding_dim and MLP widths of the DLRM.
  dense_optimizer / embedding_optimizer: name and learning rate.
  stacking: "auto" stacks compatible tables into one physical table,
    "none" keeps one table per feature.
  limits: initial COO limits per table before FDO tunes them; 0 means the
    worst case for the batch (safe, with large buffers until the first retune).
  fdo: every_steps (0 disables; the pipeline drains and the step recompiles
    at each retune) and headroom (limits = observed max * headroom).
  checkpoint: every_steps (pipeline steps), keep (newest kept), async_save.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.num_steps = 60
  config.per_host_batch_size = 128
  config.num_sc_per_device = 2
  config.log_every_steps = 10

  config.data = ml_collections.ConfigDict()
  config.data.dir = ""
  config.data.num_workers = 0
  config.data.shuffle = True
  config.data.skip_corrupt = False
  config.data.allow_id_dropping = False

  config.synthetic = ml_collections.ConfigDict()
  config.synthetic.num_examples = 16384
  config.synthetic.num_dense = 4
  config.synthetic.examples_per_record = 1
  config.synthetic.records_per_shard = 4096

  config.features = ml_collections.ConfigDict()
  for name, vocab, max_ids in (
      ("user", 5000, 1),
      ("item", 20000, 1),
      ("category", 100, 3),
      ("history", 20000, 8),
  ):
    feature = ml_collections.ConfigDict()
    feature.vocab_size = vocab
    feature.min_ids = 1
    feature.max_ids = max_ids
    feature.zipf_exponent = 1.1
    feature.combiner = "mean"
    config.features[name] = feature

  config.model = ml_collections.ConfigDict()
  config.model.embedding_dim = 8
  config.model.bottom_mlp_dims = (32, 8)
  config.model.top_mlp_dims = (32, 16)

  config.dense_optimizer = ml_collections.ConfigDict()
  config.dense_optimizer.name = "adam"
  config.dense_optimizer.learning_rate = 1e-3

  config.embedding_optimizer = ml_collections.ConfigDict()
  config.embedding_optimizer.name = "adagrad"
  config.embedding_optimizer.learning_rate = 0.05

  config.stacking = "auto"

  config.limits = ml_collections.ConfigDict()
  config.limits.max_ids_per_partition = 0
  config.limits.max_unique_ids_per_partition = 0

  config.fdo = ml_collections.ConfigDict()
  config.fdo.every_steps = 20
  config.fdo.headroom = 1.5

  config.checkpoint = ml_collections.ConfigDict()
  config.checkpoint.every_steps = 20
  config.checkpoint.keep = 3
  config.checkpoint.async_save = True
  return config

"""Demo: a tiny DLRM on generated data that trains in seconds on a laptop.

`python -m sparsepipe.launch` runs it (the default config): it generates
planted click data with a held-out split, trains, evaluates AUC every 20
batches and at the end. `python -m sparsepipe.launch --config=demo
--config.num_steps=100` trains longer. The fields are documented in
docs/reference/config.md (made from sparsepipe/launch/config/fields.py).
"""

import ml_collections

from sparsepipe.launch.config.base_config import base_config
from sparsepipe.launch.config.base_config import feature


def get_config() -> ml_collections.ConfigDict:
  config = base_config(
    [
      ("user", feature(5000, combiner="mean")),
      ("item", feature(20000, combiner="mean")),
      ("category", feature(100, max_ids=3, combiner="mean")),
      ("history", feature(20000, max_ids=8, combiner="mean")),
    ]
  )
  config.num_steps = 60
  config.global_batch_size = 128
  config.synthetic.num_examples = 16384
  config.synthetic.num_dense = 4
  config.synthetic.records_per_shard = 4096
  config.synthetic.eval_examples = 4096
  config.eval.every_steps = 20
  config.model.embedding_dim = 8
  config.model.bottom_mlp_dims = (32, 8)
  config.model.top_mlp_dims = (32, 16)
  config.fdo.every_steps = 20
  config.checkpoint.every_steps = 20
  return config

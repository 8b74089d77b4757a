"""Dataset config: a DLRM on whatever dataset `data.dir` holds.

    python -m sparsepipe.launch --config=dataset \\
        --config.data.dir=/data/train --config.eval.data_dir=/data/eval --workdir=/ckpt/run

Features come from the train manifest when the job starts (names, vocab
sizes, ids per example and so sum/mean combiners: see
sparsepipe/launch/config/from_manifest.py); an eval set whose manifest disagrees
with it (names, vocab sizes, dense width) is an error. Everything else is
the base config (docs/config.md) plus the command line,
e.g. `--config.model.embedding_dim=32 --config.global_batch_size=1024`.
"""

import ml_collections

from sparsepipe.launch.config.base import base_config


def get_config() -> ml_collections.ConfigDict:
  config = base_config(())
  config.features_from_manifest = True
  config.eval.every_steps = 1000
  # Rows of real ids get few updates each (a user rates tens of movies):
  # Adagrad needs a larger step than on dense synthetic ids. On MovieLens
  # ml-100k, eval AUC 0.760 at 0.05, 0.770 at 0.2 (benchmarks/quality.py).
  config.embedding_optimizer.learning_rate = 0.2
  return config

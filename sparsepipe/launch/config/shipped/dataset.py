"""Dataset config: a DLRM on whatever dataset `data.dir` holds.

    python -m sparsepipe.launch --config=dataset \\
        --config.data.dir=/data/train --config.eval.data_dir=/data/eval --workdir=/ckpt/run

Features come from the train manifest when the job starts (names, vocab
sizes, ids per example and so sum/mean combiners: see
sparsepipe/launch/config/from_manifest.py); an eval set whose manifest disagrees
with it (names, vocab sizes, dense width) is an error. Everything else is
the base config (docs/reference/config.md) plus the command line,
e.g. `--config.model.embedding_dim=32 --config.global_batch_size=1024`.

The run's length comes from the data: num_steps is unset (None), so a new
job trains 10 epochs of its train set (config/config_specs.py, NEW_JOB_EPOCHS) and
a resumed one the length it was saved with (a job of an earlier version:
its num_steps); `--config.num_epochs=E` or `--config.num_steps=N` sets it.
"""

import ml_collections
from ml_collections import config_dict

from sparsepipe.launch.config.base_config import base_config


def get_config() -> ml_collections.ConfigDict:
  config = base_config(())
  config.features_from_manifest = True
  # Unset: epochs of the data (above). Once 1,000 batches whatever the data:
  # 1,571 epochs of a 163-example CSV.
  config.num_steps = config_dict.placeholder(int)
  config.eval.every_steps = 1000
  # Rows of real ids get few updates each (a user rates tens of movies):
  # Adagrad needs a larger step than on dense synthetic ids. On MovieLens
  # ml-100k, eval AUC 0.760 at 0.05, 0.770 at 0.2 (benchmarks/quality.py).
  config.embedding_optimizer.learning_rate = 0.2
  return config

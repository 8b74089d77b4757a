"""Criteo config: DLRM on the Criteo click logs (13 dense, 26 categorical).

Convert the public TSV files first (vocab sizes must match `VOCAB_SIZES`):

    python -m sparsepipe.data.criteo --input day_0.gz --output /data/criteo \\
        --vocab_sizes=$(python -c "import sparsepipe.launch.config.shipped.criteo as c; \\
            print(','.join(map(str, c.VOCAB_SIZES)))")

then train:

    python -m sparsepipe.launch --config=criteo \\
        --config.data.dir=/data/criteo --workdir=/ckpt/criteo

With data.dir empty the job generates a synthetic dataset of the same shape
(Zipf ids) in <workdir>/data, handy to size a run before converting.

Sizes: the 26 tables hold sum(VOCAB_SIZES) = 5.8M rows of embedding_dim 16,
0.35 GiB of float32 plus the same again for the Adagrad slot, sharded by
rows over all devices. The global batch is the same on any number of hosts.
Limits start from a generous guess for 8 devices x 4 SCs (`limits.for_devices`);
on fewer devices they grow to what those can need, at most the worst case
of the batch, and FDO retunes them every `fdo.every_steps` batches
(headroom 1.25). The fields are documented in docs/reference/config.md.
"""

import ml_collections

from sparsepipe.launch.config.base_config import base_config
from sparsepipe.launch.config.base_config import feature

# Per-feature cardinalities of the Criteo Kaggle display-advertising data,
# capped at 2**20: ids are hashed into these vocabularies by the converter.
_KAGGLE_CARDINALITIES = (
  1460,
  583,
  10131227,
  2202608,
  305,
  24,
  12517,
  633,
  3,
  93145,
  5683,
  8351593,
  3194,
  27,
  14992,
  5461306,
  10,
  5652,
  2173,
  4,
  7046547,
  18,
  15,
  286181,
  105,
  142572,
)
VOCAB_SIZES = tuple(min(v, 1 << 20) for v in _KAGGLE_CARDINALITIES)


def get_config() -> ml_collections.ConfigDict:
  config = base_config(
    (f"C{i}", feature(vocab, zipf_exponent=1.05)) for i, vocab in enumerate(VOCAB_SIZES, start=1)
  )
  config.num_steps = 10_000
  config.global_batch_size = 4096
  config.num_sc_per_device = 4
  config.log_every_steps = 100
  config.data.num_workers = 2
  config.data.skip_corrupt = True
  config.synthetic.num_examples = 1 << 20
  config.model.bottom_mlp_dims = (512, 256, 16)
  config.model.top_mlp_dims = (1024, 1024, 512, 256)
  config.limits.max_ids_per_partition = 1024
  config.limits.max_unique_ids_per_partition = 512
  config.limits.for_devices = 8
  config.fdo.every_steps = 1000
  config.fdo.headroom = 1.25
  config.checkpoint.every_steps = 1000
  return config

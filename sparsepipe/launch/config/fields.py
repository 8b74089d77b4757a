"""What every config field means, in its units: the source of docs/reference/config.md.

`FIELD_DOCS` describes each field of `base_config()` (a test checks that
every field has exactly one entry); `render_reference()` writes the
reference page, and `python -m sparsepipe.launch.config.fields` prints it
(a test checks that docs/reference/config.md is current).
"""

from __future__ import annotations

import json
from typing import Any

from sparsepipe.launch.config.base_config import base_config
from sparsepipe.launch.config.base_config import feature

# Dotted field -> meaning. `features.NAME.*` stands for every feature's entry.
FIELD_DOCS = {
  "seed": "Seed of parameter init, the data shuffle and generated data.",
  "num_steps": "Batches to train. A finished or stopped job may raise it when rerun (it trains"
  " the added batches); a value at or below the batches trained says the job is done. A job"
  " warns at its start when a batch is larger than the dataset or the batches make more"
  " than 100 epochs. --config=dataset leaves it unset: a new job trains 10 epochs of its"
  " data, in whole batches.",
  "num_epochs": "If > 0, passes over the train data to train instead of num_steps:"
  " num_steps becomes ceil(num_epochs * examples / global batch). May be a fraction;"
  " a job may raise it.",
  "global_batch_size": "Examples per batch over all hosts; the same on any number of"
  " processes (each reads global / processes). Set this or per_host_batch_size (0: unset);"
  " a multiple of devices x num_sc_per_device (the mesh's SparseCores, a power of two).",
  "per_host_batch_size": "Examples per batch per host instead: the global batch is this"
  " times the processes (0: unset).",
  "num_sc_per_device": "SparseCores per device, the S of the COO layout (4 on TPU"
  " v5p/v6e; elsewhere a layout parameter); devices x this must be a power of two.",
  "log_every_steps": "Batches between progress lines.",
  "data.dir": "The train dataset (a directory with manifest.json); empty: <workdir>/data,"
  " generated from `synthetic` and `features` when missing.",
  "data.num_workers": "Grain worker processes per host (0: in the main process). Batches"
  " and results do not depend on it; a resumed job may change it.",
  "data.shuffle": "Shuffle the records: a seeded permutation of the dataset's records,"
  " another each epoch; with data.shuffle_window > 0 the examples are shuffled across the"
  " records too, else the examples of one record stay together, in order.",
  "data.shuffle_window": "-1 (the default): a resumed job keeps the window it was saved"
  " with (0 for jobs saved before this field), a new job takes 256. > 0: also shuffle the"
  " examples across each window of this many consecutive records of the shuffled record"
  " order (records of more than one example): any two examples of one window can land in"
  " the same batch. Batches read the windows in 8 lanes (batch k: lane k mod 8), so with"
  " 1, 2, 4 or 8 data.num_workers each window is decoded once (N workers: up to"
  " N / gcd(N, 8) times), see docs/guide/input.md. 0: whole records only.",
  "data.skip_corrupt": "Skip and count unreadable records instead of stopping.",
  "data.allow_id_dropping": "Drop and count the ids of a batch over the COO limits"
  " instead of stopping (FDO's next retune raises the limits to fit them). A resumed job may"
  " change it: a job stopped by a batch over its limits goes on with it. The eval never"
  " drops ids (its limits fit every eval batch).",
  "synthetic.num_examples": "Examples of the generated train set.",
  "synthetic.num_dense": "Dense features of the generated data.",
  "synthetic.examples_per_record": "Examples packed in one ArrayRecord record. 0 (the"
  " default): a resumed job keeps its saved packing; a new job takes that of the data"
  " already generated in its workdir, else 128.",
  "synthetic.records_per_shard": "Records per ArrayRecord file.",
  "synthetic.eval_examples": "Examples of a generated held-out split (0: none).",
  "features.NAME.vocab_size": "Rows of the feature's table (ids lie in [0, vocab_size)). A"
  " dataset with a larger vocabulary is refused: convert it with these sizes (the"
  " converter's --vocab_sizes; --config=criteo's are its VOCAB_SIZES, the command is in"
  " sparsepipe/launch/config/shipped/criteo.py), or train it with --config=dataset.",
  "features.NAME.min_ids": "Fewest ids of one example (generated data).",
  "features.NAME.max_ids": "Most ids of one example; sizes the batch's id and COO buffers"
  " (a dataset whose manifest records more is refused).",
  "features.NAME.zipf_exponent": "Skew of the generated ids (bounded Zipf).",
  "features.NAME.combiner": "How an example's embeddings are combined: sum, mean or sqrtn.",
  "model.name": "A built-in model: dlrm or dcn_v2.",
  "model.factory": "'package.module:function' returning your own model"
  " (docs/guide/models.md); overrides name.",
  "model.embedding_dim": "Width of every embedding table.",
  "model.bottom_mlp_dims": "dlrm: the bottom MLP on the dense features; its last width is"
  " the interaction width.",
  "model.top_mlp_dims": "dlrm: the top MLP; dcn_v2: the MLP after the cross layers.",
  "model.cross_layers": "dcn_v2: stacked cross layers.",
  "model.cross_rank": "dcn_v2: rank of the cross kernels (0: full rank).",
  "dense_optimizer.name": "sgd, adagrad or adam, for the dense parameters (ZeRO-sharded).",
  "dense_optimizer.learning_rate": "Learning rate of the dense optimizer.",
  "embedding_optimizer.name": "sgd, adagrad, adam, adagrad_momentum, ftrl or laprop, for"
  " the embedding rows a batch touches.",
  "embedding_optimizer.learning_rate": "Learning rate of the embedding optimizer.",
  "stacking": "auto: stack compatible tables into one physical table; none: one per feature.",
  "limits.max_ids_per_partition": "COO limit before FDO tunes it: ids of one SparseCore's"
  " samples in one partition (0: the worst case of the batch, always enough).",
  "limits.max_unique_ids_per_partition": "The same for distinct ids (0: the worst case).",
  "limits.for_devices": "The global device count the limits were set for (0: any); on"
  " fewer devices they grow as a resized checkpoint's do, at most to the worst case.",
  "fdo.every_steps": "FDO retunes the limits after every multiple of this batch number (0:"
  " never); a retune that changes them trains on with the step compiled for them (the"
  " batches in flight re-laid out, nothing drained). A resumed job may change it: it"
  " then retunes after the new multiples past the batches it had read (the segment in"
  " progress ends at the first of them, or as planned if that comes first).",
  "fdo.first_after": "With FDO on, the first retune comes after this batch when it is below"
  " every_steps (0: at every_steps); the later ones after every multiple of every_steps."
  " A resumed job may change it, as every_steps (from the batches it had not read).",
  "fdo.headroom": "New limits are the observed maxima times this (>= 1).",
  "fdo.steps_per_doubling": "New limits are then rounded up to one of this many values per"
  " doubling (8: ..., 256, 288, 320, ..., 480, 512, 576, ...; less than 1/8 more), so that a"
  " retune whose statistics grew a little keeps the limits and the compiled step: no"
  " compilation, no stall (0: exact, a new step at every change). A job may change it (from"
  " its next retune).",
  "fdo.compile_ahead": "Once this fraction of a segment's batches is read (0: never), the"
  " limits its retune would give so far are derived and, if they change, their step compiles"
  " in the background; the retune uses it when its limits are the same, so that training"
  " does not wait for the compilation. Results are unchanged. A job may change it.",
  "pipelining": "true: overlap the lookup of batch i and the update of batch i-2 with the"
  " dense step of batch i-1; false: all three per batch, in order; auto: a resumed job's"
  " saved mode, else true on more than one GPU or TPU device and false on CPU and on one"
  " device (docs/guide/train_step.md).",
  "features_from_manifest": "Take `features` from data.dir's manifest (--config=dataset).",
  "compilation_cache_dir": "Where compiled programs are kept for the next start of any job,"
  " evaluate or export (JAX's in <dir>/jax, the COO passes' in <dir>/numba-v2): auto is"
  " $XDG_CACHE_HOME/sparsepipe, else ~/.cache/sparsepipe; empty: off. A"
  " JAX_COMPILATION_CACHE_DIR in the environment wins for JAX's programs. Not in or inside a"
  " workdir (the job's own too), a dataset or an export. A job may change it.",
  "eval.data_dir": "A held-out dataset with the train set's features (empty: the generated"
  " split when synthetic.eval_examples > 0, else none).",
  "eval.every_steps": "Batches between evals (0: only at the end; with an eval set the job"
  " always evaluates at the end).",
  "checkpoint.every_steps": "Batches between checkpoints (the job also saves at its end and"
  " when preempted; an FDO retune does not save).",
  "checkpoint.keep": "Newest checkpoints kept.",
  "checkpoint.async_save": "Save in the background while training goes on. The save holds a"
  " host copy of the state until it is written; on CPU devices, where the state is host memory"
  " already, false writes from the arrays while training waits (benchmarks/memory.py: a peak"
  " lower by about the state's size).",
  "checkpoint.verify_arrays": "Store a fingerprint of every array, so a garbled file is"
  " found on restore.",
  "checkpoint.host_copy_gb": "> 0: a save copies device arrays to the host in batches of"
  " about this many GB, each written before the next is copied, instead of all at once"
  " (Orbax's save_device_host_concurrent_gb; for GPU/TPU, untested there; see Memory and"
  " saves below). 0: no bound.",
  "checkpoint.data_file_mb": "The size of a save's data files (MiB). TensorStore holds a"
  " file's bytes in memory until it is written, so this bounds a save's host memory"
  " beside the state (see Memory and saves below); larger files mean fewer of them, e.g."
  " for an object store.",
}


# Fields with no default: config_fields fills them in to build a config.
REQUIRED = ("features.NAME.vocab_size",)


def config_fields() -> dict[str, Any]:
  """{dotted field: default} of base_config(), one feature's entry as features.NAME.*
  (its REQUIRED vocab_size, which feature() has no default for, given as 1000)."""
  config = base_config([("NAME", feature(1000))]).to_dict()
  out: dict[str, Any] = {}

  def walk(node: dict[str, Any], prefix: str) -> None:
    for key, value in node.items():
      if isinstance(value, dict):
        walk(value, f"{prefix}{key}.")
      else:
        out[f"{prefix}{key}"] = value

  walk(config, "")
  return out


def render_reference() -> str:
  """docs/reference/config.md: every field, its default and its meaning, sorted by name."""
  lines = [
    "# Config reference",
    "",
    "Every field of a job config, its default in `base_config()` and what it means."
    " Shipped configs (`--config=demo`, `criteo`, `dataset`) change some defaults;"
    " any field is set on the command line as `--config.FIELD=VALUE`.",
    "Generated by `python -m sparsepipe.launch.config.fields` from"
    " `sparsepipe/launch/config/fields.py`; a test checks it is current.",
    "",
    "| field | default | meaning |",
    "|---|---|---|",
  ]
  for name, default in config_fields().items():
    value = json.dumps(list(default) if isinstance(default, tuple) else default)
    value = "none (required)" if name in REQUIRED else f"`{value}`"
    lines.append(f"| `{name}` | {value} | {FIELD_DOCS[name]} |")
  return "\n".join(lines + MEMORY_SECTION) + "\n"


# docs/reference/config.md's section on sizing a host's memory.
MEMORY_SECTION = [
  "",
  "## Memory and saves",
  "",
  "A training process holds the state (tables, slots, `updated`, dense parameters and"
  " their optimizer state), one more copy of it while an asynchronous save is in flight"
  " on CPU devices, and an overhead that grows far less than the tables (Python, JAX,"
  " the compiler, the step's buffers, a save's writes in flight: 1.12-1.23x for tables 4x"
  " larger, medians of the three runs below; one run's figure moves by about 0.15).",
  "",
  "On CPU devices the arrays are host memory, so the choice is:",
  "",
  "- `checkpoint.async_save=true` (default): training goes on while the files are"
  " written; the state being written stays alive beside the state being trained, one"
  " extra state.",
  "- `checkpoint.async_save=false`: no copy; the loop waits while the files are written"
  " (a longer pause per save).",
  "",
  "Measured by `python benchmarks/memory.py --sections growth --batches 12 --examples"
  " 49152 --save_every 6 --repeats 3` (criteo config on 8 CPU devices, peak resident set;"
  " overhead = peak - state, minus one more state for asynchronous saves; medians of"
  " three runs, with each run's overhead growth):",
  "",
  "| vocabularies | saves | state | peak | peak / state | overhead | overhead / shipped (runs) |",
  "|---|---|---|---|---|---|---|",
  "| shipped | sync | 833 MB | 1,849 MB | 2.22 | 1,016 MB | |",
  "| shipped | sync, resumed | 833 MB | 1,637 MB | 1.97 | 804 MB | |",
  "| shipped | async | 833 MB | 2,708 MB | 3.25 | 1,043 MB | |",
  "| 4x | sync | 3,028 MB | 4,167 MB | 1.38 | 1,140 MB | 1.12 (1.12, 1.17, 1.10) |",
  "| 4x | sync, resumed | 3,028 MB | 4,002 MB | 1.32 | 974 MB | 1.23 (1.23, 1.32, 1.11) |",
  "| 4x | async | 3,028 MB | 7,251 MB | 2.39 | 1,195 MB | 1.15 (1.03, 1.15, 1.22) |",
  "",
  '("resumed": the sync job resumed from its last checkpoint for 6 batches more.) Of the'
  " overhead, about 1 GB is there in training at both sizes (Python and JAX 0.3 GB, the"
  " step's buffers 0.37 GB, sized by the starting limits (`limits.*`) until FDO's first"
  " pass, and freed heap glibc keeps); at the shipped size the peak comes before that"
  " pass; a synchronous save adds 0-50 MB to it at the shipped size and"
  " 150-300 MB at 4x. A resumed job's restore read every shard at once and its fingerprint"
  " check held a second copy of each array: its peak was 2.24x the state at 4x (overhead"
  " 3.7 GB) before both were bounded.",
  "",
  "A save writes, and a restore reads, at most twice the largest shard at once (at least"
  " 256 MiB; `checkpointing.in_flight_bound`); a save writes in chunks and data files of"
  " `checkpoint.data_file_mb` (2 MiB): TensorStore holds a data file in memory until it"
  " is written, and with Orbax's 2 GiB files a synchronous save added 130-140 MB at the"
  " shipped size and 350-500 MB at 4x. Chunks divide a shard, so where a shard's rows have"
  " no divisor near the target a chunk is the next larger one (at most a shard), never"
  " tiny: Orbax alone cut the 4x criteo stack's shards (2**6 * 45413 rows) into 4 KiB"
  " chunks for 2 MiB files, and that save held 0.9 GB more.",
  "",
  "With device arrays (GPU, TPU), an asynchronous save first copies the state to host"
  " memory. `checkpoint.host_copy_gb` > 0 bounds that copy: arrays are copied in"
  " batches of about that many GB, each written before the next is copied (Orbax's"
  " `save_device_host_concurrent_gb`), so the save is partly synchronous. Untested on"
  " GPU/TPU (the tests and benchmarks run on CPU devices); with `checkpoint.verify_arrays`"
  " the fingerprints are summed from every shard's host values after the save returns,"
  " which there reads each shard to the host once more.",
]


if __name__ == "__main__":
  print(render_reference(), end="")

"""The host input: ArrayRecord shards -> preprocessed batches, by batch index.

    MapDataset.range(batches)          # global batch indices k
      -> map(ReadTrainBatch)           # this host's block of batch k (train_batches.py)
      -> map(PreprocessSparse)         # COO buffers + statistics for the local devices
      -> [from the iterator's position on]
      -> to_iter_dataset(read threads) # read ahead, order kept
      -> mp_prefetch(num_workers)      # optional worker processes, order kept;
                                       # a batch travels in one reused shm block
      -> placement (optional)          # e.g. pipeline.make_train_input's device_put
      -> InputIterator                 # position + FDO statistics, the JSON state

Examples are shuffled per epoch: the records, and the examples across
each window of `shuffle_window` records (example_order.py; window_read.py
decodes each window once per process). A batch depends on (dataset, seed,
shuffle, shuffle_window, global batch index, host index, host count) only;
not on the worker count, the read-ahead, or the batches read before it.

Evaluation reads the same way, in file order, once, padded and masked:
`make_host_eval_input`, with its stages in eval_read.py.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any, Callable

from absl import flags
import grain
import jax

from sparsepipe.core.memory import keep_freed_memory
from sparsepipe.core.signals import ignore_stop_signals_in_worker
from sparsepipe.data.conversion_rules import rules_of
from sparsepipe.data.manifest import Manifest
from sparsepipe.transforms.input.eval_read import PreprocessEval
from sparsepipe.transforms.input.eval_read import ReadEvalExamples
from sparsepipe.transforms.input.eval_read import num_eval_batches
from sparsepipe.transforms.input.example_order import ExampleOrder
from sparsepipe.transforms.input.input_config import InputConfig
from sparsepipe.transforms.input.input_config import resolve
from sparsepipe.transforms.input.iterator import STATE_VERSION
from sparsepipe.transforms.input.iterator import InputIterator
from sparsepipe.transforms.input.limits_board import LimitsBoard
from sparsepipe.transforms.input.limits_board import PreprocessByLimits
from sparsepipe.transforms.input.coo_transform import PreprocessSparse
from sparsepipe.transforms.input.coo_transform import PreprocessedBatch
from sparsepipe.transforms.input.read_examples import ExampleReader
from sparsepipe.transforms.input.stats import stats_sizes
from sparsepipe.transforms.input.train_batches import ReadTrainBatch
from sparsepipe.transforms.input.workers import PackArrays, UnpackArrays, WorkersTogether

# Far more batches than any job trains: "repeat forever" as a MapDataset length.
_ENDLESS = 1 << 62


def num_batches(config: InputConfig, manifest: Manifest, process_count: int) -> int:
  """Batches of `config.num_epochs` epochs (whole global batches), or endless."""
  if config.num_epochs is None:
    return _ENDLESS
  return (
    manifest.num_examples
    * int(config.num_epochs)
    // (config.per_host_batch_size * int(process_count))
  )


def make_example_batches(
  config: InputConfig | Any,
  *,
  process_index: int | None = None,
  process_count: int | None = None,
  manifest: Manifest | None = None,
) -> grain.MapDataset:
  """MapDataset: global batch index -> this host's ParsedBatch (decoded examples).

  process_index/process_count default to this JAX process (ShardByJaxProcess).
  """
  config, index, count, manifest = resolve(config, process_index, process_count, manifest)
  reader = ExampleReader(
    manifest, reader_options=config.reader_options, skip_corrupt=config.skip_corrupt
  )
  read = ReadTrainBatch(
    ExampleOrder(manifest, shuffle=config.shuffle, seed=config.seed, window=config.shuffle_window),
    reader,
    per_host_batch_size=config.per_host_batch_size,
    process_index=index,
    process_count=count,
  )
  return grain.MapDataset.range(num_batches(config, manifest, count)).map(read)


def _init_worker(worker_index: int, worker_count: int, user_fn: Callable | None = None) -> None:
  """Data workers leave SIGTERM and Ctrl-C to the main process (it saves first)
  and keep freed memory for the next batch (keep_freed_memory)."""
  ignore_stop_signals_in_worker(worker_index, worker_count)
  keep_freed_memory()
  if user_fn is not None:
    user_fn(worker_index, worker_count)


def check_specs(feature_specs: Any, manifest: Manifest, global_batch: int) -> None:
  """The specs read features the dataset has, with vocabularies and batch that fit."""
  names = set(manifest.schema.feature_names)
  for spec in jax.tree_util.tree_leaves(feature_specs):
    if spec.name not in names:
      raise ValueError(
        f"feature '{spec.name}' is not in the dataset '{manifest.directory}'"
        f" (it has {list(manifest.schema.feature_names)})"
      )
    vocab = manifest.schema.feature(spec.name).vocab_size
    if vocab > spec.table_spec.vocabulary_size:
      raise ValueError(
        f"feature '{spec.name}': the data's vocab_size={vocab} exceeds table"
        f" '{spec.table_spec.name}' vocabulary_size={spec.table_spec.vocabulary_size}"
      )
    if spec.global_batch_size != global_batch:
      raise ValueError(
        f"feature '{spec.name}': global batch size {spec.global_batch_size} in its"
        f" spec, but the pipeline makes per_host_batch_size * process_count ="
        f" {global_batch}"
      )


def _preprocess(config: InputConfig, feature_specs: Any, local: int, global_: int) -> Any:
  """PreprocessSparse for the train and the eval input alike."""
  return PreprocessSparse(
    feature_specs,
    local_device_count=local,
    global_device_count=global_,
    num_sc_per_device=config.num_sc_per_device,
    sharding_strategy=config.sharding_strategy,
    allow_id_dropping=config.allow_id_dropping,
  )


def prefetch_in_workers(
  ds: grain.IterDataset,
  num_workers: int,
  *,
  buffer_size: int = 2,
  worker_init_fn: Callable[[int, int], None] | None = None,
) -> grain.IterDataset:
  """Runs `ds` in `num_workers` processes; elements come back unchanged, in order.

  Each element's arrays travel in one reused shared-memory block
  (PackArrays / UnpackArrays). Workers ignore SIGTERM, exit when the main
  process ends (core.exit_with_parent), keep freed memory, then run
  `worker_init_fn(worker_index, worker_count)`. 0 workers: `ds`.
  Grain's multiprocessing reads absl flags: the program must have parsed
  them (absl.app.run does; elsewhere call absl.flags.FLAGS.mark_as_parsed()).
  """
  if num_workers == 0:
    return ds
  if not flags.FLAGS.is_parsed():
    raise RuntimeError(
      f"data workers (num_workers={num_workers}) need absl flags parsed, which Grain's"
      " multiprocessing reads: run the program with absl.app.run, or call"
      " absl.flags.FLAGS.mark_as_parsed() once before making the input"
    )
  ds = ds.map(PackArrays(shared_memory=True))
  ds = ds.mp_prefetch(
    grain.MultiprocessingOptions(num_workers=num_workers, per_worker_buffer_size=buffer_size),
    worker_init_fn=functools.partial(_init_worker, user_fn=worker_init_fn),
  )
  return WorkersTogether(ds).map(UnpackArrays())


def _runner(
  config: InputConfig,
  worker_init_fn: Callable[[int, int], None] | None,
  place: Callable[[Any], Any] | None,
  prefetch: int,
) -> Callable[[grain.MapDataset], grain.IterDataset]:
  """How a MapDataset of host batches runs: read-ahead threads, workers, placement."""

  def run(batches: grain.MapDataset) -> grain.IterDataset:
    options = grain.ReadOptions(num_threads=config.read_threads, prefetch_buffer_size=2)
    ds = batches.to_iter_dataset(options)
    ds = prefetch_in_workers(
      ds, config.num_workers, buffer_size=config.worker_buffer_size, worker_init_fn=worker_init_fn
    )
    if place is not None:
      ds = ds.map(place)
      if prefetch:
        ds = grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=prefetch)
    return ds

  return run


def _fingerprint(value: Any) -> str:
  return hashlib.sha1(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def dataset_fingerprint(manifest: Manifest) -> str:
  """Identifies the data (schema, shards, counts; not its directory or info)."""
  d = manifest.to_dict()
  del d["info"]
  return _fingerprint(d)


def conversion_fingerprint(manifest: Manifest) -> str:
  """Identifies the rules that made the data's ids and dense values
  (data.conversion_rules.rules_of: hashing, id rules, dense transforms): a dataset
  converted again with other options under the same path has the same schema,
  shards and counts, so `dataset_fingerprint` alone took it for the same data."""
  return _fingerprint(rules_of(manifest.info, manifest.schema))


def _metadata(config: InputConfig, manifest: Manifest, index: int, count: int) -> dict[str, Any]:
  window = {}
  if config.shuffle and config.shuffle_window and manifest.examples_per_record > 1:
    # Only where it shuffles examples: states of record-shuffled streams stay as they were.
    window = {"shuffle_window": config.shuffle_window}
  return {
    **window,
    "state_version": STATE_VERSION,
    "per_host_batch_size": config.per_host_batch_size,
    "process_index": index,
    "process_count": count,
    "seed": config.seed,
    "shuffle": config.shuffle,
    "num_records": manifest.num_records,
    "dataset": dataset_fingerprint(manifest),
    "conversion": conversion_fingerprint(manifest),
  }


def make_host_input(
  config: InputConfig | Any,
  feature_specs: Any,
  *,
  local_device_count: int,
  global_device_count: int,
  process_index: int | None = None,
  process_count: int | None = None,
  fdo_client: Any = None,
  worker_init_fn: Callable[[int, int], None] | None = None,
  place: Callable[[PreprocessedBatch], PreprocessedBatch] | None = None,
  prefetch: int = 1,
  output: Callable[[PreprocessedBatch], Any] = lambda element: element,
  last_retune: Callable[[int], int | None] | None = None,
  pack: Callable[[PreprocessedBatch], PreprocessedBatch] | None = None,
) -> InputIterator:
  """The checkpointable training input of this host (an InputIterator).

  Yields PreprocessedBatch (numpy TrainBatch + statistics), or `output`
  of them after `place` (the device side passes its device_put, with
  `prefetch` batches placed ahead in a thread). With `process_index/
  process_count` (default: this JAX process) tools and tests simulate
  other hosts. `last_retune` (batch index -> the last FDO retune point at or
  before it, or None) lets FDO change the limits of the batches after a
  retune point while the workers run (`InputIterator.publish_limits`,
  limits_board.py); without it the limits are fixed. `pack` runs on every
  preprocessed batch where it is made (in the data workers, if any), before
  `place` (the device side packs a batch into one buffer for one transfer).
  """
  config, index, count, manifest = resolve(config, process_index, process_count)
  check_specs(feature_specs, manifest, config.per_host_batch_size * count)
  board = LimitsBoard(last_retune)
  preprocess = _preprocess(config, feature_specs, local_device_count, global_device_count)
  batches = make_example_batches(
    config, process_index=index, process_count=count, manifest=manifest
  ).map_with_index(PreprocessByLimits(preprocess, board))
  if pack is not None:
    batches = batches.map(pack)
  stacks = sorted({spec.stack_name for spec in jax.tree_util.tree_leaves(feature_specs)})
  num_global_sc = global_device_count * config.num_sc_per_device
  return InputIterator(
    batches,
    _runner(config, worker_init_fn, place, prefetch),
    place=place,
    metadata=_metadata(config, manifest, index, count),
    stats_sizes=stats_sizes(stacks, local_device_count, num_global_sc, config.num_sc_per_device),
    fdo_client=fdo_client,
    output=output,
    limits_board=board,
  )


# One thread computing two batches ahead: with Grain's default read options
# (16 threads, 500 elements ahead) the eval input ran at a third of this
# speed or less on 2 cores, and it would hold hundreds of batches.
EVAL_READ_OPTIONS = grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)


def make_host_eval_input(
  config: InputConfig | Any,
  feature_specs: Any,
  *,
  local_device_count: int,
  global_device_count: int,
  process_index: int | None = None,
  process_count: int | None = None,
  worker_init_fn: Callable[[int, int], None] | None = None,
  place: Callable[[Any], Any] | None = None,
) -> grain.IterDataset:
  """One ordered pass over an eval set: a dataset of EvalBatch (iterate it per eval).

  Every example is in exactly one batch; the last batches are padded to
  per_host_batch_size and masked, and every host gets the same number of
  batches (see eval_read.py). Uses the config's data_dir,
  per_host_batch_size, COO settings, num_workers and reader settings;
  shuffle, seed and num_epochs do not apply, and corrupt records are errors
  whatever skip_corrupt says. The feature specs are the train step's.
  """
  config, index, count, manifest = resolve(config, process_index, process_count)
  check_specs(feature_specs, manifest, config.per_host_batch_size * count)
  read = ReadEvalExamples(
    manifest,
    per_host_batch_size=config.per_host_batch_size,
    process_index=index,
    process_count=count,
    reader_options=config.reader_options,
  )
  preprocess = PreprocessEval(
    _preprocess(config, feature_specs, local_device_count, global_device_count)
  )
  total = num_eval_batches(manifest.num_examples, config.per_host_batch_size * count)
  ds = grain.MapDataset.range(total).map(read).map(preprocess).to_iter_dataset(EVAL_READ_OPTIONS)
  ds = prefetch_in_workers(
    ds, config.num_workers, buffer_size=config.worker_buffer_size, worker_init_fn=worker_init_fn
  )
  return ds.map(place) if place is not None else ds

"""The input pipeline: ArrayRecord shards -> device-ready, checkpointable batches.

    MapDataset.range(num_records)      # record indices over all shards
      -> seed(seed).shuffle()          # global permutation of RECORDS, same on all hosts
      -> [process_index::process_count]   # this host's records
      -> repeat(num_epochs)            # reshuffled every epoch
      -> DecodeBatchIterDataset(source, per_host_batch_size)
                                       # batched ArrayRecord reads, bulk decode
      -> map(PreprocessSparse)         # COO buffers + stats for the local devices
      -> mp_prefetch(num_workers)      # everything above runs in the workers;
                                       # a batch travels in one reused shm block
      -> RecordStatsIterDataset(fdo_client)   # main process
      -> placement (optional)          # e.g. pipeline.make_input_pipeline's
                                       # device_put onto the mesh

Granularity: records hold R examples (manifest.examples_per_record); the
shuffle permutes records, and examples inside a record stay together (write
the data with small R, or shuffled, if that matters). A per-host batch is
cut from consecutive records of a worker's stream, so any batch size works:
a record may straddle two batches (it is read once, its remainder waits in
the decoder's cache). With N workers, worker i forms batches from records
i, i+N, ... of the host's stream: batches depend on N, so N is part of the
iterator state and a mismatch on restore is an error.

The iterator state is JSON: `{"metadata": {...}, "pipeline": ...}`. It
counts positions in the record stream, never transform parameters, so a
pipeline rebuilt with new feature specs (FDO limits) continues from a saved
state exactly where the old one stopped.

Evaluation reads differently (in order, once, padded and masked):
`make_eval_pipeline`, with its stages in eval_read.py.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import Any, Callable, Mapping

from absl import flags
import grain
import jax

from sparsepipe.core.memory import keep_freed_memory
from sparsepipe.core.signals import ignore_stop_signals_in_worker
from sparsepipe.data.manifest import Manifest, RecordLocator, read_manifest
from sparsepipe.data.source import manifest_source
from sparsepipe.transforms.input.host_blocks import HostBlocksMapDataset
from sparsepipe.transforms.input.record_stats import RecordStatsIterDataset
from sparsepipe.transforms.input.record_stats import StatsTotals
from sparsepipe.transforms.input.record_stats import clear_stats_maxima
from sparsepipe.transforms.input.record_stats import find_stats_node
from sparsepipe.transforms.input.preprocess import PreprocessSparse
from sparsepipe.transforms.input.decode_batch import DecodeBatchIterDataset
from sparsepipe.transforms.input.eval_read import PreprocessEval, ReadEvalExamples, eval_positions
from sparsepipe.transforms.input.transfer import PackArrays, UnpackArrays

STATE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class InputConfig:
  """Input pipeline settings (an ml_collections.ConfigDict with these keys works too).

  Attributes:
    data_dir: dataset directory (with manifest.json).
    per_host_batch_size: examples per batch on this host.
    seed: shuffle seed (the same on every host).
    shuffle: shuffle records globally each epoch.
    num_epochs: None repeats forever; else a finite run (last partial batch dropped).
    num_workers: Grain worker processes (0: everything in this process).
    worker_buffer_size: batches buffered per worker.
    skip_corrupt: skip and count corrupt records instead of raising.
    num_sc_per_device: SparseCores per device, S, of the COO format.
    sharding_strategy: "MOD".
    allow_id_dropping: drop ids over the limits (counted) instead of raising.
    reader_max_parallelism: ArrayRecord reader threads (0 is best on few cores).
    verify_shards: check every shard's record count at start.
  """

  data_dir: str
  per_host_batch_size: int
  seed: int = 0
  shuffle: bool = True
  num_epochs: int | None = None
  num_workers: int = 0
  worker_buffer_size: int = 2
  skip_corrupt: bool = False
  num_sc_per_device: int = 1
  sharding_strategy: str = "MOD"
  allow_id_dropping: bool = False
  reader_max_parallelism: int = 0
  verify_shards: bool = True

  def __post_init__(self):
    if self.per_host_batch_size < 1:
      raise ValueError(f"per_host_batch_size={self.per_host_batch_size} must be >= 1")
    if self.num_workers < 0:
      raise ValueError(f"num_workers={self.num_workers} must be >= 0")
    if not 0 <= self.seed < 2**32:
      raise ValueError(f"seed={self.seed} must be in [0, 2**32)")

  @classmethod
  def from_config(cls, config: Any) -> InputConfig:
    """From an InputConfig, a mapping, or an ml_collections.ConfigDict."""
    if isinstance(config, cls):
      return config
    if hasattr(config, "to_dict"):
      config = config.to_dict()
    if not isinstance(config, Mapping):
      raise TypeError(f"expected InputConfig, mapping or ConfigDict, got {type(config).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(config) - known)
    if unknown:
      raise ValueError(f"unknown input config keys {unknown} (known: {sorted(known)})")
    return cls(**config)


class IteratorStateMismatchError(ValueError):
  """A saved iterator state that does not belong to this pipeline."""


def _process_slice(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  if process_index is None and process_count is None:
    shard = grain.sharding.ShardByJaxProcess()
    return int(shard.shard_index), int(shard.shard_count)
  if process_index is None or process_count is None:
    raise ValueError("give both process_index and process_count, or neither")
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} not in [0, process_count={process_count})")
  return int(process_index), int(process_count)


def _resolve(
  config: InputConfig | Any,
  process_index: int | None,
  process_count: int | None,
  manifest: Manifest | None = None,
) -> tuple[InputConfig, int, int, Manifest]:
  """(config, this host's index, host count, the dataset's manifest) of an entry point."""
  config = InputConfig.from_config(config)
  index, count = _process_slice(process_index, process_count)
  if manifest is None:
    manifest = read_manifest(config.data_dir, verify_shards=config.verify_shards)
  return config, index, count, manifest


def make_example_dataset(
  config: InputConfig | Any,
  *,
  process_index: int | None = None,
  process_count: int | None = None,
  manifest: Manifest | None = None,
) -> grain.IterDataset:
  """Record order (shuffle, this host's slice, repeat) -> decoded batches (ParsedBatch).

  process_index/process_count default to this JAX process (ShardByJaxProcess).
  """
  config, index, count, manifest = _resolve(config, process_index, process_count, manifest)
  source = manifest_source(
    manifest, reader_options={"max_parallelism": str(config.reader_max_parallelism)}
  )
  if manifest.num_records < count:
    raise ValueError(
      f"dataset '{manifest.directory}' has {manifest.num_records} records, fewer than"
      f" the {count} processes reading it"
    )
  indices = grain.MapDataset.range(manifest.num_records)
  if config.shuffle:
    indices = indices.seed(config.seed).shuffle()
  records_per_batch, rest = divmod(config.per_host_batch_size, manifest.examples_per_record)
  if rest == 0:
    # Global batches independent of the process count (see grain_host_blocks).
    indices = HostBlocksMapDataset(indices, block=records_per_batch, index=index, count=count)
  else:
    # Batches straddle records: a stride still splits the data disjointly.
    indices = indices[index::count]
  indices = indices.repeat(config.num_epochs)
  return DecodeBatchIterDataset(
    indices,
    source,
    config.per_host_batch_size,
    schema=manifest.schema,
    locator=RecordLocator.from_manifest(manifest),
    skip_corrupt=config.skip_corrupt,
    examples_per_record=manifest.examples_per_record,
  )


def _init_worker(worker_index: int, worker_count: int, user_fn: Callable | None = None) -> None:
  """Data workers leave SIGTERM and Ctrl-C to the main process (it saves first)
  and keep freed memory for the next batch (keep_freed_memory)."""
  ignore_stop_signals_in_worker(worker_index, worker_count)
  keep_freed_memory()
  if user_fn is not None:
    user_fn(worker_index, worker_count)


def _check_specs(feature_specs: Any, manifest: Manifest, global_batch: int) -> None:
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


def _preprocess_args(config: InputConfig, local_devices: int, global_devices: int) -> dict:
  """PreprocessSparse's arguments besides the specs (train and eval alike)."""
  return dict(
    local_device_count=local_devices,
    global_device_count=global_devices,
    num_sc_per_device=config.num_sc_per_device,
    sharding_strategy=config.sharding_strategy,
    allow_id_dropping=config.allow_id_dropping,
  )


def make_host_dataset(
  config: InputConfig | Any,
  feature_specs: Any,
  *,
  local_device_count: int,
  global_device_count: int,
  process_index: int | None = None,
  process_count: int | None = None,
  fdo_client: Any = None,
  worker_init_fn: Callable[[int, int], None] | None = None,
  manifest: Manifest | None = None,
) -> grain.IterDataset:
  """The pipeline up to host batches: an IterDataset of PreprocessedBatch."""
  config, index, count, manifest = _resolve(config, process_index, process_count, manifest)
  _check_specs(feature_specs, manifest, config.per_host_batch_size * count)
  ds = make_example_dataset(config, process_index=index, process_count=count, manifest=manifest)
  args = _preprocess_args(config, local_device_count, global_device_count)
  ds = ds.map(PreprocessSparse(feature_specs, **args))
  ds = prefetch_in_workers(
    ds, config.num_workers, buffer_size=config.worker_buffer_size, worker_init_fn=worker_init_fn
  )
  return RecordStatsIterDataset(ds, fdo_client)


def prefetch_in_workers(
  ds: grain.IterDataset,
  num_workers: int,
  *,
  buffer_size: int = 2,
  worker_init_fn: Callable[[int, int], None] | None = None,
) -> grain.IterDataset:
  """Runs `ds` in `num_workers` processes; elements come back unchanged.

  Each element's arrays travel in one reused shared-memory block
  (PackArrays / UnpackArrays). Workers ignore SIGTERM, keep freed memory,
  then run
  `worker_init_fn(worker_index, worker_count)`. 0 workers: `ds` itself.
  """
  if num_workers == 0:
    return ds
  if not flags.FLAGS.is_parsed():  # grain reads absl flags in mp_prefetch
    flags.FLAGS.mark_as_parsed()
  ds = ds.map(PackArrays(shared_memory=True))
  ds = ds.mp_prefetch(
    grain.MultiprocessingOptions(num_workers=num_workers, per_worker_buffer_size=buffer_size),
    worker_init_fn=functools.partial(_init_worker, user_fn=worker_init_fn),
  )
  return ds.map(UnpackArrays())


class InputPipelineIterator(grain.DatasetIterator):
  """The pipeline's iterator; its state carries metadata checked on restore.

  State: {"metadata": {...}, "pipeline": <the stages' state>} (JSON). Use it
  with grain.checkpoint.CheckpointSave/CheckpointRestore or get/set_state.
  `examples_per_record` (the dataset's R, not part of the state) is what
  transforms.resize_iterator_state needs besides the metadata.
  """

  def __init__(
    self,
    parent: grain.DatasetIterator,
    metadata: Mapping[str, Any],
    examples_per_record: int | None = None,
  ):
    super().__init__(parent)
    self.metadata = dict(metadata)
    self.examples_per_record = examples_per_record

  def __next__(self):
    return next(self._parent)

  def get_state(self) -> dict[str, Any]:
    return {"metadata": dict(self.metadata), "pipeline": self._parent.get_state()}

  def set_state(self, state: dict[str, Any]) -> None:
    saved = state.get("metadata", {})
    mine = self.metadata
    if saved.get("num_workers") != mine["num_workers"]:
      raise IteratorStateMismatchError(
        f"data iterator state was saved with num_workers={saved.get('num_workers')},"
        f" but this pipeline has num_workers={mine['num_workers']}: batches depend on"
        " the worker count, restore with the same num_workers"
      )
    for key in sorted(mine):
      if saved.get(key) != mine[key]:
        raise IteratorStateMismatchError(
          f"data iterator state was saved with {key}={saved.get(key)!r}, but this"
          f" pipeline has {key}={mine[key]!r}"
        )
    self._parent.set_state(state["pipeline"])

  @property
  def num_workers(self) -> int:
    return self.metadata["num_workers"]

  def stats_totals(self) -> StatsTotals:
    """Running totals of the statistics of the batches handed out so far.

    Read from the state, not from the recording stage: a prefetch after it
    may have run ahead, and a resumed job must see the same totals.
    """
    return StatsTotals.from_state(find_stats_node(self._parent.get_state())["totals"])

  def reset_stats_maxima(self) -> None:
    """Forgets the FDO maxima recorded so far (call after set_state).

    Their shapes (L*N, L*S per stack) and meaning follow the device layout:
    after a restore onto another global device count, FDO must retune from
    the new layout's statistics only. Batch, corrupt-record and dropped-id
    counters are kept. Goes through the state, so batches prefetched ahead
    are re-read, not lost.
    """
    self._parent.set_state(clear_stats_maxima(self._parent.get_state()))

  def __str__(self) -> str:
    return f"InputPipelineIterator({self.metadata})"


class _PipelineDataset(grain.IterDataset):
  def __init__(
    self, parent: grain.IterDataset, metadata: Mapping[str, Any], examples_per_record: int
  ):
    super().__init__(parent)
    self._metadata = dict(metadata)
    self._examples_per_record = examples_per_record

  def __iter__(self) -> InputPipelineIterator:
    return InputPipelineIterator(self._parent.__iter__(), self._metadata, self._examples_per_record)

  def __str__(self) -> str:
    return "_PipelineDataset"


def _metadata(config: InputConfig, manifest: Manifest, index: int, count: int) -> dict[str, Any]:
  return {
    "state_version": STATE_VERSION,
    "num_workers": config.num_workers,
    "per_host_batch_size": config.per_host_batch_size,
    "process_index": index,
    "process_count": count,
    "seed": config.seed,
    "shuffle": config.shuffle,
    "num_records": manifest.num_records,
    "dataset": dataset_fingerprint(manifest),
  }


def dataset_fingerprint(manifest: Manifest) -> str:
  """Identifies the data (schema, shards, counts; not its directory or info)."""
  d = manifest.to_dict()
  del d["info"]
  return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def make_host_pipeline(
  config: InputConfig | Any,
  feature_specs: Any,
  *,
  local_device_count: int,
  global_device_count: int,
  process_index: int | None = None,
  process_count: int | None = None,
  fdo_client: Any = None,
  worker_init_fn: Callable[[int, int], None] | None = None,
  placement: Callable[[grain.IterDataset], grain.IterDataset] | None = None,
) -> InputPipelineIterator:
  """The checkpointable iterator of the whole host pipeline.

  Yields PreprocessedBatch (numpy TrainBatch + stats), or what `placement`
  makes of them (the device side passes its device_put stage). With
  `process_index/process_count` (default: this JAX process) tools and tests
  simulate other hosts.
  """
  config, index, count, manifest = _resolve(config, process_index, process_count)
  ds = make_host_dataset(
    config,
    feature_specs,
    local_device_count=local_device_count,
    global_device_count=global_device_count,
    process_index=index,
    process_count=count,
    fdo_client=fdo_client,
    worker_init_fn=worker_init_fn,
    manifest=manifest,
  )
  if placement is not None:
    ds = placement(ds)
  metadata = _metadata(config, manifest, index, count)
  return iter(_PipelineDataset(ds, metadata, manifest.examples_per_record))


# One thread computing two batches ahead: with Grain's default read options
# (16 threads, 500 elements ahead) the eval input ran at a third of this
# speed or less on 2 cores, and it would hold hundreds of batches.
EVAL_READ_OPTIONS = grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)


def make_eval_pipeline(
  config: InputConfig | Any,
  feature_specs: Any,
  *,
  local_device_count: int,
  global_device_count: int,
  process_index: int | None = None,
  process_count: int | None = None,
  worker_init_fn: Callable[[int, int], None] | None = None,
  placement: Callable[[grain.IterDataset], grain.IterDataset] | None = None,
) -> grain.IterDataset:
  """One ordered pass over an eval set: a dataset of EvalBatch (iterate it per eval).

  Every example is in exactly one batch; the last batches are padded to
  per_host_batch_size and masked, and every host gets the same number of
  batches (see grain_eval). Uses the config's data_dir, per_host_batch_size,
  COO settings, num_workers and reader settings; shuffle, seed and
  num_epochs do not apply, and corrupt records are errors whatever
  skip_corrupt says. The feature specs are the train step's (same limits).
  """
  config, index, count, manifest = _resolve(config, process_index, process_count)
  _check_specs(feature_specs, manifest, config.per_host_batch_size * count)
  ds = eval_positions(
    manifest.num_examples, config.per_host_batch_size, process_index=index, process_count=count
  )
  ds = ds.map(
    ReadEvalExamples(
      manifest, reader_options={"max_parallelism": str(config.reader_max_parallelism)}
    )
  )
  args = _preprocess_args(config, local_device_count, global_device_count)
  ds = ds.map(PreprocessEval(feature_specs, **args)).to_iter_dataset(EVAL_READ_OPTIONS)
  ds = prefetch_in_workers(
    ds, config.num_workers, buffer_size=config.worker_buffer_size, worker_init_fn=worker_init_fn
  )
  return placement(ds) if placement is not None else ds

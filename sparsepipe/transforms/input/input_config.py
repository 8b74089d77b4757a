"""The input settings, and which host a pipeline reads for."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import grain

from sparsepipe.data.manifest import Manifest, read_manifest

# Records only by default here, as in 0.3, so a library user's batches stay
# what they were; the launcher's new jobs take a window of 256
# (launch/config/packing.py).
DEFAULT_SHUFFLE_WINDOW = 0


@dataclasses.dataclass(frozen=True)
class InputConfig:
  """Input settings (an ml_collections.ConfigDict with these keys works too).

  Attributes:
    data_dir: dataset directory (with manifest.json).
    per_host_batch_size: examples per batch on this host.
    seed: shuffle seed (the same on every host).
    shuffle: shuffle records each epoch (example_order.py).
    shuffle_window: with shuffle, also shuffle the examples of each window
      of this many consecutive records of the shuffled record order
      (example_order.py; for datasets of more than one example per record).
      0: records only, their examples stay together (0.3's order).
    num_epochs: None repeats forever; else as many whole batches as the
      epochs hold (the last partial batch is dropped).
    num_workers: Grain worker processes (0: in this process, in
      `read_threads` background threads); the batches do not depend on it.
    worker_buffer_size: batches buffered per worker.
    read_threads: threads reading and preprocessing batches ahead (per
      worker, or in this process without workers).
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
  shuffle_window: int = DEFAULT_SHUFFLE_WINDOW
  num_epochs: int | None = None
  num_workers: int = 0
  worker_buffer_size: int = 2
  read_threads: int = 1
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
    if self.read_threads < 1:
      raise ValueError(f"read_threads={self.read_threads} must be >= 1")
    if self.shuffle_window < 0:
      raise ValueError(f"shuffle_window={self.shuffle_window} records must be >= 0")
    if not 0 <= self.seed < 2**32:
      raise ValueError(f"seed={self.seed} must be in [0, 2**32)")
    if self.num_epochs is not None and self.num_epochs < 1:
      raise ValueError(f"num_epochs={self.num_epochs} must be >= 1 (or None: repeat forever)")
    for name in ("num_sc_per_device", "worker_buffer_size"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
    if self.reader_max_parallelism < 0:
      raise ValueError(f"reader_max_parallelism={self.reader_max_parallelism} must be >= 0")
    if str(self.sharding_strategy).upper() != "MOD":
      raise ValueError(f"sharding_strategy {self.sharding_strategy!r} is not supported; only MOD")

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

  @property
  def reader_options(self) -> dict[str, str]:
    return {"max_parallelism": str(self.reader_max_parallelism)}


def process_slice(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  """(this host's index, host count): given, or this JAX process's."""
  if process_index is None and process_count is None:
    shard = grain.sharding.ShardByJaxProcess()
    return int(shard.shard_index), int(shard.shard_count)
  if process_index is None or process_count is None:
    raise ValueError("give both process_index and process_count, or neither")
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} not in [0, process_count={process_count})")
  return int(process_index), int(process_count)


def resolve(
  config: InputConfig | Any,
  process_index: int | None,
  process_count: int | None,
  manifest: Manifest | None = None,
) -> tuple[InputConfig, int, int, Manifest]:
  """(config, this host's index, host count, the dataset's manifest) of an entry point."""
  config = InputConfig.from_config(config)
  index, count = process_slice(process_index, process_count)
  if manifest is None:
    manifest = read_manifest(config.data_dir, verify_shards=config.verify_shards)
  return config, index, count, manifest

"""The Orbax handlers: array items without replica-parallel saves, and "metadata".

Array items use Orbax's PyTreeCheckpointHandler with the standard type
handlers, except that replicated arrays are not split over replicas for
writing: that split slices every replicated array on the devices while the
loop waits (compiling a slice per shape on the first save) and would hand
Orbax other host copies than the shards the fingerprints are taken from.

The "metadata" item is JSON written in the background.

Like Orbax's JsonCheckpointHandler, plus the array fingerprints: save()
hands the host shards of the saved arrays over once Orbax has copied them
(`PendingShards`), and the background commit sums them
(integrity/host_fingerprint.py) and writes this process's partial sums to
`fingerprints.process_<i>.json`, sealed with its sha256. Process 0 also
writes `metadata.json` (sealed). The files are plain JSON.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from typing import Any, List, Mapping, Optional

import jax
import orbax.checkpoint as ocp
from etils import epath

# Orbax's own choice of chunk shape (not exported; orbax-checkpoint 0.12.x).
from orbax.checkpoint._src.arrays import subchunking

from sparsepipe.checkpointing.integrity import host_fingerprint
from sparsepipe.checkpointing.integrity import digests as integrity

METADATA_FILENAME = "metadata.json"


_IN_FLIGHT_FLOOR = 256 << 20

# The size of a save's OCDBT data files: TensorStore holds a data file's bytes
# in memory until the file is written, and Orbax's default is 2 GiB (400 MiB
# on GCS). With chunks that are never tiny (`chunk_byte_size`), 2 MiB files
# made the criteo job's synchronous save at 4x vocabularies hold less than
# 16 MiB ones (+180-210 MB, not +260-300 MB) and take half the time
# (benchmarks/memory.py --sections growth).
DATA_FILE_MB = 2.0


def in_flight_bound(tree: Any) -> int:
  """Bytes a save may write, or a restore read, at once for `tree`'s arrays
  (concrete or abstract, with shardings): twice the largest shard this
  process holds, at least 256 MiB.

  Orbax writes, and reads, every shard at once: TensorStore's buffers held
  0.8x the arrays' bytes during a save (benchmarks/memory.py: a criteo save
  on 8 CPU devices, 2.3 GB for 2.9 GB of arrays), and a restore holds what
  it has read beside the arrays it makes. With this bound they stay a few
  shards' worth (with `array_save`'s data files, a few files' worth), whatever
  the tables' size. Orbax refuses a shard at or over its bound, hence twice
  the largest.
  """
  largest = 0
  for leaf in jax.tree.leaves(tree):
    largest = max(largest, math.prod(_shard_shape(leaf)) * jax.numpy.dtype(leaf.dtype).itemsize)
  return max(_IN_FLIGHT_FLOOR, 2 * largest)


def _shard_shape(leaf: Any) -> tuple[int, ...]:
  """The shape of the shard of `leaf` one device holds (its shape without a sharding)."""
  shape = tuple(leaf.shape)
  sharding = getattr(leaf, "sharding", None)
  return tuple(sharding.shard_shape(shape)) if sharding is not None else shape


def array_handler(
  host_copy_gb: float = 0.0, in_flight_bytes: int | None = None
) -> ocp.PyTreeCheckpointHandler:
  """The handler of the array items (see the module docstring).

  `in_flight_bytes` bounds the bytes a save writes, and a restore reads, at
  once (Orbax's save_concurrent_gb and restore_concurrent_gb; see
  `in_flight_bound`), None: no bound.

  `host_copy_gb` > 0 bounds the device-to-host copies a save has in flight
  at once (Orbax's save_device_host_concurrent_gb): arrays are copied in
  batches of about that size, each written before the next is copied, so a
  save of device arrays (GPU, TPU) does not hold a whole host copy of the
  state; the save is then partly synchronous. 0: no bound (Orbax copies
  every array at once).
  """
  types = ocp.type_handlers.supported_types()
  handlers = [(t, ocp.type_handlers.get_type_handler(t)) for t in types if t is not jax.Array]
  handlers.append((jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False)))
  registry = ocp.type_handlers.create_type_handler_registry(*handlers)
  in_flight_gb = None if in_flight_bytes is None else in_flight_bytes / 1e9
  return ocp.PyTreeCheckpointHandler(
    type_handler_registry=registry,
    save_device_host_concurrent_gb=host_copy_gb if host_copy_gb > 0 else None,
    save_concurrent_gb=in_flight_gb,
    restore_concurrent_gb=in_flight_gb,
  )


# A chunk under 1/_TINY_CHUNK of the data files' size is refused for a larger one.
_TINY_CHUNK = 8


def _orbax_chunk_shape(
  global_shape: tuple[int, ...], write_shape: tuple[int, ...], dtype: Any, target: int
) -> tuple[int, ...]:
  """The chunk shape Orbax picks for `chunk_byte_size=target` (its own choice:
  every dimension a divisor of the written shard's, the sharded ones cut first)."""
  return tuple(subchunking.choose_chunk_shape(global_shape, write_shape, dtype, target))


def chunk_byte_size(global_shape: Any, write_shape: Any, dtype: Any, target: int) -> int:
  """The chunk_byte_size to give Orbax for an array of `global_shape` whose
  shards are `write_shape`, so that its chunks hold about `target` bytes.

  Orbax's chunks divide the shard, so their size follows the shard's factors,
  not the target: a stacked table's shard of 2,906,432 rows (2**6 * 45413, the
  criteo stack at 4x vocabularies on 8 devices) is cut into chunks of 64 rows
  (4 KiB) for a 2 MiB target, 1.4 million chunks per table and slot; TensorStore
  and OCDBT keep per-chunk state for the whole save, and the job's save held
  ~0.9 GB more and took 3x as long (benchmarks/memory.py). A chunk smaller than
  1/8 of the target is therefore replaced by the smallest larger one Orbax can
  pick (45413 rows, 2.9 MB, there): at most one shard, never tiny.
  """
  global_shape = tuple(int(d) for d in global_shape)
  write_shape = tuple(int(d) for d in write_shape)
  dtype = jax.numpy.dtype(dtype)
  whole = math.prod(max(1, d) for d in write_shape) * dtype.itemsize
  if whole <= target:
    return target
  chunk = math.prod(_orbax_chunk_shape(global_shape, write_shape, dtype, target)) * dtype.itemsize
  bigger = target
  while chunk * _TINY_CHUNK < target and bigger < whole:
    bigger = min(2 * bigger, whole)
    chunk = math.prod(_orbax_chunk_shape(global_shape, write_shape, dtype, bigger)) * dtype.itemsize
  return max(target, chunk) if chunk * _TINY_CHUNK >= target else target


def _leaf_chunk_byte_size(leaf: Any, target: int) -> int:
  if not getattr(leaf, "shape", ()) or getattr(leaf, "dtype", None) is None:
    return target
  return chunk_byte_size(leaf.shape, _shard_shape(leaf), leaf.dtype, target)


def array_save(tree: Any, data_file_mb: float = DATA_FILE_MB) -> ocp.args.PyTreeSave:
  """Saves `tree` in chunks of about `data_file_mb` MiB, into OCDBT data files
  of about that size (Orbax's chunk_byte_size and ocdbt_target_data_file_size).

  TensorStore holds a data file's bytes in host memory until it writes the
  file, so the files' size, not the state's or a shard's, bounds what a save's
  writes hold (benchmarks/memory.py, docs/reference/config.md "Memory and saves").
  Chunks evenly divide a shard: where the shard's rows have no divisor near
  the target, a chunk is the smallest larger one (`chunk_byte_size`), and the
  data files are as large as the largest chunk.
  """
  size = int(data_file_mb * 2**20)
  sizes = jax.tree.map(lambda leaf: _leaf_chunk_byte_size(leaf, size), tree)
  save_args = jax.tree.map(lambda n: ocp.SaveArgs(chunk_byte_size=n), sizes)
  file_size = max(jax.tree.leaves(sizes), default=size)  # each at least `size`
  return ocp.args.PyTreeSave(tree, save_args=save_args, ocdbt_target_data_file_size=file_size)


def array_restore(target: Any, partial: bool = False) -> ocp.args.PyTreeRestore:
  """Reads into `target`'s shapes, dtypes and shardings (`partial`: only
  the subtrees `target` has)."""
  return ocp.args.PyTreeRestore(
    item=target,
    restore_args=ocp.checkpoint_utils.construct_restore_args(target),
    partial_restore=partial,
  )


def fingerprint_filename(process_index: int) -> str:
  """The file of one process's partial fingerprint sums."""
  return f"fingerprints.process_{process_index}.json"


class PendingShards:
  """Host shards of the saved arrays, handed from save() to the commit.

  The commit starts while save() still runs; it waits here until save()
  either hands the shards over (`set`) or gives up (`fail`).
  """

  def __init__(self):
    self._ready = threading.Event()
    self._shards: Any = None
    self._error: BaseException | None = None

  def set(self, shards: Mapping[str, Any]) -> None:
    self._shards = shards
    self._ready.set()

  def fail(self, error: BaseException) -> None:
    if not self._ready.is_set():
      self._error = error
      self._ready.set()

  def take(self) -> Mapping[str, Any]:
    self._ready.wait()
    if self._error is not None:
      raise RuntimeError("the save was abandoned before its arrays were copied") from self._error
    shards, self._shards = self._shards, None  # frees the host copies early
    return shards


class MetadataHandler(ocp.handlers.AsyncCheckpointHandler):
  """Saves a JSON object and the partial fingerprint sums, at commit.

  The written objects are sealed with their own sha256 (integrity.seal);
  `restore` returns metadata.json as read, the caller unseals it.
  """

  def _write(self, directory: epath.Path, args: "MetadataSave") -> None:
    index = jax.process_index()
    if args.shards is not None:
      partial = {
        item: host_fingerprint.partial_sums(shards) for item, shards in args.shards.take().items()
      }
      text = json.dumps(integrity.seal({"partial_sums": partial}))
      (directory / fingerprint_filename(index)).write_text(text)
    if index == 0:
      data = integrity.seal(args.item)
      (directory / METADATA_FILENAME).write_text(json.dumps(data, indent=1))

  async def async_save(
    self, directory: epath.Path, args: "MetadataSave"
  ) -> Optional[List[ocp.future.Future]]:
    async def commit():
      self._write(directory, args)

    return [
      ocp.future.CommitFutureAwaitingContractedSignals(commit(), name="sparsepipe_metadata_save")
    ]

  def save(self, directory: epath.Path, args: "MetadataSave") -> None:
    self._write(directory, args)

  def restore(self, directory: epath.Path, args: Optional["MetadataRestore"] = None) -> Any:
    del args
    path = directory / METADATA_FILENAME
    if not path.exists():
      raise FileNotFoundError(f"{path} does not exist")
    return json.loads(path.read_text())

  def metadata(self, directory: epath.Path) -> None:
    del directory
    return None

  def finalize(self, directory: epath.Path) -> None:
    del directory

  def close(self) -> None:
    pass


@ocp.args.register_with_handler(MetadataHandler, for_save=True)
@dataclasses.dataclass
class MetadataSave(ocp.args.CheckpointArgs):
  item: Mapping[str, Any]
  shards: Optional[PendingShards] = None  # {item: take_shards(...)}


@ocp.args.register_with_handler(MetadataHandler, for_restore=True)
@dataclasses.dataclass
class MetadataRestore(ocp.args.CheckpointArgs):
  pass

"""Checkpoint speed: async vs sync save, restore, restart to first resumed step.

The state is shaped like a training job's (mostly embedding tables and a
slot sharded by rows, a ZeRO-sharded dense optimizer state, replicated
params, a small pipeline state, a Grain iterator, FDO JSON). Measured:

- async save blocking: how long the training loop waits in save() (steady
  state: the previous save has finished), and the background write time;
- sync save: the whole save of the same state without the async thread;
- the ratio async blocking / sync save (target <= 8%, fingerprints on);
- the first save's blocking over a later one's (target <= 3x);
- a save right after a fresh iterator's first batch, while Grain's read-ahead
  threads run Python (every thread Orbax starts then waits for the GIL): the
  job's iterator (transforms.InputIterator, which the save pauses), and a
  plain Grain iterator (nothing to pause), both with Grain's default
  read-ahead (16 threads, 500 batches);
- the fingerprint passes alone: on the devices (what restore verifies) and
  on the host copies (what a save computes in the background);
- restore: reading and verifying the newest step into sharded targets;
- restart to first step: a fresh process (interpreter start, imports,
  restore, compile, one step) until the first resumed step is done.

  python benchmarks/checkpoint.py [--state_mb 256] [--repeats 5] [--json PATH]
"""

from __future__ import annotations

import os
import sys
import time

_PROCESS_START = time.time()

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  ).strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # pylint: disable=g-import-not-at-top,wrong-import-position
import json  # pylint: disable=g-import-not-at-top,wrong-import-position
import shutil  # pylint: disable=g-import-not-at-top,wrong-import-position
import statistics  # pylint: disable=g-import-not-at-top,wrong-import-position
import subprocess  # pylint: disable=g-import-not-at-top,wrong-import-position
import tempfile  # pylint: disable=g-import-not-at-top,wrong-import-position
from typing import Any, Callable  # pylint: disable=g-import-not-at-top,wrong-import-position

import grain  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top,wrong-import-position

from sparsepipe import core  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe import transforms  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe import checkpointing as ckpt  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.checkpointing.integrity import fingerprint  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.checkpointing.integrity import host_fingerprint  # pylint: disable=g-import-not-at-top,wrong-import-position
import outputs  # pylint: disable=g-import-not-at-top,wrong-import-position

DIM = 64
DENSE = 512


def shapes(state_mb: int, devices: int) -> dict[str, int]:
  """Table rows so that tables + slot are ~90% of state_mb."""
  rows = int(state_mb * 0.9 * 2**20 / (2 * DIM * 4))
  rows -= rows % (8 * devices)
  return {"rows": rows}


def abstract_state(mesh: Mesh, state_mb: int) -> tuple[Any, Any, Any]:
  rows = shapes(state_mb, mesh.size)["rows"]
  rep, by_rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  flat = -(-DENSE * DENSE // mesh.size) * mesh.size
  s = lambda shape, sharding, dtype=jnp.float32: jax.ShapeDtypeStruct(
    shape, dtype, sharding=sharding
  )
  train = {
    "params": {"w": s((DENSE, DENSE), rep)},
    "opt": {"mu": s((flat,), by_rows), "nu": s((flat,), by_rows)},
    "step": s((), rep, jnp.int32),
  }
  embeddings = {"table": s((rows, DIM), by_rows), "slot": s((rows, DIM), by_rows)}
  pipeline = {"activations": s((1024, DIM), by_rows)}
  return train, embeddings, pipeline


def init_state(abstract: Any) -> Any:
  """Random values: constant ones would compress to nothing on write."""
  leaves, tree = jax.tree.flatten(abstract)
  keys = jax.random.split(jax.random.key(0), len(leaves))

  def make(key, a):
    if a.dtype == jnp.int32:
      return jax.jit(lambda: jnp.zeros(a.shape, a.dtype), out_shardings=a.sharding)()
    return jax.jit(lambda k: jax.random.normal(k, a.shape, a.dtype), out_shardings=a.sharding)(key)

  return jax.tree.unflatten(tree, [make(k, a) for k, a in zip(keys, leaves)])


@jax.jit
def train_step(state):
  """Touches every array (like an optimizer step would)."""
  return jax.tree.map(lambda x: x * 0.999 if x.dtype == jnp.float32 else x + 1, state)


def batches() -> grain.MapDataset:
  return grain.MapDataset.range(10**6).map(lambda i: np.int64(i) * 2).batch(64)


def make_iterator(read_ahead: bool = False) -> Any:
  """The saved Grain iterator; without read-ahead threads unless asked.

  Grain's read-ahead threads fill their buffer after the first batch; while
  they run Python, every thread Orbax starts in save() waits for the GIL.
  The save figures are taken without them; `timed_busy_saves` measures that
  case on its own.
  """
  options = None if read_ahead else grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
  return iter(batches().to_iter_dataset(options))


_NO_STATS = core.SparseDenseMatmulInputStats({}, {})


def make_input_iterator() -> transforms.InputIterator:
  """The job's kind of iterator over the same batches and read-ahead."""
  return transforms.InputIterator(
    batches().map(lambda batch: transforms.PreprocessedBatch(batch, _NO_STATS)),
    lambda ds: ds.to_iter_dataset(),
    place=None,
    metadata={"benchmark": "checkpoint"},
  )


def run_info(mesh: Mesh) -> ckpt.RunInfo:
  return ckpt.RunInfo.create({"benchmark": "checkpoint"}, mesh, data_worker_count=0)


def nbytes(tree: Any) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def timed_saves(
  directory: str,
  mesh: Mesh,
  state: Any,
  repeats: int,
  *,
  async_save: bool,
  fingerprint_arrays: bool,
):
  """(first blocking, steady blockings, background writes) in seconds."""
  iterator = make_iterator()
  manager = ckpt.TrainingCheckpointManager(
    directory,
    run_info(mesh),
    async_save=async_save,
    keep_latest=2,
    fingerprint_arrays=fingerprint_arrays,
  )
  blocking, background = [], []
  for i in range(repeats + 1):
    state = train_step(state)
    next(iterator)
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    manager.save(
      i + 1,
      ckpt.CheckpointItems(*state, iterator, {"limits": {}, "stats": {"i": i}}),
      ckpt.LoopPosition(i + 1, i + 1),
      force=True,
    )
    t1 = time.perf_counter()
    manager.wait_until_finished()
    t2 = time.perf_counter()
    blocking.append(t1 - t0)
    background.append(t2 - t1)
  manager.close()
  return blocking[0], blocking[1:], background[1:], state


def timed_busy_saves(
  directory: str, mesh: Mesh, state: Any, repeats: int, make: Callable[[], Any]
) -> list[float]:
  """Async save blocking right after a fresh iterator's first batch (`make()`),
  while its read-ahead threads fill their buffer (Python busy in the background)."""
  blocking = []
  with ckpt.TrainingCheckpointManager(directory, run_info(mesh), keep_latest=2) as manager:
    for i in range(repeats):
      iterator = make()
      next(iterator)
      t0 = time.perf_counter()
      manager.save(
        i + 1,
        ckpt.CheckpointItems(*state, iterator, {}),
        ckpt.LoopPosition(i + 1, i + 1),
        force=True,
      )
      blocking.append(time.perf_counter() - t0)
      manager.wait_until_finished()
      close = getattr(iterator, "close", None)
      if close is not None:
        close()
  return blocking


def timed_restore(directory: str, mesh: Mesh, abstract: Any, repeats: int):
  times = []
  for _ in range(repeats):
    manager = ckpt.TrainingCheckpointManager(directory, run_info(mesh))
    t0 = time.perf_counter()
    restored = manager.restore(ckpt.RestoreTargets(*abstract, make_iterator()))
    jax.block_until_ready((restored.train_state, restored.embeddings, restored.pipeline_state))
    times.append(time.perf_counter() - t0)
    manager.close()
  return times


def timed_fingerprints(state: Any, repeats: int) -> list[float]:
  times = []
  for _ in range(repeats + 1):
    t0 = time.perf_counter()
    fingerprint.resolve(fingerprint.tree_fingerprints(state))
    times.append(time.perf_counter() - t0)
  return times[1:]


def timed_host_fingerprints(state: Any, repeats: int) -> list[float]:
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    host_fingerprint.partial_sums(host_fingerprint.take_shards(state, "state"))
    times.append(time.perf_counter() - t0)
  return times


def child(args: Any) -> None:
  """A restarted job: restore the newest step, run one step, report times."""
  mesh = Mesh(np.asarray(jax.devices()), ("data",))
  abstract = abstract_state(mesh, args.state_mb)
  t_ready = time.time()
  manager = ckpt.TrainingCheckpointManager(args.directory, run_info(mesh))
  restored = manager.restore(ckpt.RestoreTargets(*abstract, make_iterator()))
  t_restored = time.time()
  state = (restored.train_state, restored.embeddings, restored.pipeline_state)
  jax.block_until_ready(train_step(state))
  next(restored.data_iter)
  t_step = time.time()
  manager.close()
  print(
    json.dumps(
      {
        "process_start": _PROCESS_START,
        "ready": t_ready,
        "restored": t_restored,
        "first_step": t_step,
      }
    )
  )


def restart_to_first_step(args: Any, directory: str) -> dict[str, float]:
  t0 = time.time()
  out = subprocess.run(
    [
      sys.executable,
      os.path.abspath(__file__),
      "--child",
      "--directory",
      directory,
      "--state_mb",
      str(args.state_mb),
    ],
    check=True,
    capture_output=True,
    text=True,
  )
  times = json.loads(out.stdout.strip().splitlines()[-1])
  return {
    "total_s": times["first_step"] - t0,
    "start_and_imports_s": times["ready"] - t0,
    "restore_s": times["restored"] - times["ready"],
    "first_step_s": times["first_step"] - times["restored"],
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--state_mb", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--json", default=None, type=outputs.argparse_path)
  parser.add_argument("--directory", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  flags.FLAGS.mark_as_parsed()
  if args.child:
    child(args)
    return

  mesh = Mesh(np.asarray(jax.devices()), ("data",))
  abstract = abstract_state(mesh, args.state_mb)
  state = init_state(abstract)
  root = tempfile.mkdtemp(prefix="sparsepipe_ckpt_bench_")
  try:
    saves = {}
    for mode in ("async", "sync"):
      for verify in (True, False):
        name = f"{mode}{'' if verify else '_nofp'}"
        *saves[name], state = timed_saves(
          os.path.join(root, name),
          mesh,
          state,
          args.repeats,
          async_save=mode == "async",
          fingerprint_arrays=verify,
        )
    busy = [
      timed_busy_saves(os.path.join(root, f"busy_{i}"), mesh, state, args.repeats, make)
      for i, make in enumerate((make_input_iterator, lambda: make_iterator(read_ahead=True)))
    ]
    restore = timed_restore(os.path.join(root, "async"), mesh, abstract, 3)
    restore_nofp = timed_restore(os.path.join(root, "async_nofp"), mesh, abstract, 3)
    fingerprints = timed_fingerprints(state, 3)
    host_fingerprints = timed_host_fingerprints(state, 3)
    restart = restart_to_first_step(args, os.path.join(root, "async"))
  finally:
    shutil.rmtree(root, ignore_errors=True)
  timings = (busy, restore, restore_nofp, fingerprints, host_fingerprints)
  report(args, state, saves, timings, restart)


def report(args, state, saves, timings, restart):
  """Prints the table and writes the --json figures."""
  med = statistics.median
  busy, restore, restore_nofp, fingerprints, host_fingerprints = timings
  block = {name: med(v[1]) for name, v in saves.items()}
  figures = {
    "device": f"{jax.devices()[0].platform} x{len(jax.devices())}",
    "state_mb": round(nbytes(state) / 2**20, 1),
    "async_save_blocking_s": block["async"],
    "async_save_first_blocking_s": saves["async"][0],
    "first_over_later_async_blocking": saves["async"][0] / block["async"],
    "async_background_write_s": med(saves["async"][2]),
    "async_save_blocking_input_busy_s": med(busy[0]),
    "input_busy_over_idle_async_blocking": med(busy[0]) / block["async"],
    "async_save_blocking_input_busy_unpaused_s": med(busy[1]),
    "input_busy_unpaused_over_idle_async_blocking": med(busy[1]) / block["async"],
    "sync_save_s": block["sync"],
    "async_blocking_over_sync": block["async"] / block["sync"],
    "no_fingerprints_async_save_blocking_s": block["async_nofp"],
    "no_fingerprints_sync_save_s": block["sync_nofp"],
    "no_fingerprints_async_blocking_over_sync": (block["async_nofp"] / block["sync_nofp"]),
    "restore_s": med(restore),
    "no_fingerprints_restore_s": med(restore_nofp),
    "fingerprint_pass_s": med(fingerprints),
    "host_fingerprint_pass_s": med(host_fingerprints),
    "restart_to_first_step_s": restart["total_s"],
    "restart_breakdown": restart,
  }
  ms = lambda seconds: f"{seconds * 1e3:.1f} ms"
  rows = [
    ("device", figures["device"]),
    ("state size", f"{figures['state_mb']} MiB"),
    ("", "with fingerprints | without"),
    ("async save: loop blocked (median)", f"{ms(block['async'])} | {ms(block['async_nofp'])}"),
    ("sync save (median)", f"{ms(block['sync'])} | {ms(block['sync_nofp'])}"),
    (
      "async blocking / sync save",
      f"{figures['async_blocking_over_sync'] * 100:.1f} % |"
      f" {figures['no_fingerprints_async_blocking_over_sync'] * 100:.1f} %",
    ),
    ("restore (read + verify)", f"{ms(med(restore))} | {ms(med(restore_nofp))}"),
    (
      "async save: first save blocked",
      f"{ms(saves['async'][0])} ({figures['first_over_later_async_blocking']:.1f}x a later save)",
    ),
    ("async save: background write", ms(med(saves["async"][2]))),
    (
      "async save blocked, input threads busy",
      f"{ms(med(busy[0]))} ({med(busy[0]) / block['async']:.1f}x an idle-input save)",
    ),
    (
      "  the same, a plain Grain iterator (unpaused)",
      f"{ms(med(busy[1]))} ({med(busy[1]) / block['async']:.1f}x)",
    ),
    ("fingerprint pass alone: devices", ms(med(fingerprints))),
    ("fingerprint pass alone: host copies", ms(med(host_fingerprints))),
    ("restart to first resumed step", f"{restart['total_s']:.2f} s"),
    ("  start + imports", f"{restart['start_and_imports_s']:.2f} s"),
    ("  restore", f"{restart['restore_s']:.2f} s"),
    ("  compile + first step", f"{restart['first_step_s']:.2f} s"),
  ]
  width = max(len(k) for k, _ in rows)
  for key, value in rows:
    print(f"{key:<{width}}  {value}")
  if args.json:
    outputs.write(args.json, figures, indent=2)


if __name__ == "__main__":
  main()

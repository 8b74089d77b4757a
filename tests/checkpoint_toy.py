"""A small, generic training job for checkpoint tests (library and script).

It has every part of a real job that resume must get right: a Grain
iterator (shuffle, map, batch; optionally mp_prefetch workers), a jitted
step over sharded state that donates its inputs, an optax optimizer, a
"pipelined" embedding update that lands one step late (so the pipeline
state matters), FDO-like JSON statistics, and a record of every consumed
batch inside the state. Two runs that consumed the same batches in the same
order end with bit-identical arrays.

As a script (the subprocess tests run it):

  python tests/checkpoint_toy.py --workdir DIR --out FINAL.npz \
      --num_steps 20 --save_every 5 [--workers 1] [--kill_self_after_save 10]
      [--step_sleep 0.2] [--num_processes 2 --process_id I --coordinator H:P]

prints `step N` after each step and `save N` after each started save, exits
0 when done, PREEMPTED_EXIT_CODE after a SIGTERM (having saved).
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
import time
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sparsepipe.checkpointing import PREEMPTED_EXIT_CODE
from sparsepipe.checkpointing import PreemptionWatcher
from sparsepipe.checkpointing import LoopPosition
from sparsepipe.checkpointing import RestoreTargets
from sparsepipe.checkpointing import RunInfo
from sparsepipe.checkpointing import TrainingCheckpointManager
from sparsepipe.checkpointing import CheckpointItems
from sparsepipe.checkpointing import abstract_of
from sparsepipe.core import ignore_stop_signals_in_worker

BATCH = 16
VOCAB = 256
DIM = 16
NUM_EXAMPLES = 4096


def assert_same_trees(got: Any, want: Any, *, shardings: bool = True) -> None:
  """Same structure and bit-identical leaves (and equivalent shardings)."""
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert x.shape == y.shape and x.dtype == y.dtype, (x, y)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    if shardings:
      assert x.sharding.is_equivalent_to(y.sharding, x.ndim), (x.sharding, y.sharding)


def make_mesh(devices: Any = None) -> Mesh:
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices), ("data",))


def example(index: int) -> dict[str, np.ndarray]:
  """Example `index`: two ids and four features, derived from the index."""
  rng = np.random.default_rng(index)
  return {
    "index": np.int32(index),
    "ids": rng.integers(0, VOCAB, size=2).astype(np.int32),
    "x": rng.standard_normal(4).astype(np.float32),
  }


def make_iterator(num_workers: int = 0, seed: int = 7) -> Any:
  """shuffle -> host slice -> map -> batch (-> mp_prefetch), checkpointable.

  Every process reads its own slice and batches BATCH / process_count
  examples, so the global batch is always BATCH.
  """
  index, count = jax.process_index(), jax.process_count()
  ds = grain.MapDataset.range(NUM_EXAMPLES).shuffle(seed=seed)[index::count]
  ds = ds.map(example).batch(BATCH // count, drop_remainder=True)
  ds = ds.to_iter_dataset()
  if num_workers:
    ds = ds.mp_prefetch(
      grain.multiprocessing.MultiprocessingOptions(num_workers=num_workers),
      worker_init_fn=ignore_stop_signals_in_worker,
    )
  return iter(ds)


def _host_state(num_steps: int) -> tuple[Any, Any, Any]:
  """The initial state as numpy arrays (no device op, nothing to compile)."""
  rng = np.random.default_rng(0)
  params = {
    "w": (rng.standard_normal((4 + DIM, 4)) * 0.1).astype(np.float32),
    "b": np.zeros((4,), np.float32),
  }
  opt_shapes = jax.eval_shape(optax.adam(1e-2).init, params)
  train_state = {
    "params": params,
    "opt": jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), opt_shapes),
    "step": np.zeros((), np.int32),
    "consumed": np.full((num_steps, BATCH), -1, np.int32),
  }
  embeddings = {
    "table": (rng.standard_normal((VOCAB, DIM)) * 0.1).astype(np.float32),
    "accumulator": np.full((VOCAB, DIM), 0.1, np.float32),
  }
  pipeline_state = {
    "ids": np.zeros((BATCH, 2), np.int32),
    "grad": np.zeros((BATCH, DIM), np.float32),
    "valid": np.zeros((), bool),
  }
  return train_state, embeddings, pipeline_state


def state_shardings(mesh: Mesh) -> tuple[Any, Any, Any]:
  """The shardings of the state's trees (fixed for the whole run)."""
  rep = NamedSharding(mesh, P())
  rows = NamedSharding(mesh, P("data"))
  train, embeddings, pipeline = jax.tree.map(lambda _: rep, _host_state(1))
  train["consumed"] = NamedSharding(mesh, P(None, "data"))
  embeddings = jax.tree.map(lambda _: rows, embeddings)
  pipeline["ids"] = pipeline["grad"] = rows
  return train, embeddings, pipeline


def init_state(mesh: Mesh, num_steps: int) -> tuple[Any, Any, Any]:
  """(train_state, embeddings, pipeline_state) on `mesh`, from a fixed seed."""
  return jax.device_put(_host_state(num_steps), state_shardings(mesh))


def _loss(params, emb, x, target):
  h = jnp.concatenate([x, emb], axis=1)
  pred = h @ params["w"] + params["b"]
  return jnp.mean((pred - target) ** 2)


def _step(train_state, embeddings, pipeline_state, batch):
  table, acc = embeddings["table"], embeddings["accumulator"]
  # The embedding update of the previous batch lands now (pipelining).
  g = pipeline_state["grad"] * pipeline_state["valid"]
  rows = pipeline_state["ids"]
  for j in range(2):
    acc = acc.at[rows[:, j]].add(g * g)
    table = table.at[rows[:, j]].add(-0.05 * g / jnp.sqrt(acc[rows[:, j]]))
  ids, x = batch["ids"], batch["x"]
  emb = table[ids[:, 0]] + table[ids[:, 1]]
  target = jnp.sin(x) * 2.0
  params = train_state["params"]
  loss, (g_params, g_emb) = jax.value_and_grad(_loss, argnums=(0, 1))(params, emb, x, target)
  updates, opt = optax.adam(1e-2).update(g_params, train_state["opt"], params)
  step = train_state["step"]
  new_train = {
    "params": optax.apply_updates(params, updates),
    "opt": opt,
    "step": step + 1,
    "consumed": train_state["consumed"].at[step].set(batch["index"]),
  }
  new_pipe = {"ids": ids, "grad": g_emb, "valid": jnp.ones((), bool)}
  return new_train, {"table": table, "accumulator": acc}, new_pipe, loss


@functools.lru_cache(maxsize=8)
def make_train_step(mesh: Mesh) -> Any:
  """The jitted step with fixed output shardings (those of the state), so a
  restored state and a continued one run the very same program."""
  return jax.jit(
    _step,
    donate_argnums=(0, 1, 2),
    out_shardings=(*state_shardings(mesh), NamedSharding(mesh, P())),
  )


def to_device(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  sharding = NamedSharding(mesh, P("data"))
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}


def update_fdo(fdo: dict[str, Any], batch: dict[str, np.ndarray]) -> dict:
  """FDO-like statistics: running max id and counts, limits derived."""
  stats = dict(fdo.get("stats", {"max_id": 0, "ids_seen": 0}))
  stats["max_id"] = max(stats["max_id"], int(batch["ids"].max()))
  stats["ids_seen"] += int(batch["ids"].size)
  limit = max(8, ((stats["max_id"] // 32) + 1) * 8)
  return {"limits": {"toy_stack": {"max_ids_per_partition": limit}}, "stats": stats}


def config_for(args: Any) -> dict[str, Any]:
  return {
    "model": {"dim": DIM, "vocab": VOCAB},
    "data": {"batch": BATCH, "workers": args.workers},
    "num_steps": args.num_steps,
  }


def final_arrays(train_state, embeddings, pipeline_state) -> dict[str, np.ndarray]:
  """Every leaf as a global numpy array (gathered across processes)."""
  out = {}
  for prefix, tree in (
    ("train", train_state),
    ("emb", embeddings),
    ("pipe", pipeline_state),
  ):
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
      if not leaf.is_fully_addressable:
        leaf = multihost_utils.process_allgather(leaf, tiled=True)
      out[prefix + jax.tree_util.keystr(path)] = np.asarray(leaf)
  return out


def run(args: Any) -> int:
  if args.num_processes > 1:
    jax.distributed.initialize(
      coordinator_address=args.coordinator,
      num_processes=args.num_processes,
      process_id=args.process_id,
    )
  mesh = make_mesh()
  run_info = RunInfo.create(config_for(args), mesh, data_worker_count=args.workers)
  manager = TrainingCheckpointManager(
    args.workdir,
    run_info,
    save_interval_steps=args.save_every,
    keep_latest=2,
    mutable_config_keys=("config.num_steps",),
  )
  iterator = make_iterator(args.workers)
  train_state, embeddings, pipeline_state = init_state(mesh, args.num_steps)
  abstract = abstract_of((train_state, embeddings, pipeline_state))
  train_step = make_train_step(mesh)
  fdo: dict[str, Any] = {}
  step = 0
  restored = manager.restore(RestoreTargets(*abstract, iterator))
  if restored is not None:
    step = restored.step
    train_state, embeddings = restored.train_state, restored.embeddings
    pipeline_state, fdo = restored.pipeline_state, restored.fdo
    print(f"restored {step}", flush=True)
  with PreemptionWatcher(manager) as watcher:
    while step < args.num_steps:
      batch = next(iterator)
      ids = batch["ids"]
      if jax.process_count() > 1:  # FDO statistics are merged over hosts
        ids = multihost_utils.process_allgather(ids, tiled=True)
      fdo = update_fdo(fdo, {"ids": ids})
      train_state, embeddings, pipeline_state, _ = train_step(
        train_state, embeddings, pipeline_state, to_device(batch, mesh)
      )
      step += 1
      print(f"step {step}", flush=True)
      time.sleep(args.step_sleep)
      state = CheckpointItems(train_state, embeddings, pipeline_state, iterator, fdo)
      progress = LoopPosition(pipeline_step=step, batches_consumed=step)
      if manager.save(step, state, progress):
        print(f"save {step}", flush=True)
        if step == args.kill_self_after_save:
          os.kill(os.getpid(), signal.SIGKILL)
      if watcher.should_stop(step):
        manager.save(step, state, progress, force=True)  # no-op if just saved
        manager.close()
        print(f"Preempted: checkpoint step {step} saved", file=sys.stderr, flush=True)
        return PREEMPTED_EXIT_CODE
    # The final save inside the watcher, as the launcher's: a SIGTERM during it
    # is held (the run completes and exits 0), not the default action's kill.
    state = CheckpointItems(train_state, embeddings, pipeline_state, iterator, fdo)
    manager.save(step, state, LoopPosition(step, step), force=True)
    manager.close()
  arrays = final_arrays(train_state, embeddings, pipeline_state)
  arrays["fdo_max_id"] = np.asarray(fdo["stats"]["max_id"])
  if jax.process_index() == 0:
    np.savez(args.out, **arrays)
  print("done", flush=True)
  if args.num_processes > 1:
    jax.distributed.shutdown()
  return 0


def parse_args(argv: list[str]) -> Any:
  parser = argparse.ArgumentParser()
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--num_steps", type=int, default=20)
  parser.add_argument("--save_every", type=int, default=5)
  parser.add_argument("--workers", type=int, default=0)
  parser.add_argument("--kill_self_after_save", type=int, default=-1)
  parser.add_argument("--step_sleep", type=float, default=0.0)
  parser.add_argument("--num_processes", type=int, default=1)
  parser.add_argument("--process_id", type=int, default=0)
  parser.add_argument("--coordinator", default="")
  return parser.parse_args(argv)


if __name__ == "__main__":
  from absl import flags  # pylint: disable=g-import-not-at-top

  flags.FLAGS.mark_as_parsed()
  sys.exit(run(parse_args(sys.argv[1:])))

"""The sparse-heavy shape of benchmarks/step.py: where a batch's time goes.

The model: 26 features of one id per example (Zipf 1.05 over --heavy_vocab
rows each, like criteo's features), embedding dim 64, a DLRM with small
MLPs (bottom (64,), top (64, 32)), batch --heavy_batch, 4 SparseCores per
device, SGD on the tables (the dense baseline has only SGD), ZeRO Adam on
the dense params. It is built as the job builds it (launch.job.JobModel over
a generated synthetic dataset), with COO limits tuned as FDO tunes them
(the first batches' statistics, headroom 1.25).

Per batch, each part timed alone on the same inputs:
- host input: the job's input pipeline in this process (no workers, one read
  thread): read, decode, COO preprocessing, placement on the devices;
- lookup: the SC forward stage (pipelining/sc_stages.py) jitted alone;
- update: the SC backward stage jitted alone, the tables donated;
- dense: the TC stage (training/tc_stage.py) jitted alone, its state donated;
- pipelined step: the trainer's step on batches placed beforehand;
- the same model with the dense gather / scatter-add baseline as its SC
  stages (`pipeline.dense_lookup_baseline`, `dense_sgd_update_baseline`:
  ids [B, 1] per feature, one logical table each, sharded by rows): lookup,
  update and the pipelined step;
- end to end: `pipeline.train` over the job's input with --heavy_workers
  data workers: examples/s and the data wait per batch.

A module of step.py, with no main: run `python benchmarks/step.py --sections
sparse_heavy` (run directly, this file says so and exits with status 2).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable

import jax
import numpy as np
from absl import flags
from jax.sharding import NamedSharding, PartitionSpec

from sparsepipe import core
from sparsepipe import data
from sparsepipe import pipeline as P
from sparsepipe import transforms
from sparsepipe.data.synthetic.generate import zipf_ids
from sparsepipe.launch.config.base_config import base_config
from sparsepipe.launch.config.base_config import feature
from sparsepipe.launch.job import training_data
from sparsepipe.launch.job import fdo
from sparsepipe.launch.job.model import JobModel

_VOCAB = flags.DEFINE_integer("heavy_vocab", 100_000, "Sparse-heavy shape: rows of each table.")
_BATCH = flags.DEFINE_integer("heavy_batch", 4096, "Sparse-heavy shape: global batch.")
_WORKERS = flags.DEFINE_integer("heavy_workers", 2, "Sparse-heavy shape: data workers, end to end.")
_E2E = flags.DEFINE_integer("heavy_e2e_batches", 40, "Sparse-heavy shape: batches end to end.")

FEATURES = 26
DIM = 64
ZIPF = 1.05
LEARNING_RATE = 0.05
_HOST_BATCHES = 4  # distinct batches cycled through by the device timings
_READ_AHEAD = 4  # batches the in-process input may hold (read-ahead 2, placed 1, one in hand)


def heavy_config(examples: int) -> Any:
  """The job config of the sparse-heavy shape."""
  config = base_config(
    (f"C{i}", feature(_VOCAB.value, zipf_exponent=ZIPF)) for i in range(1, FEATURES + 1)
  )
  config.global_batch_size = _BATCH.value
  config.num_sc_per_device = 4
  config.model.embedding_dim = DIM
  config.model.bottom_mlp_dims = (DIM,)
  config.model.top_mlp_dims = (64, 32)
  config.embedding_optimizer.name = "sgd"
  config.embedding_optimizer.learning_rate = LEARNING_RATE
  config.data.num_workers = _WORKERS.value
  config.synthetic.num_examples = examples
  return config


def _tuned_specs(job: JobModel, root: str, batches: int = 8) -> Any:
  """The specs with limits from the first batches' statistics (as FDO sets them)."""
  iterator = job.make_iterator(job.base_specs)
  try:
    for _ in range(batches):
      next(iterator)
    stats = iterator.stats_totals().as_stats()
  finally:
    iterator.close()
  specs, _ = fdo.retune_limits(
    job.base_specs,
    stats,
    stats_dir=os.path.join(root, "fdo"),
    headroom=1.25,
    num_sc_per_device=job.num_sc,
    global_device_count=job.mesh.size,
  )
  return specs


def _in_process_iterator(job: JobModel, specs: Any) -> Any:
  config = dataclasses.replace(job.input_config, num_workers=0)
  return P.make_train_input(config, specs, job.mesh)


def _baseline_stages(specs: Any) -> tuple[Callable, Callable]:
  """SC fwd / bwd stages of the dense baseline: {feature: (ids, weights)} inputs."""

  def fwd(sparse, tables):
    acts = {
      name: P.dense_lookup_baseline(tables[f.table_spec.name], *sparse[name], f.table_spec.combiner)
      for name, f in specs.items()
    }
    return acts, None

  def bwd(sparse, grads, tables, tc_aux):
    del tc_aux
    new = dict(tables)
    for name, f in specs.items():
      t = f.table_spec.name
      new[t] = P.dense_sgd_update_baseline(
        tables[t], *sparse[name], f.table_spec.combiner, grads[name], LEARNING_RATE
      )
    return new, None

  return fwd, bwd


def _baseline_host_batch(specs: Any, seed: int) -> core.TrainBatch:
  """A batch of ids [B, 1] per feature (Zipf, like the dataset's), dense and labels."""
  rng = np.random.default_rng(seed)
  b = _BATCH.value
  sparse = {
    name: (zipf_ids(rng, b, _VOCAB.value, ZIPF).reshape(b, 1), np.ones((b, 1), np.float32))
    for name in specs
  }
  return core.TrainBatch(
    labels=rng.integers(0, 2, (b,)).astype(np.float32),
    dense=rng.normal(size=(b, 13)).astype(np.float32),
    sparse=sparse,
  )


def _baseline_trainer(job: JobModel, specs: Any, example: core.TrainBatch) -> tuple[Any, Any]:
  """The job's model and dense optimizer with the dense baseline as SC stages."""
  sharding = P.table_sharding(job.mesh)
  tables = {
    f.table_spec.name: jax.jit(
      lambda: jax.numpy.zeros((_VOCAB.value, DIM), jax.numpy.float32), out_shardings=sharding
    )()
    for f in specs.values()
  }
  params = job.init_params(jax.random.key(0))
  state = P.create_train_state(job.dense_optimizer, params, job.mesh, tables)
  fwd, bwd = _baseline_stages(specs)
  trainer = P.make_trainer(
    job.mesh, state, example, job.tc_stage, sc_fwd_function=fwd, sc_bwd_function=bwd
  )
  return trainer, state


def _runner(step: Callable, carry: Any, make_inputs: Callable, steps: int) -> Callable:
  """A function timing one round: seconds per step (inputs made beforehand)."""
  holder = {"carry": carry}

  def run_round():
    inputs = [make_inputs(i) for i in range(steps)]
    jax.block_until_ready(inputs)
    start = time.perf_counter()
    for x in inputs:
      holder["carry"] = step(x, holder["carry"])
    jax.block_until_ready(holder["carry"])
    return (time.perf_counter() - start) / steps

  run_round()  # compile and warm up
  run_round.holder = holder
  return run_round


def _copy(tree: Any) -> Any:
  return jax.tree.map(lambda x: x.copy(), tree)


def _stage_runners(
  trainer: Any, state: Any, place: Callable, steps: int, dense_stage: bool = True
) -> dict[str, Callable]:
  """lookup, update and (with `dense_stage`) dense of one setup, each jitted alone."""
  emb_sharding = trainer.train_state_sharding.embedding_variables
  fwd = jax.jit(lambda sparse, emb: trainer.sc_fwd_function(sparse, emb)[0])
  batches = [place(i) for i in range(_HOST_BATCHES)]
  acts = [fwd(b.sparse, state.embedding_variables) for b in batches]
  rng = np.random.default_rng(0)
  grads = jax.tree.map(
    lambda a: jax.device_put(1e-3 * rng.normal(size=a.shape).astype(np.float32), a.sharding),
    acts[0],
  )
  step0 = jax.device_put(np.int32(0), NamedSharding(trainer.mesh, PartitionSpec()))
  bwd = jax.jit(
    lambda sparse, emb: trainer.sc_bwd_function(sparse, grads, emb, step0)[0],
    donate_argnums=(1,),
    out_shardings=emb_sharding,
  )
  tc_state = _copy(state.replace(embedding_variables=None))
  tc_sharding = trainer.train_state_sharding.replace(embedding_variables=None)
  act_sharding = jax.tree.map(lambda a: a.sharding, acts[0])

  def tc_step(activations, dense_inputs, tc_state):
    act_grads, output, tc_state, _ = trainer.tc_function(activations, dense_inputs, tc_state, None)
    return tc_state, act_grads, output

  rep = NamedSharding(trainer.mesh, PartitionSpec())
  tc = jax.jit(tc_step, donate_argnums=(2,), out_shardings=(tc_sharding, act_sharding, rep))
  dense = [P.DenseInputs(b.labels, b.dense) for b in batches]
  n = _HOST_BATCHES
  runners = {
    "lookup": _runner(
      lambda x, c: (c[0], fwd(x, c[0])),
      (_copy(state.embedding_variables), None),
      lambda i: batches[i % n].sparse,
      steps,
    ),
    "update": _runner(
      bwd, _copy(state.embedding_variables), lambda i: batches[i % n].sparse, steps
    ),
  }
  if dense_stage:
    runners["dense"] = _runner(
      lambda x, c: tc(x[0], x[1], c[0]),
      (tc_state, None, None),
      lambda i: (acts[i % n], dense[i % n]),
      steps,
    )
  return runners


def _pipelined(trainer: Any, state: Any, place: Callable, steps: int) -> Callable:
  def step(batch, carry):
    train_state, pipeline_state = carry
    train_state, pipeline_state, _ = trainer.run_pipeline_step(
      train_state, pipeline_state, batch, False
    )
    return train_state, pipeline_state

  return _runner(step, (state, trainer.initial_pipeline_state()), place, steps)


def _host_input(job: JobModel, specs: Any, steps: int) -> tuple[Callable, Callable]:
  """Times `steps` batches of the in-process input; and a function closing it.

  The input's threads read ahead between rounds: the batches they hold are
  taken first, untimed, so the timed ones are made while the round waits
  (the input's rate, its two threads overlapping).
  """
  iterator = _in_process_iterator(job, specs)
  jax.block_until_ready(next(iterator))

  def run_round():
    for _ in range(_READ_AHEAD):
      next(iterator)
    start = time.perf_counter()
    for _ in range(steps):
      jax.block_until_ready(next(iterator))
    return (time.perf_counter() - start) / steps

  return run_round, iterator.close


def _end_to_end(
  job: JobModel, specs: Any, trainer: Any, state: Any, workers: int
) -> tuple[dict[str, float], Any]:
  """pipeline.train over the job's input with `workers` workers: examples/s, data wait."""
  config = dataclasses.replace(job.input_config, num_workers=workers)
  iterator = P.make_train_input(config, specs, job.mesh)
  waits = []
  try:
    for _ in range(2):  # workers started, their first batches made
      next(iterator)
    state, _, metrics = P.train(
      trainer, state, iterator, _E2E.value, hooks=[lambda r: waits.append(r.data_wait_seconds)]
    )
  finally:
    iterator.close()
  figures = {
    "examples_per_second": metrics.examples_per_second,
    "batch_ms": 1e3 * metrics.seconds / _E2E.value,
    "data_wait_ms_per_batch": 1e3 * sum(waits) / _E2E.value,
  }
  return figures, state


def setup(rounds_steps: int, root: str) -> tuple[dict[str, Callable], Callable, dict[str, Any]]:
  """The device variants to time in rounds (name -> round function), what runs after
  the rounds (host input alone, end to end), and the shape."""
  config = heavy_config(examples=_BATCH.value * (4 * _E2E.value + 64))
  mesh = core.make_mesh()
  data_dir = training_data.ensure_dataset(config, root, show_progress=False)
  job = JobModel(config, data.read_manifest(data_dir), mesh)
  specs = _tuned_specs(job, root)
  trainer, state = job.make_trainer(specs), job.fresh_train_state()
  source = _in_process_iterator(job, specs)
  try:
    host = [jax.device_get(next(source)) for _ in range(_HOST_BATCHES)]
  finally:
    source.close()
  batch_sharding = core.data_sharding(mesh)
  # The input's placed batches: one packed buffer each, split inside the job's step.
  place = lambda i: jax.device_put(host[i % len(host)], batch_sharding)
  arrays = lambda i: place(i).unpacked()
  variants = {
    f"heavy_{k}": v for k, v in _stage_runners(trainer, state, arrays, rounds_steps).items()
  }
  variants["heavy_pipelined"] = _pipelined(trainer, state, place, rounds_steps)
  base_host = [_baseline_host_batch(job.base_specs, s) for s in range(_HOST_BATCHES)]
  base_place = lambda i: jax.device_put(base_host[i % len(base_host)], batch_sharding)
  base_trainer, base_state = _baseline_trainer(job, job.base_specs, base_place(0))
  # The same TC stage as above: not timed again.
  base = _stage_runners(base_trainer, base_state, base_place, rounds_steps, dense_stage=False)
  variants.update({f"heavy_baseline_{k}": v for k, v in base.items()})
  variants["heavy_baseline_pipelined"] = _pipelined(
    base_trainer, base_state, base_place, rounds_steps
  )
  pipelined = variants["heavy_pipelined"]

  def after_rounds(rounds: int) -> dict[str, Any]:
    # Alone: the input's threads refill their buffers after a round, which
    # would slow the variant timed next.
    host_input, close = _host_input(job, specs, rounds_steps)
    try:
      host_times = [host_input() for _ in range(rounds)]
    finally:
      close()
    train_state, _ = pipelined.holder["carry"]
    out = {"host_input_s": host_times}
    for workers in sorted({0, _WORKERS.value}):
      out[f"end_to_end_{workers}_workers"], train_state = _end_to_end(
        job, specs, trainer, train_state, workers
      )
    return out

  limits = transforms.get_stack_limits(specs)
  shape = {
    "features": FEATURES,
    "vocab_size": _VOCAB.value,
    "dim": DIM,
    "global_batch": _BATCH.value,
    "bottom_mlp": list(config.model.bottom_mlp_dims),
    "top_mlp": list(config.model.top_mlp_dims),
    "limits": limits,
  }
  return variants, after_rounds, shape


def _median_ms(times: dict[str, list[float]], name: str) -> float:
  return float(np.median(times[f"heavy_{name}"])) * 1e3


def report(
  times: dict[str, list[float]], after: dict[str, Any], shape: dict[str, Any]
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
  """The figures of the sparse-heavy shape and the rows of its table."""
  end_to_end = {k[len("end_to_end_") :]: v for k, v in after.items() if k.startswith("end_to_end")}
  ms = {"host_input": float(np.median(after["host_input_s"])) * 1e3}
  ms.update({p: _median_ms(times, p) for p in ("lookup", "update", "dense")})
  total = sum(ms.values())
  step_ms = _median_ms(times, "pipelined")
  base = {p: _median_ms(times, f"baseline_{p}") for p in ("lookup", "update", "pipelined")}
  per_round = np.asarray(times["heavy_pipelined"]) / np.asarray(times["heavy_baseline_pipelined"])
  batch = shape["global_batch"]
  figures = {
    "shape": shape,
    "part_ms": ms,
    "part_share": {p: v / total for p, v in ms.items()},
    "pipelined_step_ms": step_ms,
    "pipelined_examples_per_second": batch / step_ms * 1e3,
    "baseline_ms": base,
    "baseline_examples_per_second": batch / base["pipelined"] * 1e3,
    "coo_over_baseline_step": float(np.median(per_round)),
    "end_to_end": end_to_end,
  }
  rows = [
    (
      f"sparse-heavy: {shape['features']} x {shape['vocab_size']:,} rows x dim {shape['dim']},"
      f" batch {batch}",
      "ms   share",
    ),
  ]
  for name, what in (
    ("host_input", "host input (in-process: read, COO, place)"),
    ("lookup", "lookup (SC fwd alone)"),
    ("update", "update (SC bwd alone, SGD)"),
    ("dense", "dense (TC alone: DLRM, ZeRO Adam)"),
  ):
    rows.append((f"  {what}", f"{ms[name]:.1f} {100 * ms[name] / total:4.0f}%"))
  rows += [
    ("  pipelined step (placed batches)", f"{step_ms:.1f} ms"),
    ("    examples/s", f"{figures['pipelined_examples_per_second']:,.0f}"),
    ("  dense baseline: lookup", f"{base['lookup']:.1f} ms"),
    ("  dense baseline: update (SGD scatter-add)", f"{base['update']:.1f} ms"),
    ("  dense baseline: pipelined step", f"{base['pipelined']:.1f} ms"),
    ("    examples/s", f"{figures['baseline_examples_per_second']:,.0f}"),
    ("  COO step / dense baseline step", f"{figures['coo_over_baseline_step']:.3f}"),
  ]
  for workers, e2e in end_to_end.items():
    rows += [
      (
        f"  end to end, {workers.replace('_', ' ')}: examples/s",
        f"{e2e['examples_per_second']:,.0f}",
      ),
      ("    ms per batch", f"{e2e['batch_ms']:.1f}"),
      ("    data wait per batch", f"{e2e['data_wait_ms_per_batch']:.1f} ms"),
    ]
  return figures, rows


def temporary_root() -> str:
  return tempfile.mkdtemp(prefix="sparsepipe_sparse_heavy_")


def remove_root(root: str) -> None:
  shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
  print(
    "sparse_heavy.py is a module of step.py: run python benchmarks/step.py --sections sparse_heavy",
    file=sys.stderr,
  )
  sys.exit(2)

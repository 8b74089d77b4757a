r"""Train-step speed: pipelining, the embedding kernels, ZeRO (8 CPU devices).

    python benchmarks/step.py [--json out.json] [--rounds 11] [--steps 10]
        [--sections dlrm,kernels,sparse_heavy]

On one DLRM-style model (4 tables, ZeRO Adam dense optimizer; section dlrm)
it measures
  (a) the pipelined train step vs the same three stages run sequentially on
      one batch in one jitted step, twice: "fused", where XLA shares work
      between the SC fwd and SC bwd of the same batch (the id exchange runs
      once), and "same work", where the SC bwd reads its own copy of the COO
      buffers, as in the pipelined step (different batches there);
  (b) embedding lookup + SGD update of one table with the COO kernels vs a
      dense gather / scatter-add baseline (ids [B, k], GSPMD), at each
      vocabulary size of --baseline_vocab_sizes;
  (c) ZeRO vs a replicated optax Adam: optimizer bytes per device and the
      pipelined step time;
and (b) is section kernels. Section modes times the trainer's two steps,
pipelined and sequential (`make_trainer(pipelining=...)`, the job's
config.pipelining), on a DLRM with the criteo config's MLPs; at the criteo
shape on one CPU device:

    XLA_FLAGS=--xla_force_host_platform_device_count=1 python benchmarks/step.py \
        --sections modes --batch_size 4096 --tables 26 --ids_per_sample 1

(a device count in XLA_FLAGS is kept; 8 CPU devices otherwise).
Section sparse_heavy (benchmarks/sparse_heavy.py)
takes a model whose embedding path dominates (26 features, dim 64, small
MLPs), built as the job builds it, and times per batch the host input,
lookup, update and dense stages alone, the pipelined step, the same model
with the dense gather / scatter-add baseline as its embedding path, and
`pipeline.train` end to end with data workers (examples/s, data wait).
Each variant runs --steps steps per round; rounds interleave the variants of
a section (one section after the other).
Times are medians over rounds; ratios are medians of per-round ratios of
variants run back to back (the machine may be shared: compare figures from
one run only). Only steady-state programs are compiled.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, NamedTuple

_FLAG = "--xla_force_host_platform_device_count=8"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import optax  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sparsepipe import core
from sparsepipe import pipeline as P  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe import transforms as T  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.pipeline.zero import optimizer as zero  # pylint: disable=g-import-not-at-top,wrong-import-position
import outputs  # pylint: disable=g-import-not-at-top,wrong-import-position

import sparse_heavy  # pylint: disable=g-import-not-at-top,wrong-import-position

_BATCH = flags.DEFINE_integer("batch_size", 1024, "Global batch size.")
_VOCAB = flags.DEFINE_integer("vocab_size", 50_000, "Vocabulary of the model's tables.")
_BASELINE_VOCABS = flags.DEFINE_list(
  "baseline_vocab_sizes",
  ["50000", "1000000"],
  "Vocabulary sizes for the kernel vs dense baseline comparison.",
)
_DIM = flags.DEFINE_integer("dim", 16, "Embedding dim of every table.")
_TABLES = flags.DEFINE_integer("tables", 4, "Number of tables (one feature each).")
_IDS = flags.DEFINE_integer("ids_per_sample", 4, "Ids per sample and feature.")
_SC = flags.DEFINE_integer("num_sc_per_device", 1, "SparseCores per device.")
_ROUNDS = flags.DEFINE_integer("rounds", 11, "Timing rounds (median taken).")
_STEPS = flags.DEFINE_integer("steps", 10, "Steps per round.")
_JSON = outputs.json_flag()
SECTIONS = ("dlrm", "kernels", "sparse_heavy", "modes")
_SECTIONS = flags.DEFINE_list(
  "sections",
  list(SECTIONS),
  "What to measure: dlrm (pipelining, ZeRO), kernels (COO vs dense baseline),"
  " sparse_heavy (where a sparse-heavy batch's time goes), modes (the trainer's pipelined"
  " and sequential steps).",
)

_ND = 13
_CRITEO_MLPS = ((512, 256), (1024, 1024, 512, 256))  # the criteo config's, bottom's last dim apart
_SEEDS = (0, 1, 2, 3)


def _host_ids(num_tables, vocab, seed):
  r = np.random.default_rng(seed)
  return {
    f"f{i}": r.integers(0, vocab, (_BATCH.value, _IDS.value)).astype(np.int32)
    for i in range(num_tables)
  }


def _feature_specs(optimizer, num_tables, vocab, limits=None):
  """One feature per table; limits {table: (max ids, max unique)} or generous."""
  generous = _BATCH.value * _IDS.value
  features = {}
  for i in range(num_tables):
    max_ids, max_unique = (limits or {}).get(f"t{i}", (generous, generous))
    table = core.TableSpec(
      name=f"t{i}",
      vocabulary_size=vocab,
      embedding_dim=_DIM.value,
      combiner="mean",
      optimizer=optimizer,
      max_ids_per_partition=max_ids,
      max_unique_ids_per_partition=max_unique,
    )
    features[f"f{i}"] = core.FeatureSpec(
      f"f{i}", table, (_BATCH.value, _IDS.value), (_BATCH.value, _DIM.value)
    )
  return features


def _prepared_specs(optimizer, num_tables, vocab, g):
  """Specs whose limits are the maxima observed on the batches (FDO-like)."""
  specs = T.prepare_feature_specs_for_training(
    _feature_specs(optimizer, num_tables, vocab), g, _SC.value
  )
  limits = {}
  for s in _SEEDS:
    _, stats = T.preprocess_sparse_dense_matmul_input(
      _host_ids(num_tables, vocab, s),
      None,
      specs,
      g,
      g,
      num_sc_per_device=_SC.value,
    )
    for name, m in stats.max_ids_per_partition.items():
      u = stats.max_unique_ids_per_partition[name]
      old = limits.get(name, (0, 0))
      limits[name] = (max(old[0], int(m.max())), max(old[1], int(u.max())))
  specs = T.prepare_feature_specs_for_training(
    _feature_specs(optimizer, num_tables, vocab, limits), g, _SC.value
  )
  return specs, limits


def _sparse(specs, num_tables, vocab, g, seed):
  pre, _ = T.preprocess_sparse_dense_matmul_input(
    _host_ids(num_tables, vocab, seed),
    None,
    specs,
    g,
    g,
    num_sc_per_device=_SC.value,
  )
  return pre.sparse_dense_matmul_input


def _host_batch(specs, g, seed):
  r = np.random.default_rng(seed + 1000)
  return core.TrainBatch(
    labels=r.integers(0, 2, (_BATCH.value,)).astype(np.float32),
    dense=r.normal(size=(_BATCH.value, _ND)).astype(np.float32),
    sparse=_sparse(specs, _TABLES.value, _VOCAB.value, g, seed),
  )


def _round_runner(step, carry, make_inputs):
  """A function timing one round: seconds per step (inputs made beforehand)."""
  holder = {"carry": carry}

  def run_round():
    inputs = [make_inputs(i) for i in range(_STEPS.value)]
    jax.block_until_ready(inputs)
    start = time.perf_counter()
    for x in inputs:
      holder["carry"] = step(x, holder["carry"])
    jax.block_until_ready(holder["carry"])
    return (time.perf_counter() - start) / _STEPS.value

  run_round()  # compile and warm up
  return run_round, holder


def _trainer(mesh, specs, dense_optimizer, example, pipelining=True, mlps=((128, 64), (256, 128))):
  model = P.DLRM(bottom_mlp_dims=(*mlps[0], _DIM.value), top_mlp_dims=mlps[1])
  params = model.init(jax.random.key(0), _ND, P.feature_dims_of(specs))
  emb = P.init_embedding_variables(jax.random.key(1), specs, mesh, num_sc_per_device=_SC.value)
  state = P.create_train_state(dense_optimizer, params, mesh, emb)
  tc = P.make_tc_stage(model, dense_optimizer, mesh, specs)
  trainer = P.make_trainer(
    mesh,
    state,
    example,
    tc,
    feature_specs=specs,
    num_sc_per_device=_SC.value,
    pipelining=pipelining,
  )
  return trainer, state


def _sequential_step(trainer, same_work):
  """SC fwd -> TC -> SC bwd of one batch in one program (not pipelined).

  With same_work, the SC bwd reads a second copy of the COO buffers (another
  argument), so XLA cannot share the id exchange between the two SC stages,
  as it cannot in the pipelined step where they see different batches.
  """

  def step(inputs, train_state):
    pipeline_input, bwd_sparse = inputs
    emb = train_state.embedding_variables
    tc_state = train_state.replace(embedding_variables=None)
    act, aux = trainer.sc_fwd_function(pipeline_input.sparse_inputs, emb)
    grads, out, tc_state, tc_aux = trainer.tc_function(
      act, pipeline_input.dense_inputs, tc_state, aux
    )
    sparse = bwd_sparse if same_work else pipeline_input.sparse_inputs
    emb, _ = trainer.sc_bwd_function(sparse, grads, emb, tc_aux)
    return tc_state.replace(embedding_variables=emb), out

  # The train state comes first so that jax pairs each of its outputs with
  # its own donated buffer (it pairs outputs with the first donated input of
  # the same per-device shape), as the pipelined step does; the other way
  # round some dense params took the labels' buffers and XLA added copies.
  rep = jax.sharding.NamedSharding(trainer.mesh, jax.sharding.PartitionSpec())
  jitted = jax.jit(
    lambda train_state, inputs: step(inputs, train_state),
    donate_argnums=(0,),  # the inputs have no output to go to
    in_shardings=(
      trainer.train_state_sharding,
      (trainer.input_sharding, trainer.input_sharding.sparse_inputs),
    ),
    out_shardings=(trainer.train_state_sharding, {"loss": rep, "finite": rep}),
  )
  return lambda inputs, state: jitted(state, inputs)[0]


def _pipelined(trainer, state, device_batch):
  def step(batch, carry):
    train_state, pipeline_state = carry
    train_state, pipeline_state, _ = trainer.run_pipeline_step(
      train_state, pipeline_state, batch, False
    )
    return train_state, pipeline_state

  return _round_runner(step, (state, trainer.initial_pipeline_state()), device_batch)


def _modes_variants(mesh):
  """The trainer's pipelined and sequential steps (config.pipelining) on one model."""
  specs, _ = _prepared_specs(core.AdamOptimizerSpec(0.001), _TABLES.value, _VOCAB.value, mesh.size)
  host = [_host_batch(specs, mesh.size, s) for s in _SEEDS]
  data = core.data_sharding(mesh)
  device_batch = lambda i: jax.device_put(host[i % len(host)], data)
  variants = {}
  for name, pipelining in (("mode_pipelined", True), ("mode_sequential", False)):
    trainer, state = _trainer(
      mesh, specs, optax.adam(1e-3), host[0], pipelining=pipelining, mlps=_CRITEO_MLPS
    )
    variants[name], _ = _pipelined(trainer, state, device_batch)
  return variants


def _modes_figures(times):
  ms = {k: float(np.median(times[k])) * 1e3 for k in ("mode_pipelined", "mode_sequential")}
  ratio = _median_ratio(times, "mode_pipelined", "mode_sequential")
  rows = [
    ("trainer step, pipelined", f"{ms['mode_pipelined']:.2f} ms"),
    ("trainer step, sequential", f"{ms['mode_sequential']:.2f} ms"),
    ("  pipelined / sequential", f"{ratio:.3f}"),
  ]
  return {"mode_pipelined_over_sequential": ratio}, rows


def _kernel_vs_baseline(mesh, vocab):
  """Lookup + SGD update of one table: COO kernels vs dense gather/scatter."""
  g = mesh.size
  specs, _ = _prepared_specs(core.SGDOptimizerSpec(0.01), 1, vocab, g)
  emb = P.init_embedding_variables(jax.random.key(2), specs, mesh, num_sc_per_device=_SC.value)
  data = core.data_sharding(mesh)

  def kernel_step(sparse, emb):
    act = P.sparse_dense_matmul(sparse, emb, specs, mesh, num_sc_per_device=_SC.value)
    return P.sparse_dense_matmul_grad(
      act, sparse, emb, specs, mesh, num_sc_per_device=_SC.value, step=0
    )

  table_sharding = P.table_sharding(mesh)

  def baseline_step(inputs, table):
    ids, weights = inputs
    act = P.dense_lookup_baseline(table, ids, weights, "mean")
    return P.dense_sgd_update_baseline(table, ids, weights, "mean", act, 0.01)

  sparse = [_sparse(specs, 1, vocab, g, s) for s in _SEEDS]
  dense = []
  for s in _SEEDS:
    ids = _host_ids(1, vocab, s)["f0"]
    dense.append((ids, np.ones(ids.shape, np.float32)))
  table = jax.jit(
    lambda: jnp.zeros((vocab, _DIM.value), jnp.float32),
    out_shardings=table_sharding,
  )()
  kernel, _ = _round_runner(
    jax.jit(kernel_step, donate_argnums=(1,)),
    emb,
    lambda i: jax.device_put(sparse[i % len(sparse)], data),
  )
  baseline, _ = _round_runner(
    jax.jit(baseline_step, donate_argnums=(1,), out_shardings=table_sharding),
    table,
    lambda i: jax.device_put(dense[i % len(dense)], data),
  )
  return {f"coo_kernels_v{vocab}": kernel, f"dense_baseline_v{vocab}": baseline}


def _median_ratio(times, a, b):
  return float(np.median(np.asarray(times[a]) / np.asarray(times[b])))


def _dlrm_variants(mesh, host, device_batch):
  """The pipelining and ZeRO variants of the DLRM model; and their holders."""
  zero_opt = P.zero_sharded(optax.adam(1e-3), mesh)
  trainer, state = _trainer(mesh, host[0].specs, zero_opt, host[0].batch)
  copies = [jax.tree.map(jnp.copy, state) for _ in range(2)]
  variants = {}
  variants["pipelined_zero"], zero_holder = _pipelined(trainer, state, device_batch)
  for name, same_work, s in (
    ("sequential_fused", False, copies[0]),
    ("sequential_same_work", True, copies[1]),
  ):
    variants[name], _ = _round_runner(
      _sequential_step(trainer, same_work),
      s,
      lambda i: (trainer.input_fn(device_batch(i)), device_batch(i).sparse),
    )
  rep_trainer, rep_state = _trainer(mesh, host[0].specs, optax.adam(1e-3), host[0].batch)
  variants["pipelined_replicated"], rep_holder = _pipelined(rep_trainer, rep_state, device_batch)
  return variants, (zero_holder, rep_holder)


def _dlrm_figures(times, holders, g):
  """Figures and table rows of the pipelining and ZeRO comparisons."""
  zero_holder, rep_holder = holders
  zero_bytes = max(zero.bytes_per_device(zero_holder["carry"][0].opt_state).values())
  rep_bytes = max(zero.bytes_per_device(rep_holder["carry"][0].opt_state).values())
  params = jax.tree.leaves(zero_holder["carry"][0].params)
  padded = sum(zero.padded_size(int(p.size), g) for p in params)
  ms = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
  figures = {
    "dense_params": sum(int(p.size) for p in params),
    "pipelined_over_sequential_same_work": _median_ratio(
      times, "pipelined_zero", "sequential_same_work"
    ),
    "pipelined_over_sequential_fused": _median_ratio(times, "pipelined_zero", "sequential_fused"),
    "zero_over_replicated_step": _median_ratio(times, "pipelined_zero", "pipelined_replicated"),
    "optimizer_bytes_per_device_zero": zero_bytes,
    "optimizer_bytes_per_device_replicated": rep_bytes,
    "optimizer_bytes_expected_zero": 2 * padded * 4 // g + 4,
    "optimizer_bytes_ratio": zero_bytes / rep_bytes,
  }
  rows = [
    ("pipelined step (ZeRO Adam)", f"{ms['pipelined_zero']:.2f} ms"),
    ("sequential step, same work", f"{ms['sequential_same_work']:.2f} ms"),
    ("sequential step, fused (XLA CSE)", f"{ms['sequential_fused']:.2f} ms"),
    ("  pipelined / sequential same work", f"{figures['pipelined_over_sequential_same_work']:.3f}"),
    ("  pipelined / sequential fused", f"{figures['pipelined_over_sequential_fused']:.3f}"),
    ("pipelined step (replicated Adam)", f"{ms['pipelined_replicated']:.2f} ms"),
    ("  ZeRO / replicated step", f"{figures['zero_over_replicated_step']:.3f}"),
    ("optimizer bytes/device, ZeRO", str(zero_bytes)),
    ("optimizer bytes/device, replicated", str(rep_bytes)),
    ("  expected ZeRO (padded/D + count)", str(figures["optimizer_bytes_expected_zero"])),
    ("  ZeRO / replicated bytes", f"{figures['optimizer_bytes_ratio']:.4f}"),
  ]
  return figures, rows


def _kernel_figures(times, vocabs):
  ms = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
  ratios = {v: _median_ratio(times, f"coo_kernels_v{v}", f"dense_baseline_v{v}") for v in vocabs}
  rows = []
  for v in vocabs:
    rows += [
      (f"lookup+update vocab {v}, COO kernels", f"{ms[f'coo_kernels_v{v}']:.2f} ms"),
      (f"lookup+update vocab {v}, dense baseline", f"{ms[f'dense_baseline_v{v}']:.2f} ms"),
      ("  COO / dense baseline", f"{ratios[v]:.3f}"),
    ]
  return {"coo_over_dense_baseline": ratios}, rows


class _Host(NamedTuple):
  specs: Any
  batch: core.TrainBatch


def _setup(sections, heavy_root):
  """({section: variants}, what the figures need) of the chosen sections; compiles every
  program."""
  mesh = core.make_mesh()
  g = mesh.size
  variants, context = {}, {"g": g}
  if "dlrm" in sections:
    specs, limits = _prepared_specs(core.AdamOptimizerSpec(0.001), _TABLES.value, _VOCAB.value, g)
    host = [_Host(specs, _host_batch(specs, g, s)) for s in _SEEDS]
    data = core.data_sharding(mesh)
    device_batch = lambda i: jax.device_put(host[i % len(host)].batch, data)
    variants["dlrm"], context["holders"] = _dlrm_variants(mesh, host, device_batch)
    context["limits"] = limits
  if "kernels" in sections:
    context["vocabs"] = [int(v) for v in _BASELINE_VOCABS.value]
    variants["kernels"] = {}
    for vocab in context["vocabs"]:
      variants["kernels"].update(_kernel_vs_baseline(mesh, vocab))
  if "modes" in sections:
    variants["modes"] = _modes_variants(mesh)
  if "sparse_heavy" in sections:
    variants["sparse_heavy"], context["heavy_after_rounds"], context["heavy_shape"] = (
      sparse_heavy.setup(_STEPS.value, heavy_root)
    )
  return variants, context


def _figures(sections, times, context):
  """All figures (JSON) and the table rows."""
  figures = {
    "devices": context["g"],
    "rounds": _ROUNDS.value,
    "steps_per_round": _STEPS.value,
    "step_ms_median": {k: float(np.median(v)) * 1e3 for k, v in times.items()},
    "step_ms_min": {k: float(np.min(v)) * 1e3 for k, v in times.items()},
  }
  rows = []
  if "dlrm" in sections:
    figures.update(
      global_batch=_BATCH.value,
      tables=_TABLES.value,
      vocab_size=_VOCAB.value,
      dim=_DIM.value,
      ids_per_sample=_IDS.value,
      max_ids_per_partition={k: v[0] for k, v in context["limits"].items()},
    )
    more, rows = _dlrm_figures(times, context["holders"], context["g"])
    figures.update(more)
  if "kernels" in sections:
    more, kernel_rows = _kernel_figures(times, context["vocabs"])
    figures.update(more)
    rows += kernel_rows
  if "modes" in sections:
    more, mode_rows = _modes_figures(times)
    figures.update(more, modes_shape=dict(batch=_BATCH.value, tables=_TABLES.value, ids=_IDS.value))
    rows += mode_rows
  if "sparse_heavy" in sections:
    figures["sparse_heavy"], heavy_rows = sparse_heavy.report(
      times, context["heavy_after_rounds"](_ROUNDS.value), context["heavy_shape"]
    )
    rows += heavy_rows
  return figures, rows


def main(argv):
  del argv
  sections = set(_SECTIONS.value)
  unknown = sections - set(SECTIONS)
  if unknown:
    raise app.UsageError(f"--sections: {sorted(unknown)} not in {list(SECTIONS)}")
  t_start = time.perf_counter()
  heavy_root = sparse_heavy.temporary_root()
  try:
    variants, context = _setup(sections, heavy_root)
    t_compiled = time.perf_counter()
    times = {}
    for section in variants.values():  # sections apart: they do not perturb each other
      times.update({name: [] for name in section})
      for _ in range(_ROUNDS.value):
        for name, run in section.items():
          times[name].append(run())
    figures, rows = _figures(sections, times, context)
  finally:
    sparse_heavy.remove_root(heavy_root)
  figures["setup_and_compile_s"] = t_compiled - t_start
  figures["total_s"] = time.perf_counter() - t_start
  if "dlrm" in sections:
    print(
      f"{context['g']} devices, batch {_BATCH.value}, {_TABLES.value} tables x"
      f" {_VOCAB.value} x {_DIM.value}, {figures['dense_params']} dense params"
    )
  elif "modes" in sections:
    print(
      f"{context['g']} devices, batch {_BATCH.value}, {_TABLES.value} tables x"
      f" {_VOCAB.value} x {_DIM.value}, {_IDS.value} ids per sample, the criteo config's MLPs"
    )
  else:
    print(f"{context['g']} devices")
  print(f"median of {_ROUNDS.value} rounds x {_STEPS.value} steps")
  width = max(len(r[0]) for r in rows)
  for name, value in rows:
    print(f"{name:<{width}}  {value:>12}")
  print(f"(setup+compile {figures['setup_and_compile_s']:.1f} s, total {figures['total_s']:.1f} s)")
  if _JSON.value:
    outputs.write(_JSON.value, figures, indent=2, sort_keys=True)


if __name__ == "__main__":
  app.run(main)

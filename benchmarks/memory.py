"""Host memory of the criteo job: peak resident set against the training state.

    python benchmarks/memory.py [--json out.json] [--batches 40] [--examples 196608]
        [--sections phases,growth]

Trains the shipped criteo config (sparsepipe/launch/config/shipped/criteo.py:
26 tables, 5.8M rows x dim 16, Adagrad slots, batch 4096, 2 data workers,
asynchronous saves with fingerprints) through `train_and_evaluate` on 8 CPU
devices. Changed from the shipped config, so that it runs in a few minutes:
`synthetic.num_examples` (--examples, shipped 1M), `num_steps` (--batches,
shipped 10,000) and `checkpoint.every_steps` (--save_every, shipped 1000:
here a save mid-run and one at the end). Tables, dims, batch, limits,
workers, optimizers and models are as shipped.

Every measurement runs in a fresh process (ru_maxrss is per process):
- job: the whole job, with VmRSS (and its anonymous / shared-memory parts,
  and the data workers' RSS) sampled every 10 ms and labelled by phase:
  dataset, setup (trainer, input), init (tables, slots, params), the first
  two pipeline steps (both programs compile), training, a save (the loop
  blocked while Orbax copies the arrays to the host), training while the
  save writes in the background, the end. The state bytes are read from
  the arrays (every addressable shard: what this process holds).
- job, heap kept: the same without the job's release of the compiler's
  freed heap (launch/job/hooks.HeapHook, malloc_trim once a segment has
  compiled), as 0.3.0 ran it: the before/after of that release.
- job, synchronous saves: the same with checkpoint.async_save=false. On
  CPU devices the arrays are host memory, so an asynchronous save's host
  copy is a second copy of the state until it is written; a synchronous
  save writes from the arrays while the loop waits.
- job, one-program init: the same, with the tables made as before 0.3.0
  (every table of a stack made and concatenated in one jitted program),
  for the before/after figures.
- step: the step's per-device memory from XLA
  (`Trainer.lower_step(...).compile().memory_analysis()`: arguments,
  outputs, outputs in donated buffers, temporaries), whether the old
  tables and slots are deleted by a step (donated), the heap glibc keeps
  after compiling and after a few steps, and one host copy of the state
  (what an async save holds while it writes).
- init alone, per table group (now) and in one program (before): peak
  growth, what stays, and the time.

Section growth (issue 28: memory = state, + one copy while an asynchronous
save is in flight, + an overhead that stays flat when the tables grow):
the same job at the shipped vocabularies and with every vocabulary
--growth_scale (4) times larger, each with synchronous and with
asynchronous saves, and the synchronous one resumed from its last
checkpoint for --save_every batches more ("resumed": restore, compile,
train, save; six fresh processes). For each: the state bytes, the
peak RSS, the overhead (peak - state; for async saves peak - 2 x state, the
save's host copy being a second state on CPU devices), peak / state (goals
<= 1.6 sync and resumed, <= 2.6 async), and overhead(scaled) / overhead(shipped)
(goal <= 1.2). A few minutes with e.g. --sections growth --batches 12
--examples 49152 --save_every 6. One run's growth moves by about 0.15 on a
shared machine: --repeats N runs the six jobs N times and shows each
figure's median, with every run's growth beside it.

The machine may be shared: compare figures from one run only.
"""

from __future__ import annotations

import os
import sys

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import json  # pylint: disable=g-import-not-at-top,wrong-import-position
import resource  # pylint: disable=g-import-not-at-top,wrong-import-position
import shutil  # pylint: disable=g-import-not-at-top,wrong-import-position
import subprocess  # pylint: disable=g-import-not-at-top,wrong-import-position
import tempfile  # pylint: disable=g-import-not-at-top,wrong-import-position
import threading  # pylint: disable=g-import-not-at-top,wrong-import-position
import time  # pylint: disable=g-import-not-at-top,wrong-import-position
from typing import Any  # pylint: disable=g-import-not-at-top,wrong-import-position

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top,wrong-import-position

from sparsepipe import checkpointing  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe import core  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe import data  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe import pipeline  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.launch.config.shipped import criteo  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.launch.job import checkpoints  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.launch.job import training_data  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.launch.job import model  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.launch.job.run import train_and_evaluate  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.pipeline.embedding.variables import table_key  # pylint: disable=g-import-not-at-top,wrong-import-position
import outputs  # pylint: disable=g-import-not-at-top,wrong-import-position

_JSON = outputs.json_flag()
_BATCHES = flags.DEFINE_integer("batches", 40, "Batches trained (config.num_steps).")
_EXAMPLES = flags.DEFINE_integer("examples", 48 * 4096, "Synthetic examples generated.")
_SAVE_EVERY = flags.DEFINE_integer("save_every", 20, "config.checkpoint.every_steps.")
_CHILD = flags.DEFINE_string("child", None, "Internal: the measurement this process runs.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Internal: the job's workdir.")
_OUT = flags.DEFINE_string("out", None, "Internal: where the child writes its figures.")
_SECTIONS = flags.DEFINE_list("sections", ["phases", "growth"], "phases, growth (see above).")
_GROWTH_SCALE = flags.DEFINE_integer("growth_scale", 4, "Vocabulary factor of the growth rows.")
_VOCAB_SCALE = flags.DEFINE_integer("vocab_scale", 1, "Internal: every vocabulary times this.")
_REPEATS = flags.DEFINE_integer(
  "repeats",
  1,
  "Growth section: runs of all six jobs; the table shows each figure's median.",
  lower_bound=1,
)

MB = 2**20
_COMPILE_STEPS = 2  # the fill step and the first steady step compile the two programs
_BETWEEN = "other (job start, between the phases)"
_JOBS = ("job", "job_heap_kept", "job_sync_saves", "job_one_program_init")
_JOB_TITLES = ("job", "heap kept", "sync saves", "one-program init")
_RESUMED = "job_resumed"  # the sync-saves job resumed for --save_every batches more (growth)


def _status() -> dict[str, int]:
  """VmRSS, RssAnon, RssShmem of this process in bytes."""
  out = {}
  with open("/proc/self/status") as f:
    for line in f:
      key = line.split(":", 1)[0]
      if key in ("VmRSS", "RssAnon", "RssShmem"):
        out[key] = int(line.split()[1]) * 1024
  return out


def _children_rss() -> list[int]:
  """VmRSS of each of this process's children (the data workers), bytes.

  Sampled from /proc: a child's ru_maxrss (RUSAGE_CHILDREN) starts from its
  parent's resident set at the fork, so it reports the main process's size.
  """
  me, sizes = str(os.getpid()), []
  for pid in os.listdir("/proc"):
    if not pid.isdigit():
      continue
    try:
      with open(f"/proc/{pid}/stat") as f:
        if f.read().rsplit(")", 1)[1].split()[1] != me:
          continue
      with open(f"/proc/{pid}/statm") as f:
        sizes.append(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, IndexError):
      continue
  return sizes


def _max_rss() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Sampler:
  """Samples the process's memory every 10 ms, labelled with the current phase."""

  def __init__(self):
    self.phase = "imports"
    self.order = ["imports"]
    self.peak: dict[str, dict[str, int]] = {}
    self.last: dict[str, dict[str, int]] = {}
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  def enter(self, phase: str) -> None:
    self.sample(self.phase)
    if phase not in self.order:
      self.order.append(phase)
    self.phase = phase

  def sample(self, phase: str, workers: bool = False) -> None:
    now = _status()
    if workers:
      sizes = _children_rss()
      now["workers"], now["worker_max"] = sum(sizes), max(sizes, default=0)
    peak = self.peak.setdefault(phase, {})
    for k, v in now.items():
      peak[k] = max(peak.get(k, 0), v)
    self.last.setdefault(phase, {}).update(now)

  def _run(self) -> None:
    n = 0
    while not self._stop.wait(0.01):
      n += 1
      self.sample(self.phase, workers=n % 10 == 0)

  def stop(self) -> None:
    self._stop.set()
    self._thread.join()
    self.sample(self.phase, workers=True)


def _shard_bytes(tree: Any) -> int:
  """Bytes of every addressable shard of the arrays in `tree` (what this process holds)."""

  total = 0
  for leaf in jax.tree.leaves(tree):
    shards = getattr(leaf, "addressable_shards", None)
    total += sum(s.data.nbytes for s in shards) if shards else int(getattr(leaf, "nbytes", 0))
  return total


def _state_bytes(train_state: Any) -> dict[str, int]:
  """Resident bytes of the train state's parts (per-device copies counted)."""
  emb = train_state.embedding_variables
  return {
    "tables": _shard_bytes([v.table for v in emb.values()]),
    "slots": _shard_bytes([v.slots for v in emb.values()]),
    "updated": _shard_bytes([v.updated for v in emb.values()]),
    "params": _shard_bytes(train_state.params),
    "opt_state": _shard_bytes(train_state.opt_state),
    "step": _shard_bytes(train_state.step),
  }


def _config(async_save: bool = True) -> Any:

  config = criteo.get_config()
  config.checkpoint.async_save = async_save
  config.synthetic.num_examples = _EXAMPLES.value
  config.num_steps = _BATCHES.value
  config.checkpoint.every_steps = _SAVE_EVERY.value
  config.log_every_steps = 10
  for feature in config.features.values():
    feature.vocab_size *= _VOCAB_SCALE.value
  return config


def _wrap(owner: Any, name: str, around: Any) -> None:
  """Replaces owner.name by `around(original, *args, **kwargs)` (measurement hooks)."""
  original = getattr(owner, name)

  def wrapped(*args, **kwargs):
    return around(original, *args, **kwargs)

  setattr(owner, name, wrapped)


def _phase(sampler: Sampler, phase: str, after: str | None = None):
  """Labels a call `phase`; then `after`, or the phase it interrupted (a setup
  made inside a restore goes back to the restore)."""

  def around(original, *args, **kwargs):
    before = sampler.phase
    sampler.enter(phase)
    try:
      return original(*args, **kwargs)
    finally:
      sampler.enter(after or before)

  return around


def _instrument(sampler: Sampler, figures: dict[str, Any]) -> None:
  """Phase labels around the job's parts; the state bytes from its arrays."""

  _wrap(training_data, "ensure_dataset", _phase(sampler, "dataset", _BETWEEN))
  _wrap(model.JobModel, "setup", _phase(sampler, "setup (trainer, input)"))

  def init(original, *args, **kwargs):
    sampler.enter("init (tables, slots, params)")
    state = original(*args, **kwargs)
    jax.block_until_ready(state)
    figures["state"] = _state_bytes(state)
    sampler.enter(_BETWEEN)
    return state

  _wrap(model.JobModel, "fresh_train_state", init)

  def restore(original, self, *args, **kwargs):
    if self.mngr.latest_step() is None:  # a fresh job: nothing to restore, no phase of its own
      return original(self, *args, **kwargs)
    sampler.enter("restore (a resumed job)")
    restored = original(self, *args, **kwargs)
    if restored is not None:
      jax.block_until_ready(restored.train_state)
      figures["state"] = _state_bytes(restored.train_state)
    sampler.enter(_BETWEEN)
    return restored

  _wrap(checkpoints.JobCheckpoints, "restore", restore)
  steps = [0]

  def step(original, self, train_state, pipeline_state, *args, **kwargs):
    if steps[0] == 0:
      figures["state"]["pipeline_state"] = _shard_bytes(pipeline_state)
      figures["batch_bytes"] = _shard_bytes(args[0]) if args and args[0] is not None else 0
      sampler.enter("first 2 steps (compile)")
    out = original(self, train_state, pipeline_state, *args, **kwargs)
    steps[0] += 1
    if steps[0] == _COMPILE_STEPS:
      jax.block_until_ready(out)
      sampler.enter("training")
    elif sampler.phase.startswith("save (") and not saving():
      sampler.enter("training")
    return out

  _wrap(pipeline.Trainer, "run_pipeline_step", step)
  orbax_managers = []

  def orbax_save(original, self, *args, **kwargs):
    orbax_managers.append(self)
    return original(self, *args, **kwargs)

  def saving() -> bool:
    return any(m.is_saving_in_progress() for m in orbax_managers)

  _wrap(ocp.CheckpointManager, "save", orbax_save)
  _wrap(
    checkpointing.TrainingCheckpointManager,
    "save",
    _phase(sampler, "save (loop blocked: host copies)", "save (writing in the background)"),
  )


def _child_job(workdir: str, out: str, variant: str) -> None:
  """Trains the job (one of _JOBS), writes its memory figures to `out` (JSON)."""
  sampler = Sampler()

  figures: dict[str, Any] = {"imports_rss": _status()["VmRSS"]}
  _instrument(sampler, figures)
  if variant == "job_one_program_init":
    pipeline.init_embedding_variables = _one_program_init
  if variant == "job_heap_kept":
    core.release_freed_heap = lambda: False
  start = time.perf_counter()
  config = _config(async_save=variant not in ("job_sync_saves", _RESUMED))
  if variant == _RESUMED:  # the job in `workdir` trained to --batches: a few batches more
    config.num_steps += _SAVE_EVERY.value
  train_and_evaluate(config, workdir, config_name="criteo")
  sampler.enter("end (saves written, workers stopped)")
  sampler.stop()
  figures.update(
    seconds=time.perf_counter() - start,
    phases=sampler.order,
    peak=sampler.peak,
    last=sampler.last,
    max_rss=_max_rss(),
  )
  with open(out, "w") as f:
    json.dump(figures, f)


def _job_model(data_dir: str) -> Any:

  return model.JobModel(_config(), data.read_manifest(data_dir), core.make_mesh())


def _one_program_init(
  key: Any, feature_specs: Any, mesh: Any, *, num_sc_per_device: int, track_updates: bool
) -> Any:
  """`init_embedding_variables` as it was: a stack's tables made and concatenated in one
  program (with `updated`, as the job makes them)."""

  del track_updates
  sharding = pipeline.table_sharding(mesh)
  layouts = pipeline.stack_layouts(feature_specs, mesh.size * num_sc_per_device)

  def init(key):
    state = {}
    for name, layout in layouts.items():
      logical = {
        t.name: t.initializer(
          table_key(key, t.name), (t.vocabulary_size, t.embedding_dim), jnp.float32
        )
        for t in layout.tables
      }
      table = pipeline.logical_to_physical(layout, logical, row_sharding=sharding)
      shape, slot_key = (layout.vocab_size, layout.dim), jax.random.fold_in(table_key(key, name), 1)
      slots = tuple(
        jnp.asarray(f(jax.random.fold_in(slot_key, i), shape, jnp.float32))
        for i, f in enumerate(layout.spec.optimizer.slot_initializers())
      )
      updated = jnp.zeros((layout.vocab_size,), jnp.int32)
      state[name] = pipeline.EmbeddingVariables(table, slots, updated)
    return state

  return jax.jit(
    init,
    out_shardings=pipeline.embedding_variables_sharding(feature_specs, mesh, track_updates=True),
  )(key)


def _child_init(data_dir: str, out: str, one_program: bool) -> None:
  """The tables, slots and `updated` of a fresh job alone: peak and what stays."""

  job = _job_model(data_dir)
  before, start = _status()["VmRSS"], time.perf_counter()
  init = _one_program_init if one_program else pipeline.init_embedding_variables
  emb = init(
    jax.random.key(0), job.base_specs, job.mesh, num_sc_per_device=job.num_sc, track_updates=True
  )
  jax.block_until_ready(emb)
  seconds, after = time.perf_counter() - start, _status()["VmRSS"]
  core.release_freed_heap()
  figures = dict(
    before=before,
    after=after,
    after_trim=_status()["VmRSS"],
    max_rss=_max_rss(),
    bytes=_shard_bytes(emb),
    seconds=seconds,
  )
  with open(out, "w") as f:
    json.dump(figures, f)


def _memory_analysis(compiled: Any) -> dict[str, int]:
  m = compiled.memory_analysis()
  return {
    "arguments": m.argument_size_in_bytes,
    "outputs": m.output_size_in_bytes,
    "outputs_in_donated_buffers": m.alias_size_in_bytes,
    "temporaries": m.temp_size_in_bytes,
  }


def _host_copy(tree: Any) -> tuple[int, int]:
  """(bytes copied, RSS growth): one host copy of every shard of replica 0, as Orbax makes."""

  before = _status()["VmRSS"]
  copies = [
    np.array(s.data)
    for leaf in jax.tree.leaves(tree)
    for s in leaf.addressable_shards
    if s.replica_id == 0
  ]
  grown = _status()["VmRSS"] - before
  return sum(c.nbytes for c in copies), grown


def _child_step(data_dir: str, out: str) -> None:
  """The step's per-device memory (XLA), donation, compile heap, one host copy."""

  job = _job_model(data_dir)
  state = job.fresh_train_state()
  trainer = job.make_trainer(job.base_specs)
  jax.block_until_ready(state)
  figures: dict[str, Any] = {"before_compile": _status()["VmRSS"]}
  compiled = {fake: trainer.lower_step(state, fake).compile() for fake in (False, True)}
  figures["steady_step"] = _memory_analysis(compiled[False])
  figures["fill_drain_step"] = _memory_analysis(compiled[True])
  figures["after_compile"] = _status()["VmRSS"]
  del compiled
  core.release_freed_heap()
  figures["after_compile_trim"] = _status()["VmRSS"]
  olds = [leaf for v in state.embedding_variables.values() for leaf in (v.table, *v.slots)]
  pipeline_state = trainer.initial_pipeline_state()
  for i in range(4):
    state, pipeline_state, output = trainer.run_pipeline_step(
      state, pipeline_state, None, trainer.fake_tc_step(i, 2)
    )
    jax.block_until_ready(output)
  figures["tables_and_slots_donated"] = all(a.is_deleted() for a in olds)
  figures["after_steps"] = _status()["VmRSS"]
  core.release_freed_heap()
  figures["after_steps_trim"] = _status()["VmRSS"]
  figures["host_copy_bytes"], figures["host_copy_rss"] = _host_copy(state)
  figures["devices"] = job.mesh.size
  with open(out, "w") as f:
    json.dump(figures, f)


def _run_child(name: str, root: str, tag: str = "", **args: Any) -> dict[str, Any]:
  """Runs this script as `--child=name` in a fresh process; its JSON figures."""
  out = os.path.join(root, f"figures_{name}{tag}.json")  # not job.json: that marks a workdir
  command = [sys.executable, os.path.abspath(__file__), f"--child={name}", f"--out={out}"]
  command += [f"--{k}={v}" for k, v in args.items()]
  command += [f"--batches={_BATCHES.value}", f"--examples={_EXAMPLES.value}"]
  command += [f"--save_every={_SAVE_EVERY.value}"]
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  if done.returncode != 0:
    raise RuntimeError(f"child '{name}' failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
  with open(out) as f:
    return json.load(f)


def _peaks(job: dict[str, Any]) -> dict[str, Any]:
  """A job's peak RSS overall and before its first save, and their ratio to the state."""
  state = sum(job["state"].values())
  peak = job["peak"]
  saves = [p for p in job["phases"] if p.startswith("save (")]
  first_save = job["phases"].index(saves[0]) if saves else len(job["phases"])
  before = max(peak[p]["VmRSS"] for p in job["phases"][:first_save])
  return {
    "max_rss": job["max_rss"],
    "max_rss_over_state": job["max_rss"] / state,
    "max_rss_without_imports_over_state": (job["max_rss"] - job["imports_rss"]) / state,
    "peak_before_first_save": before,
    "peak_before_first_save_over_state": before / state,
    "save_peak_over_peak_before": max((peak[p]["VmRSS"] for p in saves), default=before) - before,
    "phase_peaks": {p: peak[p]["VmRSS"] for p in job["phases"]},
    "seconds": job["seconds"],
  }


def _summary(jobs: dict[str, dict[str, Any]], parts: dict[str, Any]) -> dict[str, Any]:
  """The figures: state, peaks, their ratio, and where the rest goes (bytes)."""
  job = jobs["job"]
  steady = parts["steady_step"]
  return {
    "state_bytes": job["state"],
    "state_total_bytes": sum(job["state"].values()),
    "imports_rss": job["imports_rss"],
    "jobs": {name: _peaks(j) for name, j in jobs.items()},
    "phases": {p: {"end": job["last"][p], "peak": job["peak"][p]} for p in job["phases"]},
    "data_workers_max_rss_of_one": max(p.get("worker_max", 0) for p in job["peak"].values()),
    "data_workers_sampled_rss_sum": max(p.get("workers", 0) for p in job["peak"].values()),
    "batch_bytes": job["batch_bytes"],
    "input_shared_memory_peak": max(p.get("RssShmem", 0) for p in job["peak"].values()),
    "step_memory_per_device": {"steady": steady, "fill_drain": parts["fill_drain_step"]},
    "step_temporaries_all_devices": steady["temporaries"] * parts["devices"],
    "tables_and_slots_donated": parts["tables_and_slots_donated"],
    "compile_heap_kept": parts["after_compile"] - parts["after_compile_trim"],
    "steps_heap_kept": parts["after_steps"] - parts["after_steps_trim"],
    "host_copy_bytes": parts["host_copy_bytes"],
    "host_copy_rss": parts["host_copy_rss"],
  }


def _mb(n: float) -> str:
  return f"{n / MB:,.0f} MB"


def _phase_table(figures: dict[str, Any]) -> None:
  state, jobs = figures["state_total_bytes"], figures["jobs"]
  widths = [max(len(t), 13) for t in _JOB_TITLES]

  def row(name: str, cells: list[str], extra: str = "") -> None:
    print(f"{name:<40} " + " ".join(f"{c:>{w}}" for c, w in zip(cells, widths)) + extra)

  row("phase (peak RSS; /state)", list(_JOB_TITLES), f" {'shmem':>7}")
  for phase, v in figures["phases"].items():
    cells = []
    for name in _JOBS:
      peak = jobs[name]["phase_peaks"].get(phase)
      cells.append(f"{_mb(peak)} {peak / state:4.2f}" if peak else "-")
    row(phase, cells, f" {_mb(v['peak'].get('RssShmem', 0)):>7}")
  for key, what in (
    ("max_rss", "peak RSS (ru_maxrss)"),
    ("peak_before_first_save", "peak before the first save"),
  ):
    row(what, [f"{_mb(jobs[n][key])} {jobs[n][key] / state:4.2f}" for n in _JOBS])
  row(
    "(peak - imports) / state",
    [f"{jobs[n]['max_rss_without_imports_over_state']:4.2f}" for n in _JOBS],
  )
  row("seconds", [f"{jobs[n]['seconds']:.0f}" for n in _JOBS])


def _report(figures: dict[str, Any]) -> None:
  """Prints the tables."""
  s, state = figures["state_bytes"], figures["state_total_bytes"]
  print(
    f"criteo config, 8 CPU devices, {_BATCHES.value} batches of 4096, saves every"
    f" {_SAVE_EVERY.value}; job {figures['jobs']['job']['seconds']:.0f} s"
  )
  print("state (every device's shards): " + ", ".join(f"{k} {_mb(v)}" for k, v in s.items()))
  print(f"  total {_mb(state)}")
  _phase_table(figures)
  steady = figures["step_memory_per_device"]["steady"]
  donated = f"{steady['outputs_in_donated_buffers'] / MB:.2f} of {steady['outputs'] / MB:.2f} MB"
  jobs = figures["jobs"]
  rows = [
    ("where the rest goes", ""),
    ("  Python, JAX, numba after imports", _mb(figures["imports_rss"])),
    ("  step temporaries (XLA, all devices)", _mb(figures["step_temporaries_all_devices"])),
    ("  step outputs in donated buffers, per device", donated),
    ("  old tables and slots deleted by a step", str(figures["tables_and_slots_donated"])),
    ("  heap kept by glibc after compiling", _mb(figures["compile_heap_kept"])),
    ("  heap kept by glibc after 4 steps", _mb(figures["steps_heap_kept"])),
    ("  input: worker blocks mapped (shmem peak)", _mb(figures["input_shared_memory_peak"])),
    ("  input: one placed batch", _mb(figures["batch_bytes"])),
    ("  data workers: RSS of one (sampled peak)", _mb(figures["data_workers_max_rss_of_one"])),
    ("  data workers: RSS summed (sampled peak)", _mb(figures["data_workers_sampled_rss_sum"])),
    ("  save: host copy (replica 0 shards)", _mb(figures["host_copy_bytes"])),
    ("  save: peak over the peak before it", _mb(jobs["job"]["save_peak_over_peak_before"])),
  ]
  for name in ("table_groups", "one_program"):
    init = figures[f"init_{name}"]
    rows += [
      (f"init alone, {name.replace('_', ' ')}: peak growth", _mb(init["max_rss"] - init["before"])),
      (
        "  RSS kept / after trim",
        f"{_mb(init['after'] - init['before'])} / {_mb(init['after_trim'] - init['before'])}",
      ),
      ("  seconds (compile included)", f"{init['seconds']:.1f}"),
    ]
  width = max(len(r[0]) for r in rows)
  for name, value in rows:
    print(f"{name:<{width}}  {value:>22}")


def _growth(root: str) -> dict[str, Any]:
  """The growth rows: state, peaks and overhead at scale 1 and --growth_scale, sync and async."""
  rows: dict[str, Any] = {}
  runs = (("sync", "job_sync_saves", 1), ("resumed", _RESUMED, 1), ("async", "job", 2))
  for scale in (1, _GROWTH_SCALE.value):
    workdir = os.path.join(root, f"growth_x{scale}")
    for mode, child, copies in runs:  # the resumed job resumes the sync one's workdir
      tag = f"_x{scale}_{mode}"
      if mode == "async":
        shutil.rmtree(workdir, ignore_errors=True)
      job = _run_child(child, root, tag=tag, workdir=workdir, vocab_scale=scale)
      state = sum(job["state"].values())
      rows[f"x{scale} {mode}"] = {
        "vocab_scale": scale,
        "saves": mode,
        "state_bytes": state,
        "peak_rss": job["max_rss"],
        "overhead": job["max_rss"] - copies * state,
        "peak_over_state": job["max_rss"] / state,
        "goal_peak_over_state": 2.6 if mode == "async" else 1.6,
        "seconds": job["seconds"],
        "peak_phase": max(job["phases"], key=lambda p: job["peak"][p]["VmRSS"]),
        "phase_peaks": {p: job["peak"][p]["VmRSS"] for p in job["phases"]},
      }
    shutil.rmtree(workdir, ignore_errors=True)
  for mode, _, _ in runs:
    big = rows[f"x{_GROWTH_SCALE.value} {mode}"]
    big["overhead_growth"] = big["overhead"] / rows[f"x1 {mode}"]["overhead"]
  return rows


_MEDIAN_FIGURES = ("state_bytes", "peak_rss", "overhead", "peak_over_state", "overhead_growth")


def _growth_medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
  """Each row's figures as their median over the runs (repeats), with every run's
  overhead growth beside it: one run's ratio moves by about 0.15 on a shared machine."""
  rows: dict[str, Any] = {}
  for name, first in runs[0].items():
    row = dict(first)
    for key in _MEDIAN_FIGURES:
      if key in first:
        row[key] = float(np.median([run[name][key] for run in runs]))
    if "overhead_growth" in first:
      row["overhead_growth_runs"] = [run[name]["overhead_growth"] for run in runs]
    rows[name] = row
  return rows


def _growth_report(rows: dict[str, Any]) -> None:
  print(
    f"growth: criteo, 8 CPU devices, {_BATCHES.value} batches, saves every {_SAVE_EVERY.value};"
    " overhead = peak - state (- one more state for async saves)"
    + (f"; medians of {_REPEATS.value} runs" if _REPEATS.value > 1 else "")
  )
  head = (
    "vocab, saves",
    "state",
    "peak RSS",
    "overhead",
    "peak/state (goal)",
    "overhead/x1 (<=1.2)",
  )
  print(f"{head[0]:<13}" + "".join(f"{h:>20}" for h in head[1:]))
  for name, r in rows.items():
    growth = f"{r['overhead_growth']:.2f}" if "overhead_growth" in r else "-"
    ratio = f"{r['peak_over_state']:.2f} (<={r['goal_peak_over_state']})"
    cells = (_mb(r["state_bytes"]), _mb(r["peak_rss"]), _mb(r["overhead"]), ratio, growth)
    print(f"{name:<13}" + "".join(f"{c:>20}" for c in cells) + f"  (peak in: {r['peak_phase']})")
  if _REPEATS.value > 1:
    for name, r in rows.items():
      if "overhead_growth_runs" in r:
        runs = ", ".join(f"{g:.2f}" for g in r["overhead_growth_runs"])
        print(f"overhead/x1 of each run, {name.split(' ', 1)[1]}: {runs}")


def _phases(root: str) -> dict[str, Any]:
  """The phase tables' figures (section phases)."""
  jobs = {name: _run_child(name, root, workdir=os.path.join(root, name)) for name in _JOBS}
  data = os.path.join(root, "job", "data")
  parts = _run_child("step", root, workdir=data)
  figures = _summary(jobs, parts)
  for name in ("table_groups", "one_program"):
    figures[f"init_{name}"] = _run_child(f"init_{name}", root, workdir=data)
  return figures


def main(argv: list[str]) -> None:
  del argv
  child = _CHILD.value
  if child in _JOBS + (_RESUMED,):
    _child_job(_WORKDIR.value, _OUT.value, child)
    return
  if child in ("init_table_groups", "init_one_program"):
    _child_init(_WORKDIR.value, _OUT.value, one_program=child == "init_one_program")
    return
  if child == "step":
    _child_step(_WORKDIR.value, _OUT.value)
    return
  root = tempfile.mkdtemp(prefix="sparsepipe_memory_bench_")
  figures: dict[str, Any] = {}
  try:
    if "growth" in _SECTIONS.value:
      figures["growth_runs"] = [_growth(root) for _ in range(_REPEATS.value)]
      figures["growth"] = _growth_medians(figures["growth_runs"])
    if "phases" in _SECTIONS.value:
      figures.update(_phases(root))
  finally:
    shutil.rmtree(root, ignore_errors=True)
  if "phases" in _SECTIONS.value:
    _report(figures)
  if "growth" in _SECTIONS.value:
    _growth_report(figures["growth"])
  if _JSON.value:
    outputs.write(_JSON.value, figures, indent=2, sort_keys=True)


if __name__ == "__main__":
  app.run(main)

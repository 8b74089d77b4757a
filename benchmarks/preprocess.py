"""Benchmark of the per-host COO preprocessing (sparsepipe vs reference).

Workload: 4096 samples x 26 ragged features (1..20 ids each, ~1.1M ids),
vocabularies 1e3..1e7 log-spaced, id = floor(V*u^3); 8 global devices x 4
SparseCores, 8 local devices (one host); every table its own stack; limits
FDO-tuned (one run, update_preprocessing_parameters, then timed runs).

Timed: sparsepipe on ragged object arrays (the reference's input), on the
columnar RaggedBatch form, jax-tpu-embedding 0.1.0 when importable,
single-threaded (SPARSECORE_INPUT_PREPROCESSING_THREADS=1, set before its
import; its thread pool reads it once), and a bare `np.sort` of the batch's
ids as 64-bit keys (id << 32 | sample), the floor of any sort-based
preprocessing. The paths run interleaved; reported are min and median wall
time and min CPU time (process_time) per batch, which is the steadier
figure on a shared machine. Statistics and row pointers of both are
compared before timing.

The breakdown then times our phases inside real calls (compiled key pass,
np.sort of the SC rows, gains, compiled layout pass, reading the inputs,
the id range check) as exclusive thread CPU time, min over the reps; the
rest of a call is Python glue, allocations and statistics.

    python benchmarks/preprocess.py [--reps 20] [--json out.json] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

os.environ.setdefault("SPARSECORE_INPUT_PREPROCESSING_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

from sparsepipe import core
from sparsepipe import transforms as T  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.data.ragged import RaggedBatch  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe.transforms.coo import gains as coo_gains
from sparsepipe.transforms.coo import inputs as coo_inputs
from sparsepipe.transforms.coo import passes as coo_pass
from sparsepipe.transforms.coo import sort as coo_sort
from sparsepipe.transforms.coo import stack as coo_stack
import outputs

BATCH, FEATURES, MAX_IDS = 4096, 26, 20
GLOBAL_DEVICES, LOCAL_DEVICES, SC_PER_DEVICE = 8, 8, 4


def make_workload(seed: int = 0):
  """(vocab sizes, ragged object arrays, RaggedBatches)."""
  rng = np.random.default_rng(seed)
  vocabs = np.round(np.logspace(3, 7, FEATURES)).astype(np.int64)
  ragged, columnar = [], []
  for vocab in vocabs:
    lengths = rng.integers(1, MAX_IDS + 1, BATCH)
    ids = np.floor(vocab * rng.random(int(lengths.sum())) ** 3).astype(np.int32)
    rows = np.empty(BATCH, object)
    rows[:] = [r.copy() for r in np.split(ids, np.cumsum(lengths)[:-1])]
    ragged.append(rows)
    columnar.append(RaggedBatch(ids, lengths.astype(np.int32)))
  return vocabs, ragged, columnar


def our_specs(vocabs):
  specs = [
    core.FeatureSpec(
      name=f"f{i:02d}",
      table_spec=core.TableSpec(
        name=f"t{i:02d}",
        vocabulary_size=int(v),
        embedding_dim=16,
        combiner="mean",
        max_ids_per_partition=4096,
        max_unique_ids_per_partition=4096,
      ),
      input_shape=(BATCH, MAX_IDS),
      output_shape=(BATCH, 16),
    )
    for i, v in enumerate(vocabs)
  ]
  return T.prepare_feature_specs_for_training(specs, GLOBAL_DEVICES, SC_PER_DEVICE)


def reference_specs(vocabs):
  import jax  # pylint: disable=g-import-not-at-top
  from jax_tpu_embedding.sparsecore.lib.nn import embedding  # pylint: disable=g-import-not-at-top
  from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec  # pylint: disable=g-import-not-at-top

  specs = [
    embedding_spec.FeatureSpec(
      name=f"f{i:02d}",
      table_spec=embedding_spec.TableSpec(
        name=f"t{i:02d}",
        vocabulary_size=int(v),
        embedding_dim=16,
        initializer=jax.nn.initializers.zeros,
        optimizer=embedding_spec.SGDOptimizerSpec(),
        combiner="mean",
        max_ids_per_partition=4096,
        max_unique_ids_per_partition=4096,
      ),
      input_shape=[BATCH, MAX_IDS],
      output_shape=[BATCH, 16],
    )
    for i, v in enumerate(vocabs)
  ]
  embedding.prepare_feature_specs_for_training(specs, GLOBAL_DEVICES, SC_PER_DEVICE)
  return specs


def time_paths(paths: dict, reps: int) -> dict[str, dict[str, float]]:
  """Interleaved timing: every repetition runs every path once, in turn, so
  a shared machine's load hits all paths alike. Per path: min and median
  wall seconds and min CPU seconds (process_time; all paths are
  single-threaded), after one warm-up call each."""
  for fn in paths.values():
    fn()
  wall = {name: [] for name in paths}
  cpu = {name: [] for name in paths}
  for _ in range(reps):
    for name, fn in paths.items():
      start, start_cpu = time.perf_counter(), time.process_time()
      fn()
      cpu[name].append(time.process_time() - start_cpu)
      wall[name].append(time.perf_counter() - start)
  return {
    name: {
      "min": float(np.min(wall[name])),
      "median": float(np.median(wall[name])),
      "cpu_min": float(np.min(cpu[name])),
    }
    for name in paths
  }


# Phases timed by the breakdown: (label, module, function). A phase's time
# is exclusive: the sort row is _sorted_keys less the key passes it calls.
PHASES = (
  ("read inputs (normalize_feature)", coo_inputs, "normalize_feature"),
  ("id range check", coo_stack, "_check_feature"),
  ("key pass (compiled)", coo_pass, "key_pass"),
  ("sort (np.sort per SC)", coo_sort, "_sorted_keys"),
  ("gains", coo_gains, "id_gains"),
  ("layout pass (compiled)", coo_pass, "layout_pass"),
)
GLUE = "Python glue, allocations, stats"


def breakdown(fn, reps: int) -> dict[str, float]:
  """Exclusive thread CPU seconds of every phase of fn() (min over reps),
  by wrapping the phase functions; the rest of the call is GLUE. A timer
  call costs ~0.5 us, some 0.1 ms per batch spread over the phases."""
  clock = time.thread_time
  spent: dict[str, float] = {}
  inner: list[float] = []  # time spent in wrapped callees of the open calls

  def wrap(label, f):
    def timed(*args, **kwargs):
      inner.append(0.0)
      start = clock()
      try:
        return f(*args, **kwargs)
      finally:
        elapsed = clock() - start
        spent[label] += elapsed - inner.pop()
        if inner:
          inner[-1] += elapsed

    return timed

  originals = [(module, name, getattr(module, name)) for _, module, name in PHASES]
  for (label, module, name), (_, _, f) in zip(PHASES, originals):
    setattr(module, name, wrap(label, f))
  runs = []
  try:
    for _ in range(reps):
      spent.update(dict.fromkeys((label for label, _, _ in PHASES), 0.0))
      start = clock()
      fn()
      total = clock() - start
      runs.append({**spent, GLUE: total - sum(spent.values()), "total": total})
  finally:
    for module, name, f in originals:
      setattr(module, name, f)
  return {label: min(r[label] for r in runs) for label in runs[0]}


def sort_keys(columnar) -> np.ndarray:
  """The batch's ids as 64-bit keys id << 32 | sample, all features."""
  return np.concatenate(
    [
      (b.values.astype(np.uint64) << np.uint64(32))
      | np.repeat(np.arange(BATCH, dtype=np.uint64), b.row_lengths)
      for b in columnar
    ]
  )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--reps", type=int, default=20)
  parser.add_argument(
    "--json", default=None, type=outputs.argparse_path, help="write the figures here"
  )
  parser.add_argument("--profile", action="store_true", help="print a cProfile of our ragged path")
  args = parser.parse_args()

  vocabs, ragged, columnar = make_workload()
  num_ids = int(sum(int(b.row_lengths.sum()) for b in columnar))
  specs = our_specs(vocabs)

  def ours(features, specs):
    return T.preprocess_sparse_dense_matmul_input(
      features, None, specs, LOCAL_DEVICES, GLOBAL_DEVICES, num_sc_per_device=SC_PER_DEVICE
    )

  _, stats = ours(ragged, specs)
  specs = T.update_preprocessing_parameters(specs, stats, SC_PER_DEVICE)
  keys = sort_keys(columnar)
  paths = {
    "sparsepipe ragged": lambda: ours(ragged, specs),
    "sparsepipe RaggedBatch": lambda: ours(columnar, specs),
    f"np.sort {keys.size} uint64": lambda: np.sort(keys),
  }
  reference, ref_note = _reference(vocabs, ragged)
  if reference is not None:
    _check_same(ours(ragged, specs), reference())
    paths["reference (1 thread)"] = reference
  results = time_paths(paths, args.reps)
  print(
    f"{num_ids} ids, {BATCH} samples x {FEATURES} features,"
    f" G={GLOBAL_DEVICES} L={LOCAL_DEVICES} S={SC_PER_DEVICE};"
    f" {args.reps} interleaved reps; {ref_note};"
    f" load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
  )
  figures = {
    "num_ids": num_ids,
    "batch": BATCH,
    "features": FEATURES,
    "reps": args.reps,
    "reference_threads": ref_note,
    "load_average": os.getloadavg()[0],
    "paths": _report(results, num_ids),
    "breakdown_ms": {},
  }
  for name in ("sparsepipe ragged", "sparsepipe RaggedBatch"):
    figures["breakdown_ms"][name] = {
      label: t * 1e3 for label, t in breakdown(paths[name], args.reps).items()
    }
  _print_breakdown(figures["breakdown_ms"])
  if args.profile:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(5):
      ours(ragged, specs)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(18)
    print(out.getvalue())
  if args.json:
    outputs.write(args.json, figures, indent=2)


def _reference(vocabs, ragged):
  """(the reference's call with FDO-tuned limits, or None; a note on it)."""
  try:
    from jax_tpu_embedding.sparsecore.lib.nn import embedding  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None, "jax_tpu_embedding not importable"
  from absl import logging  # pylint: disable=g-import-not-at-top

  logging.set_verbosity(logging.ERROR)
  rspecs = reference_specs(vocabs)

  def reference():
    return embedding.preprocess_sparse_dense_matmul_input(
      ragged, None, rspecs, LOCAL_DEVICES, GLOBAL_DEVICES, num_sc_per_device=SC_PER_DEVICE
    )

  _, rstats = reference()
  embedding.update_preprocessing_parameters(rspecs, rstats, SC_PER_DEVICE)
  threads = os.environ["SPARSECORE_INPUT_PREPROCESSING_THREADS"]
  return reference, f"reference threads: SPARSECORE_INPUT_PREPROCESSING_THREADS={threads}"


def _report(results: dict, num_ids: int) -> dict:
  """Prints the table and the ratios (to the reference and to np.sort)."""
  print(
    f"{'path':26s} {'ms/batch':>9s} {'median':>8s} {'cpu ms':>8s} {'samples/s':>11s} {'Mids/s':>8s}"
  )
  paths = {}
  for name, r in results.items():
    best = r["min"]
    print(
      f"{name:26s} {best * 1e3:9.2f} {r['median'] * 1e3:8.2f}"
      f" {r['cpu_min'] * 1e3:8.2f} {BATCH / best:11.0f}"
      f" {num_ids / best / 1e6:8.2f}"
    )
    paths[name] = {
      "ms_per_batch": best * 1e3,
      "median_ms": r["median"] * 1e3,
      "cpu_ms": r["cpu_min"] * 1e3,
      "samples_per_s": BATCH / best,
      "ids_per_s": num_ids / best,
    }
  sort_name = next(name for name in results if name.startswith("np.sort"))
  for base, key in (("reference (1 thread)", "reference"), (sort_name, "np_sort")):
    if base not in results:
      continue
    for name in ("sparsepipe ragged", "sparsepipe RaggedBatch"):
      ratio = results[name]["min"] / results[base]["min"]
      cpu_ratio = results[name]["cpu_min"] / results[base]["cpu_min"]
      paths[name][f"ratio_to_{key}"] = ratio
      paths[name][f"cpu_ratio_to_{key}"] = cpu_ratio
      print(f"{name} / {base}: {ratio:.2f}x wall, {cpu_ratio:.2f}x cpu")
  return paths


def _print_breakdown(figures: dict) -> None:
  names = list(figures)
  print(f"\nbreakdown, cpu ms (min of reps) {'':12s}" + "".join(f"{n[11:]:>13s}" for n in names))
  for label in figures[names[0]]:
    cells = "".join(f"{figures[n][label]:13.2f}" for n in names)
    print(f"{label:44s}{cells}")


def _check_same(ours, reference) -> None:
  """Same buffers where the reference writes, same statistics."""
  (o, ostats), (r, rstats) = ours, reference
  for field in (
    "max_ids_per_partition",
    "max_unique_ids_per_partition",
    "required_buffer_size_per_sc",
  ):
    for stack, value in getattr(rstats, field).items():
      np.testing.assert_array_equal(getattr(ostats, field)[stack], value)
  om, rm = o.sparse_dense_matmul_input, r.sparse_dense_matmul_input
  for stack, rp in rm.lhs_row_pointers.items():
    np.testing.assert_array_equal(om.lhs_row_pointers[stack], rp)
    assert om.lhs_gains[stack].shape == rm.lhs_gains[stack].shape


if __name__ == "__main__":
  main()

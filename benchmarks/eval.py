"""Evaluation cost: the eval input against the train input, evaluate() against bare steps.

    python benchmarks/eval.py [--json out.json] [--num_examples 100000]

Measures, on a generated Criteo-shaped dataset (13 dense, 26 sparse
features of 1..20 ids, every batch size not dividing the data):
  (a) one pass of the train host pipeline (in order, num_epochs=1), the
      baseline, and (b) one pass of the eval host pipeline (example
      positions, padding, mask), in examples per second; (b)/(a) is the
      price of exact, padded eval batches (records that straddle two
      batches are read by both);
  (c) the eval steps alone over batches already on the devices, and (d)
      `evaluate` over the same batches (per-batch host copies, the merge
      and the exact metrics); (d)/(c) is the bookkeeping overhead.
Runs on 8 simulated CPU devices (set before jax is imported). The machine
may be shared: compare figures from one run only.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import optax  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sparsepipe import core  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe import data  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe import pipeline  # pylint: disable=g-import-not-at-top,wrong-import-position
from sparsepipe import transforms as T  # pylint: disable=g-import-not-at-top,wrong-import-position
import outputs  # pylint: disable=g-import-not-at-top,wrong-import-position

_NUM_EXAMPLES = flags.DEFINE_integer("num_examples", 100_000, "Examples to generate.")
_PER_RECORD = flags.DEFINE_integer("examples_per_record", 128, "Examples packed per record.")
_BATCH = flags.DEFINE_integer("batch_size", 2048, "Per-host batch size.")
_SC = flags.DEFINE_integer("num_sc_per_device", 2, "SparseCores per device.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Passes per measurement (the best is kept).")
_JSON = outputs.json_flag()


def _specs(manifest, devices):
  specs = {}
  for f in manifest.schema.sparse:
    table = core.TableSpec(
      f.name.lower(),
      f.vocab_size,
      16,
      combiner="sum",
      max_ids_per_partition=4096,
      max_unique_ids_per_partition=4096,
    )
    specs[f.name] = core.FeatureSpec(f.name, table, (_BATCH.value, 20), (_BATCH.value, 16))
  return T.prepare_feature_specs_for_training(specs, devices, _SC.value)


def _best_rate(run):
  """Best examples per wall second and per CPU second of --repeats calls of run() -> examples."""
  wall = cpu = 0.0
  for _ in range(_REPEATS.value):
    start, start_cpu = time.perf_counter(), time.process_time()
    n = run()
    wall = max(wall, n / (time.perf_counter() - start))
    cpu = max(cpu, n / max(time.process_time() - start_cpu, 1e-9))
  return wall, cpu


def _input_rates(manifest, specs, devices):
  config = T.InputConfig(
    manifest.directory,
    _BATCH.value,
    shuffle=False,
    num_epochs=1,
    num_sc_per_device=_SC.value,
    allow_id_dropping=True,
  )
  kw = dict(
    local_device_count=devices, global_device_count=devices, process_index=0, process_count=1
  )
  evaluation = T.make_host_eval_input(config, specs, **kw)

  def train():
    return sum(int(b.batch.labels.shape[0]) for b in T.make_host_input(config, specs, **kw))

  def real():
    return sum(int(b.mask.sum()) for b in evaluation)

  return _best_rate(train), _best_rate(real)


def _step_rates(manifest, specs, mesh):
  model = pipeline.DLRM(bottom_mlp_dims=(64, 16), top_mlp_dims=(64, 32))
  dims = pipeline.feature_dims_of(specs)
  params = model.init(jax.random.key(0), manifest.schema.num_dense, dims)
  emb = pipeline.init_embedding_variables(
    jax.random.key(1), specs, mesh, num_sc_per_device=_SC.value
  )
  state = pipeline.create_train_state(optax.adam(1e-3), params, mesh, emb)
  step = pipeline.make_eval_step(mesh, specs, _SC.value, pipeline.make_predict_fn(model, specs))
  config = T.InputConfig(
    manifest.directory, _BATCH.value, num_sc_per_device=_SC.value, allow_id_dropping=True
  )
  batches = list(pipeline.make_eval_input(config, specs, mesh))
  examples = manifest.num_examples

  def bare():
    outs = [step(state, b) for b in batches]
    jax.block_until_ready(outs)
    return examples

  def full():
    pipeline.evaluate(step, state, batches)
    return examples

  bare()  # compile
  return _best_rate(bare), _best_rate(full)


def main(argv):
  del argv
  with tempfile.TemporaryDirectory() as tmp:
    manifest = data.write_synthetic(
      os.path.join(tmp, "criteo_like"),
      data.criteo_like_features(26, 100_000, min_ids=1, max_ids=20),
      num_examples=_NUM_EXAMPLES.value,
      num_dense=13,
      seed=0,
      examples_per_record=_PER_RECORD.value,
    )
    mesh = core.make_mesh()
    specs = _specs(manifest, mesh.size)
    train, evaluation = _input_rates(manifest, specs, mesh.size)
    bare, full = _step_rates(manifest, specs, mesh)
  rows = {}
  for i, unit in enumerate(("wall_s", "cpu_s")):
    rows[unit] = {
      "train_input": train[i],
      "eval_input": evaluation[i],
      "eval_over_train_input": evaluation[i] / train[i],
      "bare_eval_steps": bare[i],
      "evaluate": full[i],
      "evaluate_over_bare_steps": full[i] / bare[i],
    }
  print(
    f"\neval: {manifest.num_examples:,} examples, batch {_BATCH.value},"
    f" {manifest.examples_per_record} examples/record, {mesh.size} CPU devices x"
    f" {_SC.value} SC"
  )
  print(
    f"{'examples per':>12} {'(a) train input':>16} {'(b) eval input':>15} {'(b)/(a)':>8}"
    f" {'(c) eval steps':>15} {'(d) evaluate':>13} {'(d)/(c)':>8}"
  )
  for unit, r in rows.items():
    print(
      f"{unit:>12} {r['train_input']:>16,.0f} {r['eval_input']:>15,.0f}"
      f" {r['eval_over_train_input']:>8.3f} {r['bare_eval_steps']:>15,.0f}"
      f" {r['evaluate']:>13,.0f} {r['evaluate_over_bare_steps']:>8.3f}"
    )
  print(
    f"load average at the end: {os.getloadavg()[0]:.1f} (a shared machine makes wall figures noisy)"
  )
  if _JSON.value:
    outputs.write(
      _JSON.value,
      {
        "benchmark": "eval",
        "batch_size": _BATCH.value,
        "examples_per_record": manifest.examples_per_record,
        "num_examples": manifest.num_examples,
        "devices": mesh.size,
        "num_sc_per_device": _SC.value,
        "cpu_count": os.cpu_count(),
        "load_average_end": os.getloadavg()[0],
        **rows,
      },
    )


if __name__ == "__main__":
  app.run(main)

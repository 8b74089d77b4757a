"""The forward-only eval step and the eval pass, against a direct forward.

Two tables (mean combiner, dims 8 and 4) on 8 CPU devices with 2
SparseCores each; the reference looks rows up in the logical tables with
numpy and runs `dlrm_logits` on the result.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import sys

import jax
import numpy as np
import optax
import pytest

from sparsepipe import core
from sparsepipe import data
from sparsepipe import pipeline
from sparsepipe import transforms as T
import subprocess_harness as harness

G, S, B, ND = 8, 2, 32, 3
FEATURES = (data.SyntheticFeature("f0", 64, 1, 3), data.SyntheticFeature("f1", 48, 0, 2))
NUM_EXAMPLES = 93  # 3 eval batches of 32, the last with 29 real examples
EVAL_SCRIPT = os.path.abspath(__file__)


class Setup:
  """Specs, model, train state and eval step on all (global) devices.

  With `write_data` it writes the eval set to `path` (the processes of the
  2-process test read the one the test wrote).
  """

  def __init__(self, path, *, write_data=True):
    self.mesh = core.make_mesh()
    raw = {}
    for f, dim in zip(FEATURES, (8, 4)):
      table = core.TableSpec(
        f"t_{f.name}",
        f.vocab_size,
        dim,
        combiner="mean",
        max_ids_per_partition=16,
        max_unique_ids_per_partition=16,
        optimizer=core.SGDOptimizerSpec(0.1),
      )
      raw[f.name] = core.FeatureSpec(f.name, table, (B, f.max_ids), (B, dim))
    self.specs = T.prepare_feature_specs_for_training(raw, G, S)
    self.model = pipeline.DLRM(bottom_mlp_dims=(16, 8), top_mlp_dims=(16,))
    params = self.model.init(jax.random.key(0), ND, pipeline.feature_dims_of(self.specs))
    emb = pipeline.init_embedding_variables(
      jax.random.key(1), self.specs, self.mesh, num_sc_per_device=S
    )
    self.state = pipeline.create_train_state(optax.adam(0.01), params, self.mesh, emb)
    self.tables = pipeline.unstack_embedding_tables(emb, self.specs, num_sc_per_device=S)
    self.path = path
    self.examples = data.concat_batches(list(data.generate_batches(FEATURES, ND, NUM_EXAMPLES, 5)))
    if write_data:
      schema = data.synthetic_schema(FEATURES, ND)
      with data.ShardedRecordWriter(path, schema, examples_per_record=4) as writer:
        writer.write_batch(self.examples)
    self.traces = 0
    self.eval_step = pipeline.make_eval_step(self.mesh, self.specs, S, self.counting_predict)

  def counting_predict(self, *args):
    """The DLRM forward, counting how often it is traced."""
    self.traces += 1
    return pipeline.make_predict_fn(self.model, self.specs)(*args)

  def reference_scores(self, examples):
    """sigmoid(DLRM logits) of mean-combined rows of the logical tables."""
    acts = {}
    for f in FEATURES:
      rb = examples.sparse[f.name]
      table = self.tables[f"t_{f.name}"].astype(np.float64)
      splits = rb.row_splits()
      rows = [
        table[rb.values[a:b]].mean(0) if b > a else np.zeros(table.shape[1])
        for a, b in itertools.pairwise(splits)
      ]
      acts[f.name] = np.stack(rows).astype(np.float32)
    params = jax.tree.map(np.asarray, self.state.params)
    logits = self.model.apply(params, examples.dense, acts)
    return np.asarray(jax.nn.sigmoid(logits))

  def eval_batches(self):
    per_host = B // jax.process_count()
    config = T.InputConfig(self.path, per_host, num_sc_per_device=S)
    return pipeline.make_eval_input(config, self.specs, self.mesh)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  return Setup(str(tmp_path_factory.mktemp("eval_step") / "eval"))


def test_scores_equal_direct_forward(setup):
  batches = list(setup.eval_batches())
  assert len(batches) == 3
  scores = np.concatenate([np.asarray(setup.eval_step(setup.state, b)) for b in batches])
  mask = np.concatenate([np.asarray(b.mask) for b in batches])
  np.testing.assert_array_equal(mask, [1] * NUM_EXAMPLES + [0] * 3)
  want = setup.reference_scores(setup.examples)
  np.testing.assert_allclose(scores[:NUM_EXAMPLES], want, rtol=2e-6, atol=1e-7)
  out = setup.eval_step(setup.state, batches[0])
  assert out.sharding == core.data_sharding(setup.mesh) and out.dtype == np.float32


def test_evaluate_equals_metrics_of_direct_scores(setup):
  metrics = pipeline.evaluate(setup.eval_step, setup.state, setup.eval_batches())
  assert pipeline.evaluate(setup.eval_step, setup.state, setup.eval_batches()) == metrics
  want = pipeline.compute_metrics(setup.examples.labels, setup.reference_scores(setup.examples))
  assert metrics.examples == NUM_EXAMPLES
  assert metrics.auc == pytest.approx(want.auc, abs=1e-12)
  for name in ("logloss", "ne", "calibration"):
    assert getattr(metrics, name) == pytest.approx(getattr(want, name), rel=1e-5)


def test_eval_leaves_train_state_bit_identical(setup):
  before = jax.tree.map(lambda x: np.array(x, copy=True), setup.state)
  pipeline.evaluate(setup.eval_step, setup.state, setup.eval_batches())
  leaves = jax.tree.leaves(setup.state)
  assert not any(x.is_deleted() for x in leaves)  # nothing donated
  for a, b in zip(jax.tree.leaves(before), leaves):
    np.testing.assert_array_equal(a, np.asarray(b))
    assert a.dtype == b.dtype


def test_one_trace_for_every_batch_and_pass(setup):
  setup.eval_step = pipeline.make_eval_step(setup.mesh, setup.specs, S, setup.counting_predict)
  setup.traces = 0
  for _ in range(2):
    pipeline.evaluate(setup.eval_step, setup.state, setup.eval_batches())
  assert setup.traces == 1  # 6 batches, the padded last ones included


def test_two_processes_merge_to_the_one_process_metrics(setup):
  """Each process evaluates its 16-example blocks; the merged metrics are exact."""
  port = harness.free_port()
  env = harness.cpu_env(num_devices=4, compilation_cache_dir=harness.SESSION_JAX_CACHE)
  commands = [
    harness.python_command(EVAL_SCRIPT, setup.path, str(i), f"127.0.0.1:{port}") for i in range(2)
  ]
  results = harness.run_many(commands, env=env)
  assert [r.returncode for r in results] == [0, 0], results[0].describe()
  want = pipeline.evaluate(setup.eval_step, setup.state, setup.eval_batches())
  for result in results:
    (line,) = [x for x in result.lines if x.startswith("metrics ")]
    got = json.loads(line[len("metrics ") :])
    assert got["examples"] == NUM_EXAMPLES
    assert got["auc"] == pytest.approx(want.auc, abs=1e-12)
    for name in ("logloss", "ne", "calibration"):
      assert got[name] == pytest.approx(getattr(want, name), rel=1e-6)


if __name__ == "__main__":  # one process of the 2-process test: DATA PROCESS_ID COORDINATOR
  jax.distributed.initialize(
    coordinator_address=sys.argv[3], num_processes=2, process_id=int(sys.argv[2])
  )
  proc = Setup(sys.argv[1], write_data=False)
  metrics = pipeline.evaluate(proc.eval_step, proc.state, proc.eval_batches())
  print("metrics " + json.dumps(dataclasses.asdict(metrics)), flush=True)

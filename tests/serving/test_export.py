"""Exports and predictions: scores equal the job's eval step, deltas chain bit for bit.

Jobs of the tiny demo config train on 8 CPU devices; exports are read on
one (the export never needs the training mesh).
"""

import json
import os
import shutil
import sys

import jax
import ml_collections
import numpy as np
import pytest

from sparsepipe import checkpointing
from sparsepipe import core
from sparsepipe import pipeline
from sparsepipe import serving
from sparsepipe.launch import train_and_evaluate
from sparsepipe.launch.export import export_checkpoint
from sparsepipe.launch.job import dataset
from sparsepipe.launch.job.checkpoints import JobCheckpoints
from sparsepipe.launch.job.evaluation import JobEval
from sparsepipe.launch.job.model import JobModel
from sparsepipe.serving.apply import apply_deltas
from sparsepipe.serving.scoring import score_dataset

import launch_testing  # pylint: disable=g-bad-import-order
import subprocess_harness as harness  # pylint: disable=g-bad-import-order


class TwoLayer:
  """A user's model (see test_user_model.py): relu MLP over dense + embeddings."""

  def init(self, rng, dense_dim, feature_dims):
    width = dense_dim + sum(feature_dims.values())
    k1, k2 = jax.random.split(rng)
    return {"w1": jax.random.normal(k1, (width, 6)) * 0.3, "w2": jax.random.normal(k2, (6,))}

  def apply(self, params, dense, embeddings):
    x = jax.numpy.concatenate([dense] + [embeddings[f] for f in sorted(embeddings)], axis=1)
    return jax.nn.relu(x @ params["w1"]) @ params["w2"]


def make_two_layer(model_config):
  del model_config
  return TwoLayer()


MODELS = {
  "dlrm": {},
  "dcn_v2": {"model__name": "dcn_v2", "model__cross_layers": 2},
  "user": {"model__factory": f"{__name__}:make_two_layer"},
}


def _config(**overrides):
  return launch_testing.tiny_config(synthetic__eval_examples=100, **overrides)


def eval_step_scores(workdir, step):
  """Per-example scores of the job's own eval step (8 devices) on its eval set, in order."""
  config = ml_collections.ConfigDict(
    checkpointing.TrainingCheckpointManager(
      os.path.join(workdir, "checkpoints"), None, read_only=True
    )
    .read_metadata(step)
    .run.config
  )
  mesh = core.make_mesh()
  model = JobModel(config, dataset.ensure_dataset(config, workdir, show_progress=False), mesh)
  run = checkpointing.RunInfo.create(config, mesh, data_worker_count=0)
  with checkpointing.TrainingCheckpointManager(
    os.path.join(workdir, "checkpoints"), run, read_only=True
  ) as mngr:
    restored = JobCheckpoints(mngr, model).restore_model(step)
  evaluation = JobEval(model, data_dir=dataset.eval_data_dir(config, workdir))
  scores = []
  for batch in evaluation.dataset:
    out = np.asarray(jax.device_get(evaluation.step(restored.train_state, batch)))
    scores.append(out[np.asarray(batch.mask) == 1])
  return np.concatenate(scores)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_exported_scores_equal_the_eval_step_for_every_model(tmp_path, name):
  workdir = str(tmp_path / "job")
  result = train_and_evaluate(_config(num_steps=4, **MODELS[name]), workdir)
  info = export_checkpoint(workdir, str(tmp_path / "export"))
  assert (info.kind, info.checkpoint_step, info.batches_trained) == ("full", 4, 4)
  assert info.model["name"] == (
    MODELS[name].get("model__factory") or MODELS[name].get("model__name", "dlrm")
  )
  predictor = serving.Predictor.load(str(tmp_path / "export"))
  eval_dir = dataset.eval_data_dir(_config(), workdir)
  scores, labels = score_dataset(predictor, eval_dir, batch_size=37)
  np.testing.assert_allclose(scores, eval_step_scores(workdir, 4), atol=1e-5, rtol=0)
  assert pipeline.compute_metrics(labels, scores).auc == pytest.approx(
    result.last_eval.auc, abs=1e-6
  )
  # Exactly the vocabulary's rows of each table, at its own dim.
  for feature in info.features:
    table = predictor.tables[feature["table"]]
    assert table.shape == (feature["vocab_size"], feature["dim"])


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
  """Full export after batch 4 (8 devices), delta to 6 (resumed on 4 devices), delta to 8."""
  root = tmp_path_factory.mktemp("chain")
  workdir = str(root / "job")
  keep = dict(checkpoint__keep=100)
  train_and_evaluate(_config(num_steps=4, **keep), workdir)
  export_checkpoint(workdir, str(root / "a"))
  command = [
    sys.executable,
    "-m",
    "sparsepipe.launch",
    f"--workdir={workdir}",
    f"--config={launch_testing.DEMO_CONFIG}",
    *launch_testing.flag_overrides(synthetic__eval_examples=100, num_steps=6, **keep),
  ]
  resized = harness.run(command, env=harness.cpu_env(4), timeout_s=300)
  assert resized.returncode == 0, resized.describe()
  assert any("re-laid out from 8 devices" in line for line in resized.lines), resized.lines
  export_checkpoint(workdir, str(root / "b"), since=str(root / "a"))
  train_and_evaluate(_config(num_steps=8, **keep), workdir)
  export_checkpoint(workdir, str(root / "c"), since=str(root / "b"))
  export_checkpoint(workdir, str(root / "c_full"))
  return root, workdir


def _arrays(directory):
  tables = {
    n: np.load(os.path.join(directory, "tables", n))
    for n in os.listdir(os.path.join(directory, "tables"))
  }
  with np.load(os.path.join(directory, "params.npz")) as params:
    return tables, {k: params[k] for k in params}


def test_a_delta_chain_applied_equals_the_full_export_bit_for_bit(chain, tmp_path):
  root, _ = chain
  deltas = [str(root / "b"), str(root / "c")]
  for name in ("b", "c"):
    info = serving.read_info(str(root / name))
    assert info.kind == "delta" and 0 < sum(t["rows"] for t in info.tables.values())
  applied = apply_deltas(str(root / "a"), deltas, str(tmp_path / "applied"))
  assert (applied.kind, applied.checkpoint_step) == ("full", 8)
  got, want = _arrays(str(tmp_path / "applied")), _arrays(str(root / "c_full"))
  for part in range(2):
    assert sorted(got[part]) == sorted(want[part])
    for key, value in want[part].items():
      assert got[part][key].tobytes() == value.tobytes(), key
  loaded = serving.Predictor.load(str(root / "a"), deltas)
  for table, value in want[0].items():
    assert np.asarray(loaded.tables[table[:-4]]).tobytes() == value.tobytes()


def test_a_delta_holds_only_the_rows_updated_since_its_base(chain):
  root, _ = chain
  a, b = serving.read_info(str(root / "a")), serving.read_info(str(root / "b"))
  assert (a.updates_applied, b.since["updates_applied"], b.updates_applied) == (4, 4, 6)
  full = serving.read_info(str(root / "c_full"))
  for table, shape in b.tables.items():
    assert shape["rows"] < full.tables[table]["vocab_size"]
    ids = np.load(str(root / "b" / "tables" / f"{table}.ids.npy"))
    assert np.all(np.diff(ids) > 0) and ids.size == shape["rows"]


def test_a_delta_refuses_another_job_or_order(chain, tmp_path):
  root, _ = chain
  other = str(tmp_path / "other")
  train_and_evaluate(_config(num_steps=4), other)
  with pytest.raises(
    serving.ExportError,
    match=r"^the earlier export is of job \w+, checkpoint 4 of .* of job \w+: a delta is made"
    r" on top of an export of the same job$",
  ):
    export_checkpoint(other, str(tmp_path / "x"), since=str(root / "a"))
  export_checkpoint(other, str(tmp_path / "other_a"))
  with pytest.raises(
    serving.ExportError,
    match=r"is a delta of job \w+, '.*other_a' an export of job \w+: a delta applies only to"
    r" an export of its own job$",
  ):
    serving.Predictor.load(str(tmp_path / "other_a"), [str(root / "b")])
  with pytest.raises(serving.ExportError, match=r"apply the deltas in the order they were made$"):
    serving.Predictor.load(str(root / "a"), [str(root / "c")])


def test_a_damaged_or_partial_export_is_an_error_naming_the_file(chain, tmp_path):
  root, _ = chain
  copy = str(tmp_path / "copy")
  shutil.copytree(str(root / "a"), copy)
  with open(os.path.join(copy, "tables", "user.npy"), "r+b") as f:
    f.seek(-4, os.SEEK_END)
    f.write(b"\xff\xff\xff\xff")
  with pytest.raises(
    serving.ExportError,
    match=rf"^export '{copy}': file 'tables/user.npy' does not match its sha256"
    r" \(damaged or altered\)$",
  ):
    serving.Predictor.load(copy)
  os.remove(os.path.join(copy, "tables", "user.npy"))
  with pytest.raises(
    serving.ExportError, match=rf"^export '{copy}': file 'tables/user.npy' is missing$"
  ):
    serving.Predictor.load(copy)
  os.remove(os.path.join(copy, "export.json"))
  with pytest.raises(
    serving.ExportError,
    match=rf"^export '{copy}' has no export.json \(not an export, or a partial one\)$",
  ):
    serving.Predictor.load(copy)


def test_an_existing_export_is_kept_unless_overwrite(chain):
  root, workdir = chain
  before = json.loads((root / "a" / "export.json").read_text())
  with pytest.raises(
    FileExistsError, match=r"exists: give --overwrite to replace it, or another --output$"
  ):
    export_checkpoint(workdir, str(root / "a"))
  assert json.loads((root / "a" / "export.json").read_text()) == before

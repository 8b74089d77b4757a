"""Exports and predictions: scores equal the job's eval step, deltas chain bit for bit.

Jobs of the tiny demo config train on 8 CPU devices; exports are read on
one (the export never needs the training mesh).
"""

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

from sparsepipe import checkpointing
from sparsepipe import core
from sparsepipe import data
from sparsepipe import pipeline
from sparsepipe import serving
from sparsepipe.launch import train_and_evaluate
from sparsepipe.launch.evaluate import evaluate_checkpoint
from sparsepipe.launch.export import export_checkpoint
from sparsepipe.launch.job import training_data
from sparsepipe.launch.job.checkpoints import JobCheckpoints
from sparsepipe.launch.job.evaluation import JobEval
from sparsepipe.launch.job.model import JobModel
from sparsepipe.serving.apply import apply_deltas
from sparsepipe.serving.output_paths import check_file_output
from sparsepipe.serving import score_dataset

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
  data_dir = training_data.ensure_dataset(config, workdir, show_progress=False)
  model = JobModel(config, data.read_manifest(data_dir), mesh)
  run = checkpointing.RunInfo.create(config, mesh, data_worker_count=0)
  with checkpointing.TrainingCheckpointManager(
    os.path.join(workdir, "checkpoints"), run, read_only=True
  ) as mngr:
    restored = JobCheckpoints(mngr, model).restore_model(step)
  evaluation = JobEval(model, data_dir=training_data.eval_data_dir(config, workdir))
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
  eval_dir = training_data.eval_data_dir(_config(), workdir)
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
  command = launch_testing.launch_command(
    workdir, synthetic__eval_examples=100, num_steps=6, **keep
  )
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
  # The earlier export named by its path (before: only by its job's id).
  with pytest.raises(
    serving.ExportError,
    match=rf"^the earlier export '{re.escape(str(root / 'a'))}' is of job \w+, checkpoint 4"
    r" of .* of job \w+: a delta is made on top of an export of the same job$",
  ):
    export_checkpoint(other, str(tmp_path / "x"), since=str(root / "a"))
  export_checkpoint(other, str(tmp_path / "other_a"))
  with pytest.raises(
    serving.ExportError,
    match=r"is a delta of job \w+, '.*other_a' an export of job \w+: a delta applies only to"
    r" an export of its own job$",
  ):
    serving.Predictor.load(str(tmp_path / "other_a"), [str(root / "b")])
  with pytest.raises(
    serving.ExportError,
    match=r"' \(delta of checkpoint 8\) .*: the delta\(s\) from batch 4 to batch"
    r" 6 are missing$",
  ):
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


def test_what_a_killed_export_left_is_removed_or_put_back_by_the_next(chain):
  """A killed export (SIGKILL, or SIGTERM's default action) left its temporary
  folder for good, and one killed between the renames of --overwrite left no
  export (the old one hidden)."""
  root, workdir = chain
  dead = subprocess.Popen(["true"])
  dead.wait()
  left = f"{socket.gethostname()}-{dead.pid}"
  shutil.copytree(root / "a", root / f".k.old-{left}")  # the export --overwrite moved aside
  (root / f".k.tmp-{left}" / "tables").mkdir(parents=True)  # the new one, half written
  with pytest.raises(FileExistsError, match=r"'.*/k' exists: give --overwrite to replace it"):
    export_checkpoint(workdir, str(root / "k"))
  assert (root / "k" / "export.json").read_bytes() == (root / "a" / "export.json").read_bytes()
  export_checkpoint(workdir, str(root / "k"), overwrite=True)
  assert serving.read_info(str(root / "k")).checkpoint_step == 8
  assert not [n for n in os.listdir(root) if n.startswith(".k.")]


def _snapshot(root):
  """{relative path: sha256} of every file under `root`."""
  out = {}
  for directory, _, names in os.walk(root):
    for name in names:
      with open(os.path.join(directory, name), "rb") as f:
        out[os.path.relpath(os.path.join(directory, name), root)] = hashlib.sha256(
          f.read()
        ).hexdigest()
  return out


def _command(module, *args):
  """Runs `python -m module args` on the CPU: (exit status, stderr lines, stdout)."""
  out = subprocess.run(
    [sys.executable, "-m", module, *args],
    capture_output=True,
    text=True,
    env=harness.cpu_env(1),
    timeout=300,
    check=False,
  )
  return out.returncode, out.stderr.splitlines(), out.stdout


def _error_line(command, *args, **kwargs):
  """The line a command prints for the user error `command(*args, **kwargs)` raises
  (reports_errors: one of USER_ERRORS, its message on one line, exit status 1)."""
  with pytest.raises((ValueError, OSError, FloatingPointError)) as refused:
    command(*args, **kwargs)
  assert "\n" not in str(refused.value)
  return f"error: {refused.value}"


def test_an_export_never_writes_into_or_over_saved_work(chain, tmp_path):
  root, workdir = chain
  a, b = str(root / "a"), str(root / "b")
  notes = tmp_path / "notes.txt"
  notes.write_text("keep me")
  before = _snapshot(root)
  inputs = "an output never replaces or writes into the command's inputs; give another --output"
  cases = [
    ([f"--output={workdir}"], f"--output '{workdir}' is also the --workdir: {inputs}"),
    (
      [f"--output={workdir}/checkpoints"],
      f"--output '{workdir}/checkpoints' is inside the --workdir '{workdir}': {inputs}",
    ),
    ([f"--output={root}"], f"--output '{root}' holds the --workdir '{workdir}': {inputs}"),
    ([f"--output={a}", f"--since={a}"], f"--output '{a}' is also the --since export: {inputs}"),
    (
      [f"--output={b}/tables"],
      f"--output '{b}/tables' is inside export '{b}' (it has export.json): write the export"
      " outside any workdir, dataset or export",
    ),
    (
      [f"--output={notes}"],
      f"--output '{notes}' is a file, not an export: --overwrite replaces only an export; give"
      " another --output",
    ),
  ]
  # Every case with --overwrite; a workdir and its checkpoints without it, too. The
  # command's own line and status once (a subprocess), each case from export_checkpoint,
  # what the command calls with its flags (its error is the line, status 1).
  status, stderr, _ = _command(
    "sparsepipe.launch.export", f"--workdir={workdir}", *cases[0][0], "--overwrite"
  )
  assert (status, stderr) == (1, [f"error: {cases[0][1]}"])
  runs = [(*case, True) for case in cases] + [(*case, False) for case in cases[:2]]
  for args, line, overwrite in runs:
    flags = dict(a.removeprefix("--").split("=", 1) for a in args)
    assert _error_line(export_checkpoint, workdir, overwrite=overwrite, **flags) == (
      f"error: {line}"
    ), (args, overwrite)
  # Nothing saved changed, and nothing was left beside the outputs.
  assert _snapshot(root) == before
  assert sorted(os.listdir(tmp_path)) == ["notes.txt"] and notes.read_text() == "keep me"


def test_predict_writes_no_file_over_or_into_saved_work(chain, tmp_path):
  root, workdir = chain
  a, b, c = (str(root / n) for n in "abc")
  data_dir = training_data.eval_data_dir(_config(), workdir)
  scores = tmp_path / "scores.npy"
  scores.write_bytes(b"earlier scores")
  before = _snapshot(root)
  command = ("sparsepipe.serving.predict", f"--export={a}", f"--data={data_dir}")
  status, stderr, _ = _command(*command, f"--output={a}/params.npz", "--overwrite")
  assert (status, stderr) == (
    1,
    [
      f"error: --output '{a}/params.npz' is inside export '{a}' (it has export.json): write the"
      " scores outside any workdir, dataset or export"
    ],
  )
  # The command's line and status once; the other refusals from check_file_output, what
  # it calls with --output and --overwrite before anything is read.
  assert _error_line(check_file_output, f"{workdir}/scores.npy", overwrite=False) == (
    f"error: --output '{workdir}/scores.npy' is inside workdir '{workdir}' (it has job.json):"
    " write the scores outside any workdir, dataset or export"
  )
  assert _error_line(check_file_output, str(scores), overwrite=False) == (
    f"error: '{scores}' exists: give --overwrite to replace it, or another --output"
  )
  assert _snapshot(root) == before and scores.read_bytes() == b"earlier scores"
  # Every --delta is taken: the scores are those of the full export of the last one.
  status, stderr, stdout = _command(
    *command, f"--delta={b}", f"--delta={c}", f"--output={scores}", "--overwrite"
  )
  assert status == 0, stderr
  want, _ = score_dataset(serving.Predictor.load(str(root / "c_full")), data_dir)
  np.testing.assert_array_equal(np.load(scores), want)
  assert stdout.startswith(f"100 scores: {scores}")


def test_every_delta_flag_is_applied_and_a_wrong_link_is_named(chain, tmp_path):
  root, _ = chain
  a, b, c = (str(root / n) for n in "abc")
  ids = {n: serving.read_info(str(root / n)).export_id[:8] for n in "abc"}
  before = _snapshot(root)
  output = str(tmp_path / "applied")
  wrong_link = (
    f"error: export '{c}' (delta of checkpoint 8) was made on top of export {ids['b']} (after"
    f" batch 6), not on top of '{a}' (export {ids['a']}, checkpoint 4, after batch 4)"
  )
  cases = [
    ([f"--delta={c}", f"--delta={b}"], f"{wrong_link}: give '{b}' before it"),
    ([f"--delta={c}"], f"{wrong_link}: the delta(s) from batch 4 to batch 6 are missing"),
    (
      [f"--delta={b}", f"--delta={b}"],
      f"error: export '{b}' is given twice (export {ids['b']}): give each once",
    ),
  ]
  # The command's line and status once; every case from apply_deltas, what it calls
  # with its flags.
  status, stderr, _ = _command(
    "sparsepipe.serving.apply", f"--base={a}", *cases[0][0], f"--output={output}"
  )
  assert (status, stderr) == (1, [cases[0][1]])
  for deltas, line in cases:
    deltas = [d.removeprefix("--delta=") for d in deltas]
    assert _error_line(apply_deltas, a, deltas, output) == line, deltas
  # A delta given with a newer base than the export it was made on top of.
  line = _error_line(apply_deltas, str(root / "c_full"), [b], output)
  assert line.endswith(
    "after batch 8): it was made on an older export: apply it to that one, or give the"
    " deltas in the order they were made"
  ), line
  assert _error_line(apply_deltas, a, [b], a, overwrite=True) == (
    f"error: --output '{a}' is also the --base export: an output never replaces or writes"
    " into the command's inputs; give another --output"
  )
  assert _snapshot(root) == before and os.listdir(tmp_path) == []
  status, stderr, stdout = _command(
    "sparsepipe.serving.apply", f"--base={a}", f"--delta={b}", f"--delta={c}", f"--output={output}"
  )
  assert status == 0, stderr
  assert stdout == f"export of checkpoint 8 (after batch 8) from {a} and 2 delta(s): {output}\n"
  got, want = _arrays(output), _arrays(str(root / "c_full"))
  for part in range(2):
    assert {k: v.tobytes() for k, v in got[part].items()} == {
      k: v.tobytes() for k, v in want[part].items()
    }


def test_a_rolling_apply_takes_the_deltas_made_after_it(chain, tmp_path):
  """E4 + D6 = A6, then A6 + D8: A6 keeps D6's export_id (it holds the model D6 stands for)."""
  root, _ = chain
  b = serving.read_info(str(root / "b"))
  rolled = apply_deltas(str(root / "a"), [str(root / "b")], str(tmp_path / "a6"))
  assert (rolled.kind, rolled.checkpoint_step, rolled.export_id) == ("full", 6, b.export_id)
  applied = apply_deltas(str(tmp_path / "a6"), [str(root / "c")], str(tmp_path / "a8"))
  assert (applied.kind, applied.checkpoint_step) == ("full", 8)
  got, want = _arrays(str(tmp_path / "a8")), _arrays(str(root / "c_full"))
  for part in range(2):
    assert {k: v.tobytes() for k, v in got[part].items()} == {
      k: v.tobytes() for k, v in want[part].items()
    }
  with pytest.raises(
    serving.ExportError,
    match=rf"^export '{root / 'b'}' is already applied in '{tmp_path / 'a6'}' \(the same export"
    rf" {b.export_id[:8]}\): give each delta once$",
  ):
    serving.Predictor.load(str(tmp_path / "a6"), [str(root / "b")])


def test_a_delta_with_no_row_changed_says_so(chain, tmp_path):
  """Before: "delta of checkpoint 8 ...: 4 tables, 0 rows" and nothing more (the README's
  task exported the delta before training on)."""
  root, workdir = chain
  out = tmp_path / "same"
  status, stderr, stdout = _command(
    "sparsepipe.launch.export", f"--workdir={workdir}", f"--output={out}", f"--since={root}/c_full"
  )
  assert (status, stderr) == (0, [])
  lines = stdout.splitlines()
  assert lines[-2].startswith("delta of checkpoint 8 (after batch 8): ") and " 0 rows" in lines[-2]
  assert lines[-1] == (
    f"note: '{root}/c_full' holds the same 8 updates: no row changed (train on, then export the"
    " delta)"
  )


@pytest.mark.parametrize("damaged", ["arrays", "metadata"])
def test_a_damaged_newest_step_of_an_extended_job_falls_back_with_one_warning(
  chain, tmp_path, caplog, damaged
):
  """Before: export and evaluate read the config of the newest step (num_steps=8) and
  restored the newest intact one (num_steps=6), then refused the pair as "written
  with another config": num_steps may differ between a job's steps. A newest step
  whose metadata was altered stopped both: "item 'metadata' does not match its
  sha256", where the job itself goes on from the step before."""
  _, workdir = chain
  copy = tmp_path / "job"
  shutil.copytree(workdir, copy)
  if damaged == "arrays":
    for path in (copy / "checkpoints" / "8" / "arrays").rglob("ocdbt.process_0/d/*"):
      path.write_bytes(b"")
  else:
    path = copy / "checkpoints" / "8" / "metadata" / "metadata.json"
    path.write_text(path.read_text().replace('"batches_consumed": ', '"batches_consumed": 1', 1))
  info = export_checkpoint(str(copy), str(tmp_path / "export"))
  assert (info.checkpoint_step, info.batches_trained) == (6, 6)
  warning = f"Skipped checkpoint at {copy / 'checkpoints'} step 8: item '"
  assert [r.getMessage().startswith(warning) for r in caplog.records] == [True]
  step, trained, _ = evaluate_checkpoint(str(copy))
  assert (step, trained) == (6, 6)


def test_a_newest_step_deleted_before_its_config_is_read_exports_the_next(
  chain, tmp_path, monkeypatch
):
  """A running job saves and deletes its old steps while launch.export reads the
  newest: before, "[Errno 2] No such file or directory: .../checkpoints/8"."""
  _, workdir = chain
  copy = tmp_path / "job"
  shutil.copytree(workdir, copy)
  original = checkpointing.TrainingCheckpointManager.read_metadata

  def deleted_first(self, step):
    if step == 8 and (copy / "checkpoints" / "8").exists():
      shutil.rmtree(copy / "checkpoints" / "8")
    return original(self, step)

  monkeypatch.setattr(checkpointing.TrainingCheckpointManager, "read_metadata", deleted_first)
  info = export_checkpoint(str(copy), str(tmp_path / "export"))
  assert (info.checkpoint_step, info.batches_trained) == (6, 6)


def test_a_batch_whose_parts_disagree_is_named_not_broadcast_or_truncated(chain):
  """Before: float ids were truncated and scored, and ids, row lengths and dense rows
  of different counts failed inside numpy or jax.export's shape checks."""
  root, _ = chain
  predictor = serving.Predictor.load(str(root / "c_full"))
  features = predictor.info.features
  n = 4

  def batch(**change):
    sparse = {
      f["name"]: data.RaggedBatch(np.arange(n, dtype=np.int32), np.ones(n, np.int32))
      for f in features
    }
    name = features[0]["name"]
    sparse[name] = sparse[name]._replace(**change)
    dense = np.zeros((n, predictor.info.dense_dim), np.float32)
    return data.ExampleBatch(np.zeros(n, np.float32), dense, sparse)

  assert predictor.predict(batch()).shape == (n,)
  name = features[0]["name"]
  cases = [
    (
      dict(values=np.arange(n) + 0.9),
      f"feature '{name}': ids must be integers, got float64",
    ),
    (
      dict(row_lengths=np.ones(n - 1, np.int32), values=np.arange(n - 1)),
      f"feature '{name}': row_lengths of shape ({n - 1},), for {n} examples (the rows of"
      f" dense) it must be ({n},)",
    ),
    (
      dict(values=np.arange(n - 1)),
      f"feature '{name}': values of shape ({n - 1},), its row_lengths sum to {n}: it must"
      f" be ({n},)",
    ),
    (
      dict(row_lengths=np.array([2, -1, 2, 1])),
      f"feature '{name}': row_lengths must be integers >= 0, got int64",
    ),
  ]
  for change, message in cases:
    with pytest.raises(ValueError) as refused:
      predictor.predict(batch(**change))
    assert str(refused.value) == message
  with pytest.raises(TypeError) as refused:
    predictor.predict([batch()])
  assert (
    str(refused.value) == "predict takes an ExampleBatch (e.g. data.decode_batch's), not a list"
  )


def test_an_export_given_as_a_workdir_is_named_as_an_export(chain):
  """Before: "no checkpoints in 'E' (no 'E/checkpoints')"."""
  root, _ = chain
  for command in (export_checkpoint, evaluate_checkpoint):
    args = (
      (str(root / "a"), str(root / "unused"))
      if command is export_checkpoint
      else (str(root / "a"),)
    )
    with pytest.raises(ValueError) as refused:
      command(*args)
    assert str(refused.value) == (
      f"'{root / 'a'}' is an export (it has export.json), not a job's workdir: give the"
      " --workdir the job trained in"
    )


def test_a_file_given_as_a_workdir_or_dataset_is_named_a_file(tmp_path):
  """Before: "no checkpoints in 'F' (no 'F/checkpoints')" and "no manifest.json in 'F'"."""
  afile = tmp_path / "afile"
  afile.write_text("x")
  for command in (
    lambda: export_checkpoint(str(afile), str(tmp_path / "e")),
    lambda: evaluate_checkpoint(str(afile)),
  ):
    with pytest.raises(
      ValueError, match=f"^'{re.escape(str(afile))}' is a file, not a job's workdir$"
    ):
      command()
  with pytest.raises(
    data.ManifestError,
    match=f"^'{re.escape(str(afile))}' is a file, not a dataset \\(a folder with manifest.json\\)$",
  ):
    data.read_manifest(str(afile))
  assert sorted(os.listdir(tmp_path)) == ["afile"]

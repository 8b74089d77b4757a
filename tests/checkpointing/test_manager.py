"""TrainingCheckpointManager in one process: round trip, policy, refusals, corruption."""

import paths
import json
import logging
import os
import pathlib
import re
import shutil

import grain
import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import pytest

import checkpoint_toy as toy
import subprocess_harness as harness
from sparsepipe.checkpointing import CorruptCheckpointError
from sparsepipe.checkpointing import CHECKPOINT_FORMAT_VERSION
from sparsepipe.checkpointing import IncompatibleCheckpointError
from sparsepipe.checkpointing import StepNotKeptError
from sparsepipe.checkpointing import LoopPosition
from sparsepipe.checkpointing import RestoreTargets
from sparsepipe.checkpointing import RunInfo
from sparsepipe.checkpointing import TrainingCheckpointManager
from sparsepipe.checkpointing import CheckpointItems
from sparsepipe.checkpointing import abstract_of
from sparsepipe.checkpointing.integrity import corrupt
from sparsepipe.checkpointing import handlers
from sparsepipe.checkpointing import saving
from sparsepipe.core import SparseDenseMatmulInputStats
from sparsepipe.transforms import InputIterator
from sparsepipe.transforms import PreprocessedBatch

TOY = os.path.join(paths.TESTS, "checkpoint_toy.py")

# A failed read leaves TensorStore callbacks aimed at Orbax's closed event
# loop; Python reports them when they are collected. Harmless here.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

NUM_STEPS = 8
CONFIG = {"model": {"dim": 16, "vocab": 256}, "num_steps": NUM_STEPS}


class Job:
  """The toy job driven step by step in this process."""

  def __init__(self, mesh=None):
    self.mesh = mesh or toy.make_mesh()
    self.state = toy.init_state(self.mesh, NUM_STEPS)
    self.abstract = abstract_of(self.state)
    self.step_fn = toy.make_train_step(self.mesh)
    self.iterator = toy.make_iterator()
    self.fdo = {}
    self.step = 0

  def advance(self, n=1):
    for _ in range(n):
      batch = next(self.iterator)
      self.fdo = toy.update_fdo(self.fdo, batch)
      out = self.step_fn(*self.state, toy.to_device(batch, self.mesh))
      self.state = tuple(out[:3])
      self.step += 1

  def resume(self, restored):
    """Continue from a RestoredState (its iterator becomes this job's)."""
    self.iterator = restored.data_iter
    self.state = (restored.train_state, restored.embeddings, restored.pipeline_state)
    self.fdo, self.step = restored.fdo, restored.step

  def training_state(self):
    return CheckpointItems(*self.state, self.iterator, self.fdo)

  def targets(self, iterator=None):
    return RestoreTargets(*self.abstract, iterator or toy.make_iterator())


def run_info(mesh=None, config=CONFIG, workers=0, processes=None):
  return RunInfo.create(
    config,
    mesh or toy.make_mesh(),
    data_worker_count=workers,
    process_count=processes,
  )


def save(manager, job, **kwargs):
  return manager.save(job.step, job.training_state(), LoopPosition(job.step, job.step), **kwargs)


@pytest.fixture(name="pristine", scope="module")
def fixture_pristine(tmp_path_factory):
  """Steps 2 and 4 of the toy job, saved once; the job at step 4."""
  directory = tmp_path_factory.mktemp("pristine") / "ckpt"
  job = Job()
  with TrainingCheckpointManager(directory, run_info(), save_interval_steps=2) as m:
    for _ in range(4):
      job.advance()
      save(m, job)
  return directory, job


@pytest.fixture(name="saved")
def fixture_saved(pristine, tmp_path):
  """A private copy of the pristine checkpoint (tests may damage it)."""
  directory, job = pristine
  shutil.copytree(directory, tmp_path / "ckpt")
  return tmp_path / "ckpt", job


def test_restore_is_exact_with_current_shardings(saved):
  directory, job = saved
  manager = TrainingCheckpointManager(directory, run_info())
  fresh = Job()
  restored = manager.restore(fresh.targets(fresh.iterator))
  manager.close()
  assert restored.step == 4
  assert restored.metadata.progress == LoopPosition(4, 4, False)
  assert restored.relaid_out == ()
  got = (restored.train_state, restored.embeddings, restored.pipeline_state)
  toy.assert_same_trees(got, job.state)
  for x, want in zip(jax.tree.leaves(got), jax.tree.leaves(fresh.abstract)):
    assert x.sharding == want.sharding
  assert restored.fdo == json.loads(json.dumps(job.fdo))
  # The iterator continues exactly where the saved one was.
  expected = toy.make_iterator()
  for _ in range(4):
    next(expected)
  toy.assert_same_trees(next(restored.data_iter), next(expected), shardings=False)


def test_restore_of_empty_directory_is_none(tmp_path):
  with TrainingCheckpointManager(tmp_path / "none", run_info()) as manager:
    assert manager.restore(Job().targets()) is None


def test_interval_force_and_existing_steps(tmp_path):
  job = Job()
  with TrainingCheckpointManager(tmp_path / "c", run_info(), save_interval_steps=3) as manager:
    job.advance(2)
    assert not save(manager, job)  # step 2: not a multiple of 3
    assert save(manager, job, force=True)  # forced (e.g. preemption)
    job.advance()
    assert save(manager, job)  # step 3
    assert not save(manager, job, force=True)  # already saved: no-op
    manager.wait_until_finished()
    assert manager.all_steps() == [2, 3]


def test_keeps_latest_n(tmp_path):
  job = Job()
  with TrainingCheckpointManager(tmp_path / "c", run_info(), keep_latest=2) as m:
    for _ in range(4):
      job.advance()
      save(m, job)
  assert sorted(os.listdir(tmp_path / "c")) == ["3", "4"]


def test_absolute_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with TrainingCheckpointManager("rel/ckpt", run_info()) as manager:
    assert manager.directory == pathlib.Path(tmp_path, "rel", "ckpt")


@pytest.mark.parametrize(
  "current, message",
  [
    (
      run_info(config={**CONFIG, "model": {"dim": 32, "vocab": 256}}),
      "was written with another config: config.model.dim=16, current run has 32",
    ),
    (
      run_info(config={**CONFIG, "extra": "x", "num_steps": 9}),
      'was written with another config: config.extra=(unset), current run has "x";'
      " config.num_steps=8, current run has 9",
    ),
    (
      run_info(processes=2),
      "was written by 1 processes, current run has 2: a"
      " PrefetchDatasetIterator cannot take the data iterator states of 1"
      " processes",
    ),
  ],
)
def test_incompatible_run_is_refused(saved, current, message):
  directory, _ = saved
  with TrainingCheckpointManager(directory, current) as manager:
    with pytest.raises(IncompatibleCheckpointError) as info:
      manager.restore(Job().targets())
  assert str(info.value).startswith(f"checkpoint at {directory} step 4 ")
  assert message in str(info.value)
  assert manager.all_steps() == [2, 4]  # nothing skipped or moved


def test_mutable_config_keys_may_change(saved):
  directory, _ = saved
  current = run_info(config={**CONFIG, "num_steps": 100})
  with TrainingCheckpointManager(
    directory, current, mutable_config_keys=("config.num_steps",)
  ) as manager:
    assert manager.restore(Job().targets()).step == 4


def test_changed_tree_dtype_or_shape_is_refused(saved):
  directory, _ = saved
  targets = Job().targets()
  with TrainingCheckpointManager(directory, run_info()) as manager:
    bad = dict(targets.embeddings)
    bad["table"] = jax.ShapeDtypeStruct(
      bad["table"].shape, np.int32, sharding=bad["table"].sharding
    )
    with pytest.raises(
      IncompatibleCheckpointError,
      match="item 'embeddings' leaf 'table' was saved as float32, current run has int32",
    ):
      manager.restore(targets._replace(embeddings=bad))
    bad = dict(targets.embeddings)
    bad["extra"] = bad["table"]
    with pytest.raises(
      IncompatibleCheckpointError,
      match=r"only in the current run \['extra'\], only in the checkpoint \[\]",
    ):
      manager.restore(targets._replace(embeddings=bad))
    bad = dict(targets.pipeline_state)
    bad["ids"] = jax.ShapeDtypeStruct((32, 2), np.int32, sharding=bad["ids"].sharding)
    with pytest.raises(
      IncompatibleCheckpointError,
      match=r"leaf 'ids' was saved with shape \(16, 2\), current run has"
      r" \(32, 2\)",
    ):
      manager.restore(targets._replace(pipeline_state=bad))


def test_target_without_sharding_is_an_error(saved):
  directory, _ = saved
  targets = Job().targets()
  bare = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), targets.embeddings)
  with TrainingCheckpointManager(directory, run_info()) as manager:
    with pytest.raises(ValueError, match="item 'embeddings' leaf 'accumulator' has no sharding"):
      manager.restore(targets._replace(embeddings=bare))


def _table_file(step_dir):
  """The largest value file of the arrays: the embedding table's chunks."""
  files = sorted((step_dir / "arrays").rglob("ocdbt.process_0/d/*"))
  return max(files, key=lambda f: f.stat().st_size)


def _array_files(step_dir):
  """Every OCDBT node and value file of the arrays (small values are inline)."""
  return sorted((step_dir / "arrays").rglob("d/*"))


def _garble(path, offset=None):
  data = bytearray(path.read_bytes())
  offset = len(data) // 2 if offset is None else offset
  for i in range(offset, min(offset + 8, len(data))):
    data[i] ^= 0x5A
  path.write_bytes(bytes(data))


def _garble_table_values(step_dir):
  """Garbles 8 bytes of the table's values in `step_dir` so that only their
  fingerprint can tell; returns the message of restoring that step.

  The table's chunks are compressed: 8 garbled bytes at the middle of the
  value file may break a chunk's framing instead, which fails the read itself
  ("reading failed"), or land where no restored array reads (a value file of
  16 MiB holds several arrays' chunks, in the order the save's writes landed:
  the step then restores unchanged; the whole second half once held none of
  the table's). Then the garble tries 32 places spread over the whole file,
  nearest the middle first.
  """
  table = _table_file(step_dir)
  original, errors = table.read_bytes(), []
  middle, step = len(original) // 2, max(64, len(original) // 32)
  offsets = sorted(range(8, len(original) - 8, step), key=lambda o: abs(o - middle))
  for offset in offsets[:32]:
    table.write_bytes(original)
    _garble(table, offset)
    try:
      with TrainingCheckpointManager(step_dir.parent, run_info()) as manager:
        manager.restore(Job().targets(), step=int(step_dir.name))
      errors.append(f"offset {offset}: restored unchanged")
    except CorruptCheckpointError as error:
      errors.append(str(error))
      if "reading failed" not in errors[-1]:
        return errors[-1]
  raise AssertionError(f"no garble of {table} reached only the table's values: {errors}")


def _truncate(path):
  path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _bump_first_number(path):
  text = path.read_text()
  match = re.search(r": (\d+)", text)
  path.write_text(text[: match.start(1)] + str(int(match.group(1)) + 1) + text[match.end(1) :])


def _replace_json(path, old, new):
  text = path.read_text()
  assert old in text, text
  path.write_text(text.replace(old, new, 1))


CORRUPTIONS = {
  "garbled table data": (
    _garble_table_values,
    "item 'embeddings' leaf '",
  ),
  "truncated array data": (
    lambda d: [_truncate(f) for f in _array_files(d)],
    "array metadata is unreadable (ValueError: OUT_OF_RANGE",
  ),
  "missing item": (
    lambda d: shutil.rmtree(d / "fdo"),
    "item(s) ['fdo'] missing",
  ),
  "garbled iterator state": (
    lambda d: _replace_json(
      d / "data_iter" / "process_0-of-1.json", '"next_index": 4', '"next_index": 5'
    ),
    "item 'data_iter' file process_0-of-1.json does not match the digest",
  ),
  "garbled fdo value": (
    lambda d: _replace_json(d / "fdo" / "metadata", '"ids_seen": 128', '"ids_seen": 129'),
    "item 'fdo' does not match the digest",
  ),
  "garbled metadata": (
    lambda d: _replace_json(
      d / "metadata" / "metadata.json", '"batches_consumed": 4', '"batches_consumed": 3'
    ),
    "item 'metadata' does not match its sha256",
  ),
  "truncated metadata": (
    lambda d: _truncate(d / "metadata" / "metadata.json"),
    "item 'metadata' is unreadable (JSONDecodeError",
  ),
  "garbled fingerprint file": (
    lambda d: _bump_first_number(d / "metadata" / "fingerprints.process_0.json"),
    "item 'metadata' file fingerprints.process_0.json does not match its sha256",
  ),
  "missing fingerprint file": (
    lambda d: (d / "metadata" / "fingerprints.process_0.json").unlink(),
    "item 'metadata' file fingerprints.process_0.json is unreadable (FileNotFoundError",
  ),
  "truncated array metadata": (
    lambda d: _truncate(d / "arrays" / "_METADATA"),
    "is unreadable",
  ),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_corrupt_latest_step_falls_back_to_previous(saved, kind, caplog):
  directory, _ = saved
  corrupt, reason = CORRUPTIONS[kind]
  corrupt(directory / "4")
  with TrainingCheckpointManager(directory, run_info()) as manager:
    with caplog.at_level(logging.WARNING):
      restored = manager.restore(Job().targets())
    assert restored.step == 2
    assert manager.all_steps() == [2]
    # One warning line: the step, the item and the reason, where it went.
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.startswith(f"Skipped checkpoint at {directory} step 4: ")
    assert warning.endswith(f"; moved it to {directory}/4.corrupt")
    assert "\n" not in warning
    assert reason in warning
  # The corrupt step is kept, renamed, out of the way of new saves.
  assert sorted(os.listdir(directory)) == ["2", "4.corrupt"]
  reference = Job()
  reference.advance(2)
  toy.assert_same_trees(
    (restored.train_state, restored.embeddings, restored.pipeline_state),
    reference.state,
  )


def test_interrupted_save_directory_is_ignored(saved):
  directory, _ = saved
  tmp = directory / "6.orbax-checkpoint-tmp"
  (tmp / "arrays").mkdir(parents=True)
  (tmp / "arrays" / "junk").write_bytes(b"\x00" * 10)
  with TrainingCheckpointManager(directory, run_info()) as manager:
    assert manager.all_steps() == [2, 4]
    assert manager.restore(Job().targets()).step == 4


def test_every_step_corrupt_raises_and_moves_nothing(saved):
  directory, _ = saved
  for step in ("2", "4"):
    for path in _array_files(directory / step):
      _garble(path)
  with TrainingCheckpointManager(directory, run_info()) as manager:
    with pytest.raises(CorruptCheckpointError, match=f"no restorable checkpoint in {directory}: "):
      manager.restore(Job().targets())
  assert sorted(os.listdir(directory)) == ["2", "4"]


def test_explicit_corrupt_step_raises(saved):
  directory, _ = saved
  _garble_table_values(directory / "2")
  with TrainingCheckpointManager(directory, run_info()) as manager:
    with pytest.raises(
      CorruptCheckpointError, match=f"checkpoint at {directory} step 2: item 'embeddings'"
    ):
      manager.restore(Job().targets(), step=2)
    assert manager.restore(Job().targets(), step=4).step == 4


def test_unreadable_item_is_named_when_reading_fails(saved):
  # Regression: a read error inside Orbax (here a truncated value file) was
  # reported as "reading failed" without the item, so the message depended
  # on whether garbled bytes broke decoding or only the values.
  directory, _ = saved
  _truncate(_table_file(directory / "2"))
  with TrainingCheckpointManager(directory, run_info()) as manager:
    with pytest.raises(
      CorruptCheckpointError,
      match=f"checkpoint at {directory} step 2: item 'embeddings': reading failed",
    ):
      manager.restore(Job().targets(), step=2)


def test_saving_after_fallback_reuses_the_step_number(saved):
  directory, _ = saved
  _garble_table_values(directory / "4")
  job = Job()
  with TrainingCheckpointManager(directory, run_info(), save_interval_steps=2) as manager:
    job.resume(manager.restore(job.targets(job.iterator)))
    job.advance(2)
    assert save(manager, job)
  with TrainingCheckpointManager(directory, run_info()) as manager:
    assert manager.all_steps() == [2, 4]
    assert manager.restore(Job().targets()).step == 4
  assert sorted(os.listdir(directory)) == ["2", "4", "4.corrupt"]


def test_a_read_only_manager_changes_nothing(saved, caplog):
  directory, job = saved
  _garble_table_values(directory / "4")
  (directory / "6.orbax-checkpoint-tmp" / "arrays").mkdir(parents=True)
  with TrainingCheckpointManager(directory, run_info(), read_only=True) as manager:
    with caplog.at_level(logging.WARNING):
      assert manager.restore(Job().targets()).step == 2
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.startswith(f"Skipped checkpoint at {directory} step 4: item 'embeddings' ")
    assert "moved" not in warning
    with pytest.raises(ValueError, match=f"^{directory} was opened read-only; step 4 not saved$"):
      save(manager, job, force=True)
  assert sorted(os.listdir(directory)) == ["2", "4", "6.orbax-checkpoint-tmp"]


def test_a_reader_listing_a_step_deleted_meanwhile_logs_no_orbax_warning(saved, caplog):
  # Reading a running job (launch.export, evaluate) printed Orbax's "Metadata file does
  # not exist: .../4/_CHECKPOINT_METADATA" when the job deleted a step being listed;
  # here the file is gone, as it is between the listing and its read.
  directory, _ = saved
  (directory / "4" / "_CHECKPOINT_METADATA").unlink()
  with caplog.at_level(logging.WARNING):
    with TrainingCheckpointManager(directory, run_info(), read_only=True) as manager:
      assert manager.all_steps() == [2, 4]
  assert [r.getMessage() for r in caplog.records] == []


def test_a_step_deleted_while_it_is_read_is_named_so(saved, caplog):
  # A running job deletes its old steps while a reader (launch.evaluate)
  # reads them: that is not corruption.
  directory, _ = saved

  def targets(meta):
    if meta.progress.pipeline_step == 4:
      shutil.rmtree(directory / "4")
    return Job().targets()

  with TrainingCheckpointManager(directory, run_info(), read_only=True) as manager:
    with caplog.at_level(logging.WARNING):
      assert manager.restore(targets).step == 2
  (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert warning == (
    f"Skipped checkpoint at {directory} step 4 was deleted while it was read (a job"
    " writing this directory keeps only its newest steps)"
  )


def test_read_metadata(saved):
  directory, _ = saved
  with TrainingCheckpointManager(directory, run_info()) as manager:
    meta = manager.read_metadata(2)
  assert meta.progress == LoopPosition(2, 2, False)
  assert meta.run == run_info()


def test_a_step_not_kept_is_named_with_the_steps_kept(saved):
  directory, _ = saved
  message = (
    f"{directory} holds no step 3: the steps kept are 2, 4 (a job keeps its newest"
    " checkpoint.keep steps)"
  )
  with TrainingCheckpointManager(directory, run_info(), read_only=True) as manager:
    with pytest.raises(StepNotKeptError) as read:
      manager.read_metadata(3)
    with pytest.raises(StepNotKeptError) as restored:
      manager.restore(Job().targets(), step=3)
  assert str(read.value) == str(restored.value) == message


GOLDEN = pathlib.Path(paths.GOLDEN)


def _leaves_by_keystr(tree):
  return {
    jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def test_format2_steps_still_restore_exactly(tmp_path):
  # Step 4 of the `pristine` job as sparsepipe 0.2.0 wrote it (format 2: one
  # Orbax item per array item), with its arrays and next batch as numpy.
  directory = tmp_path / "ckpt"
  shutil.copytree(GOLDEN / "checkpoint_format2", directory)
  expected = dict(np.load(GOLDEN / "checkpoint_format2_expected.npz"))
  next_batch_index = expected.pop("next_batch_index")
  job = Job()
  with TrainingCheckpointManager(directory, run_info(), save_interval_steps=2) as manager:
    restored = manager.restore(job.targets(job.iterator))
    assert (restored.step, restored.metadata.format_version) == (4, 2)
    got = _leaves_by_keystr((restored.train_state, restored.embeddings, restored.pipeline_state))
    assert sorted(got) == sorted(expected)
    for path, value in got.items():
      np.testing.assert_array_equal(value, expected[path], err_msg=path)
    assert restored.fdo == {
      "limits": {"toy_stack": {"max_ids_per_partition": 64}},
      "stats": {"max_id": 255, "ids_seen": 128},
    }
    # Training on saves the current format beside the old step.
    job.resume(restored)
    job.advance(2)
    assert save(manager, job)
  with TrainingCheckpointManager(directory, run_info()) as manager:
    assert manager.all_steps() == [4, 6]
    assert manager.read_metadata(6).format_version == CHECKPOINT_FORMAT_VERSION
    items = sorted(p.name for p in (directory / "6").iterdir() if p.is_dir())
    assert items == ["arrays", "data_iter", "fdo", "metadata"]
    old = manager.restore(Job().targets(), step=4)
    np.testing.assert_array_equal(next(old.data_iter)["index"], next_batch_index)
    restored = manager.restore(Job().targets())
  assert restored.step == 6
  toy.assert_same_trees(
    (restored.train_state, restored.embeddings, restored.pipeline_state), job.state
  )


def test_saving_without_fingerprints_restores_unverified(tmp_path):
  job = Job()
  job.advance(2)
  with TrainingCheckpointManager(tmp_path / "c", run_info(), fingerprint_arrays=False) as manager:
    save(manager, job)
  body = json.loads((tmp_path / "c" / "2" / "metadata" / "metadata.json").read_text())
  assert body["integrity"]["fingerprints"] is None
  with TrainingCheckpointManager(tmp_path / "c", run_info()) as manager:
    restored = manager.restore(job.targets())
  toy.assert_same_trees(
    (restored.train_state, restored.embeddings, restored.pipeline_state),
    job.state,
  )


def _pipeline_iterator(dataset, batch=16):
  """An InputIterator over the toy batches (its state carries the dataset
  fingerprint and the batch size)."""
  no_stats = SparseDenseMatmulInputStats({}, {}, {}, {})
  toy_batches = grain.MapDataset.range(toy.NUM_EXAMPLES).map(toy.example).batch(toy.BATCH)
  return InputIterator(
    toy_batches.map(lambda batch: PreprocessedBatch(batch, no_stats)),
    lambda ds: ds.to_iter_dataset(),
    place=None,
    metadata={"dataset": dataset, "per_host_batch_size": batch},
    output=lambda element: element.batch,
  )


@pytest.fixture(name="saved_with_dataset")
def fixture_saved_with_dataset(tmp_path):
  job = Job()
  job.iterator = _pipeline_iterator("0123456789abcdef")
  with TrainingCheckpointManager(tmp_path / "c", run_info(), save_interval_steps=2) as m:
    for _ in range(4):
      job.advance()
      save(m, job)
  return tmp_path / "c", job


def test_replaced_dataset_is_reported_and_nothing_is_moved(saved_with_dataset, caplog):
  directory, job = saved_with_dataset
  with TrainingCheckpointManager(directory, run_info()) as manager:
    with caplog.at_level(logging.WARNING):
      with pytest.raises(IncompatibleCheckpointError) as info:
        manager.restore(job.targets(_pipeline_iterator("fedcba9876543210")))
  assert str(info.value) == (
    f"checkpoint at {directory} step 4: the dataset changed: the data iterator"
    " state was saved reading dataset 0123456789abcdef, the data now is dataset"
    " fedcba9876543210; restore with the original data, or train on the new data"
    " in a new workdir (the checkpoint is left as it is)"
  )
  assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
  assert sorted(os.listdir(directory)) == ["2", "4"]
  with TrainingCheckpointManager(directory, run_info()) as manager:
    assert manager.restore(job.targets(_pipeline_iterator("0123456789abcdef"))).step == 4


def test_other_iterator_mismatch_is_incompatible_not_corrupt(saved_with_dataset):
  directory, job = saved_with_dataset
  with TrainingCheckpointManager(directory, run_info()) as manager:
    with pytest.raises(IncompatibleCheckpointError) as info:
      manager.restore(job.targets(_pipeline_iterator("0123456789abcdef", batch=32)))
  assert str(info.value) == (
    f"checkpoint at {directory} step 4: data iterator state was saved with"
    " per_host_batch_size=16, but this pipeline has per_host_batch_size=32"
  )
  assert sorted(os.listdir(directory)) == ["2", "4"]


def test_corrupt_step_prints_one_warning_line_and_nothing_else(tmp_path):
  # Regression: a garbled step printed ~140 lines of TensorStore spec (Orbax's
  # error log) and "Event loop is closed" / discarded coroutine tracebacks.
  workdir = tmp_path / "ckpt"
  command = harness.python_command(
    TOY,
    "--workdir",
    str(workdir),
    "--out",
    str(tmp_path / "out.npz"),
    "--num_steps",
    "10",
    "--save_every",
    "5",
  )
  env = harness.cpu_env()
  assert harness.run(command, env=env).returncode == 0
  # Every value file emptied: a value file of 16 MiB holds several arrays' chunks, in
  # the order the writes landed, so half of the largest one may hold none of the table's.
  for path in (workdir / "10" / "arrays").rglob("ocdbt.process_0/d/*"):
    path.write_bytes(b"")
  result = harness.run(command, env=env)
  assert result.returncode == 0, result.describe()
  lines = result.stderr.splitlines()
  assert len(lines) == 1, result.describe()  # once 2+ lines in CI, not seen since
  (line,) = lines
  assert re.fullmatch(
    re.escape(f"WARNING:absl:Skipped checkpoint at {workdir} step 10: item '")
    + r"\w+': reading failed \(.+\)"
    + re.escape(f"; moved it to {workdir}/10.corrupt"),
    line,
  ), line
  assert "restored 5" in result.lines


def test_unretrieved_failures_of_a_failed_reads_sibling_tasks_are_not_logged(caplog):
  # Regression (seen on a loaded machine): besides the one warning line, asyncio
  # logged "Task exception was never retrieved" with TensorStore's spec for a
  # sibling read task of the failed read, whenever that task was collected.
  with corrupt.quiet_reads():
    pass
  spec = ValueError("OUT_OF_RANGE: Error reading \"a/.zarray\" [tensorstore_spec='{}']")
  # ... or, seen once in CI since, a Future whose error has no spec, only its database.
  ocdbt = ValueError('DATA_LOSS: Error reading "t/0" in OCDBT database at local file "/w/10/"')
  other = ValueError("something else")
  with caplog.at_level(logging.ERROR, logger="asyncio"):
    for error in (spec, ocdbt, other):
      try:
        raise error
      except ValueError as e:
        logging.getLogger("asyncio").error("Task exception was never retrieved", exc_info=e)
  assert [r.exc_info[1] for r in caplog.records] == [other]


@pytest.mark.parametrize("fingerprint_arrays", [True, False])
def test_non_array_leaf_is_refused_before_saving(tmp_path, fingerprint_arrays):
  job = Job()
  job.advance()
  state = job.training_state()._replace(pipeline_state={"count": 3})
  with TrainingCheckpointManager(
    tmp_path / "c", run_info(), fingerprint_arrays=fingerprint_arrays
  ) as manager:
    with pytest.raises(
      ValueError,
      match="^item 'pipeline_state' leaf 'count' is a int; checkpointed trees hold"
      r" arrays \(jax.Array or numpy\) only$",
    ):
      manager.save(1, state, LoopPosition(1, 1))
    assert manager.all_steps() == []


def test_failure_after_the_host_copy_abandons_the_save_without_hanging(tmp_path, monkeypatch):
  # The metadata commit waits for the host shards; a save() that fails before
  # handing them over must release it, and the step must not be finalized.
  job = Job()
  job.advance()

  def fail(state):
    raise RuntimeError("boom")

  monkeypatch.setattr(saving, "take_shards", fail)
  manager = TrainingCheckpointManager(tmp_path / "c", run_info())
  with pytest.raises(RuntimeError, match="^boom$"):
    save(manager, job, force=True)
  with pytest.raises(RuntimeError, match="the save was abandoned before its arrays were copied"):
    manager.close()
  with TrainingCheckpointManager(tmp_path / "c", run_info()) as manager:
    assert manager.all_steps() == []


def test_synchronous_save_is_fingerprinted_and_verified(tmp_path):
  job = Job()
  job.advance(2)
  with TrainingCheckpointManager(tmp_path / "c", run_info(), async_save=False) as manager:
    assert save(manager, job)
    assert manager.all_steps() == [2]  # written before save() returned
  step_dir = tmp_path / "c" / "2"
  body = json.loads((step_dir / "metadata" / "metadata.json").read_text())
  assert body["integrity"]["fingerprints"] == "partial_sums"
  assert "item 'embeddings' leaf '" in _garble_table_values(step_dir)


def test_zero_size_arrays_are_left_out_and_restored_as_zeros(tmp_path):
  """Orbax cannot write an array with no elements (the dense features of data
  that has none are [batch, 0]): saved as None, restored as zeros."""
  job = Job()
  job.advance()
  mesh = job.mesh
  empty = jax.device_put(np.zeros((16, 0), np.float32), NamedSharding(mesh, P("data")))
  state = job.training_state()._replace(pipeline_state={"kept": job.state[2], "dense": empty})
  with TrainingCheckpointManager(tmp_path / "ckpt", run_info()) as manager:
    assert manager.save(1, state, LoopPosition(1, 1), force=True)
  targets = job.targets()._replace(
    pipeline_state={"kept": job.abstract[2], "dense": abstract_of(empty)}
  )
  with TrainingCheckpointManager(tmp_path / "ckpt", run_info()) as manager:
    restored = manager.restore(targets)
  assert restored.pipeline_state["dense"].shape == (16, 0)
  assert restored.pipeline_state["dense"].sharding == empty.sharding
  toy.assert_same_trees(restored.pipeline_state["kept"], job.state[2])


def _handler_arguments(monkeypatch) -> list[dict]:
  """The keyword arguments of every Orbax PyTreeCheckpointHandler made from now on."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

  made = []
  handler = ocp.PyTreeCheckpointHandler

  def recorded(*args, **kwargs):
    made.append(kwargs)
    return handler(*args, **kwargs)

  monkeypatch.setattr(ocp, "PyTreeCheckpointHandler", recorded)
  return made


def test_bounded_host_copies_save_the_same_checkpoint(tmp_path, monkeypatch):
  # host_copy_gb hands Orbax its device-to-host bound; a save in batches of
  # at most 1 kB (every array its own batch) restores exactly, fingerprints checked.
  made = _handler_arguments(monkeypatch)
  job = Job()
  job.advance(2)
  with TrainingCheckpointManager(tmp_path / "ckpt", run_info(), host_copy_gb=1e-6) as m:
    save(m, job)
  bounds = [kwargs.get("save_device_host_concurrent_gb") for kwargs in made]
  assert bounds and set(bounds) == {1e-6}
  with TrainingCheckpointManager(tmp_path / "ckpt", run_info()) as m:
    restored = m.restore(Job().targets())
  bounds = [kwargs.get("save_device_host_concurrent_gb") for kwargs in made]
  assert set(bounds[len(bounds) // 2 :]) == {None}  # the default: no bound
  toy.assert_same_trees(
    (restored.train_state, restored.embeddings, restored.pipeline_state), job.state
  )
  with pytest.raises(ValueError, match=r"host_copy_gb=-1.0 must be >= 0 \(0: no bound\)"):
    TrainingCheckpointManager(tmp_path / "other", run_info(), host_copy_gb=-1.0)


def test_in_flight_bytes_bound_saves_and_restores(tmp_path, monkeypatch):
  # Without a restore bound Orbax reads every shard at once, holding what it read
  # beside the arrays it makes (benchmarks/memory.py, the resumed rows).
  made = _handler_arguments(monkeypatch)
  job = Job()
  job.advance(2)
  with TrainingCheckpointManager(tmp_path / "ckpt", run_info(), in_flight_bytes=2**28) as m:
    save(m, job)
  with TrainingCheckpointManager(tmp_path / "ckpt", run_info(), in_flight_bytes=2**28) as m:
    restored = m.restore(job.targets())
  bounds = [
    (kwargs.get("save_concurrent_gb"), kwargs.get("restore_concurrent_gb")) for kwargs in made
  ]
  assert bounds and set(bounds) == {(2**28 / 1e9, 2**28 / 1e9)}
  toy.assert_same_trees(
    (restored.train_state, restored.embeddings, restored.pipeline_state), job.state
  )


def test_in_flight_bound_is_twice_the_largest_shard():
  from sparsepipe.checkpointing import in_flight_bound  # pylint: disable=import-outside-toplevel

  mesh = toy.make_mesh()
  rows = NamedSharding(mesh, P(mesh.axis_names[0]))
  n = mesh.devices.size
  big = jax.ShapeDtypeStruct((n * 2**22, 16), np.float32, sharding=rows)  # 256 MiB a shard
  small = jax.ShapeDtypeStruct((4, 4), np.float32, sharding=NamedSharding(mesh, P()))
  assert in_flight_bound({"a": big, "b": small}) == 2 * 2**22 * 16 * 4
  # at least 256 MiB, so that a save of small arrays is not cut into tiny writes
  assert in_flight_bound({"b": small, "c": np.zeros((3,), np.int32)}) == 256 << 20


def _data_file_sizes(directory: pathlib.Path) -> list[int]:
  """Sizes of the OCDBT data files (in `d/` folders) under `directory`."""
  return sorted(p.stat().st_size for p in directory.rglob("*") if p.parent.name == "d")


def test_chunks_of_shards_without_a_divisor_near_the_target_are_not_tiny():
  # Orbax's chunks divide the shard: the criteo stack at 4x on 8 devices has shards of
  # 2**6 * 45413 rows, cut into 64-row (4 KiB) chunks for 2 MiB files (1.4 million
  # chunks per array; the job's save held ~0.9 GB more). The next larger chunk instead.
  from orbax.checkpoint._src.arrays import subchunking

  def orbax_chunk(global_shape, write_shape, mb, dtype=np.float32):
    size = handlers.chunk_byte_size(global_shape, write_shape, dtype, int(mb * 2**20))
    return subchunking.choose_chunk_shape(global_shape, write_shape, np.dtype(dtype), size)

  assert tuple(orbax_chunk((23251456, 16), (2906432, 16), 2)) == (45413, 16)  # 2.9 MB
  assert tuple(orbax_chunk((5812864, 16), (726608, 16), 2)) == (45413, 16)  # 1x: 16 rows
  assert tuple(orbax_chunk((5812864, 16), (726608, 16), 16)) == (181652, 16)  # as Orbax
  assert tuple(orbax_chunk((23251456,), (2906432,), 2, np.int32)) == (363304,)  # as Orbax
  assert tuple(orbax_chunk((8 * 514, 1024), (514, 1024), 1)) == (257, 1024)  # not (2, 1024)
  assert handlers.chunk_byte_size((4096, 13), (512, 13), np.float32, 2**20) == 2**20


def test_a_save_of_shards_without_small_divisors_restores_exactly(tmp_path):
  job = Job()
  job.advance(2)
  devices = job.mesh.size
  rows = NamedSharding(job.mesh, P(job.mesh.axis_names[0]))
  # Shards of 2 * 257 rows of 4 KiB (257 is prime): Orbax alone writes 2-row chunks.
  table = np.random.default_rng(0).random((devices * 514, 1024), np.float32)
  job.state = (job.state[0], {**job.state[1], "table": jax.device_put(table, rows)}, job.state[2])
  job.abstract = abstract_of(job.state)
  with TrainingCheckpointManager(tmp_path, run_info(), data_file_mb=1.0) as m:
    save(m, job)
  with TrainingCheckpointManager(tmp_path, run_info()) as m:
    restored = m.restore(job.targets())
  toy.assert_same_trees(
    (restored.train_state, restored.embeddings, restored.pipeline_state), job.state
  )
  # Chunks of 257 rows (1.05 MB), at most one a file.
  assert _saved_chunks(tmp_path / "2" / "arrays", "embeddings.table") == [257, 1024]
  assert max(_data_file_sizes(tmp_path)) <= 2 * 257 * 4096


def _saved_chunks(item: pathlib.Path, array: str) -> list[int]:
  """The chunk shape of `array` in an OCDBT array item (its zarr metadata)."""
  import tensorstore as ts

  kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{item}"}).result()
  return json.loads(kv.read(f"{array}/.zarray").result().value)["chunks"]


def test_a_save_writes_data_files_of_about_data_file_mb(tmp_path):
  # TensorStore holds a data file's bytes in memory until it writes the file, so
  # the files' size bounds a save's host memory; Orbax's own default is 2 GiB.
  job = Job()
  job.advance(2)
  rows = NamedSharding(job.mesh, P(job.mesh.axis_names[0]))
  table = np.random.default_rng(0).random((2**18, 16), np.float32)  # 16 MiB
  job.state = (job.state[0], {**job.state[1], "table": jax.device_put(table, rows)}, job.state[2])
  job.abstract = abstract_of(job.state)
  sizes = {}
  for mb in (2048.0, 1.0):
    with TrainingCheckpointManager(tmp_path / str(mb), run_info(), data_file_mb=mb) as m:
      save(m, job)
    sizes[mb] = _data_file_sizes(tmp_path / str(mb))
  # Orbax's default: a file of most of the table (a few of several MiB when the writes
  # of a loaded machine come apart: 5.4 MiB the largest once in CI).
  assert max(sizes[2048.0]) > 4 * 2**20
  assert max(sizes[1.0]) <= 2 * 2**20  # a file ends once it holds 1 MiB of chunks
  with TrainingCheckpointManager(tmp_path / "1.0", run_info()) as m:
    restored = m.restore(job.targets())
  toy.assert_same_trees(
    (restored.train_state, restored.embeddings, restored.pipeline_state), job.state
  )
  with pytest.raises(ValueError, match=r"^data_file_mb=0.5 must be >= 1 \(MiB\)$"):
    TrainingCheckpointManager(tmp_path / "other", run_info(), data_file_mb=0.5)

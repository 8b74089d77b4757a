"""Data iterator states of N processes continued on M (issue 9): states and checkpoint files."""

import copy
import json

import grain
import numpy as np
import pytest

from sparsepipe import checkpointing
from sparsepipe import core
from sparsepipe import data
from sparsepipe import transforms as T
from sparsepipe.checkpointing.integrity import digests as integrity

S = 2
GLOBAL_DEVICES = 4
GLOBAL_BATCH = 16
PER_RECORD = 2
NUM_EXAMPLES = 100  # 50 records: 6 global batches of 8 records per epoch, 2 left out
FEATURES = (
  data.SyntheticFeature("a", 40, 1, 3),
  data.SyntheticFeature("b", 24, 0, 4, weighted=True),
)
# Small enough that some ids are dropped (allow_id_dropping), so drop counters move.
LIMIT = 1


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("resize") / "ds")
  data.write_synthetic(
    path,
    FEATURES,
    num_examples=NUM_EXAMPLES,
    num_dense=2,
    seed=5,
    examples_per_record=PER_RECORD,
    max_records_per_shard=16,
  )
  return path


def make_specs():
  specs = {}
  for f in FEATURES:
    table = core.TableSpec(
      f"t_{f.name}",
      f.vocab_size,
      8,
      max_ids_per_partition=LIMIT,
      max_unique_ids_per_partition=LIMIT,
    )
    specs[f.name] = core.FeatureSpec(f.name, table, (GLOBAL_BATCH, 4), (GLOBAL_BATCH, 8))
  return T.prepare_feature_specs_for_training(specs, GLOBAL_DEVICES, S)


def hosts(path, count, num_workers=0):
  """`count` simulated hosts sharing GLOBAL_DEVICES devices and the global batch."""
  config = T.InputConfig(
    path,
    GLOBAL_BATCH // count,
    seed=3,
    num_sc_per_device=S,
    num_workers=num_workers,
    allow_id_dropping=True,
  )
  return [
    T.make_host_pipeline(
      config,
      make_specs(),
      local_device_count=GLOBAL_DEVICES // count,
      global_device_count=GLOBAL_DEVICES,
      process_index=i,
      process_count=count,
    )
    for i in range(count)
  ]


def take(iterators, n):
  """n global batches: per batch, every host's PreprocessedBatch in host order."""
  return [[next(it) for it in iterators] for _ in range(n)]


def assert_same_batches(got, want):
  assert len(got) == len(want)
  for got_hosts, want_hosts in zip(got, want):
    assert len(got_hosts) == len(want_hosts)
    for g, w in zip(got_hosts, want_hosts):
      np.testing.assert_array_equal(g.batch.labels, w.batch.labels)
      np.testing.assert_array_equal(g.batch.dense, w.batch.dense)
      assert len(g.batch.sparse) == len(w.batch.sparse)
      for g_part, w_part in zip(g.batch.sparse, w.batch.sparse):
        assert sorted(g_part) == sorted(w_part)
        for stack in w_part:
          np.testing.assert_array_equal(g_part[stack], w_part[stack])


def close(iterators):
  for it in iterators:
    getattr(it, "close", lambda: None)()


@pytest.mark.parametrize("old, new", [(4, 1), (1, 2), (2, 4), (2, 1)])
@pytest.mark.parametrize("first", [2, 5])  # 5 + 4 batches cross an epoch boundary
def test_converted_states_continue_like_an_uninterrupted_run(dataset, old, new, first):
  saved_run = hosts(dataset, old)
  take(saved_run, first)
  saved = [it.get_state() for it in saved_run]
  states = T.resize_iterator_states(saved, new, examples_per_record=PER_RECORD)
  resumed = hosts(dataset, new)
  for it, state in zip(resumed, states):
    assert state["metadata"] == it.metadata
    it.set_state(state)
  uninterrupted = hosts(dataset, new)
  take(uninterrupted, first)
  # Same FDO maxima per device, same batch count, drops and corrupt counts kept in total.
  for it, want in zip(resumed, uninterrupted):
    got_totals, want_totals = it.stats_totals(), want.stats_totals()
    assert got_totals.batches == want_totals.batches == first
    for field, stacks in want_totals.maxima.items():
      assert sorted(got_totals.maxima[field]) == sorted(stacks)
      for stack, values in stacks.items():
        np.testing.assert_array_equal(got_totals.maxima[field][stack], values)
  for stack in make_specs():
    drops = [it.stats_totals().id_drops[f"t_{stack}"] for it in resumed]
    want = [it.stats_totals().id_drops[f"t_{stack}"] for it in uninterrupted]
    assert sum(drops) == sum(want) > 0
    assert drops[1:] == [0] * (new - 1)
  assert_same_batches(take(resumed, 4), take(uninterrupted, 4))


def test_unchanged_count_with_two_workers_is_the_saved_state(dataset):
  uninterrupted = hosts(dataset, 2, num_workers=2)
  take(uninterrupted, 3)
  saved = [it.get_state() for it in uninterrupted]
  resumed = hosts(dataset, 2, num_workers=2)
  try:
    for it in resumed:
      state = T.resize_iterator_state(saved[::-1], it.metadata, examples_per_record=PER_RECORD)
      assert state == saved[it.metadata["process_index"]]
      it.set_state(state)
    assert_same_batches(take(resumed, 3), take(uninterrupted, 3))
  finally:
    close(resumed)
    close(uninterrupted)


def test_reset_stats_maxima_on_conversion_keeps_position_and_counters(dataset):
  saved_run = hosts(dataset, 2)
  take(saved_run, 3)
  saved = [it.get_state() for it in saved_run]
  (state,) = T.resize_iterator_states(
    saved, 1, examples_per_record=PER_RECORD, reset_stats_maxima=True
  )
  totals = T.StatsTotals.from_state(state["pipeline"]["totals"])
  assert totals.batches == 3
  assert totals.maxima == {field: {} for field in totals.maxima}
  assert totals.id_drops == {
    stack: sum(it.stats_totals().id_drops[stack] for it in saved_run) for stack in ("t_a", "t_b")
  }
  # Unchanged process count: the saved state with empty maxima.
  same = T.resize_iterator_states(saved, 2, examples_per_record=PER_RECORD, reset_stats_maxima=True)
  for got, want in zip(same, saved):
    assert got["pipeline"]["parent"] == want["pipeline"]["parent"]
    assert got["pipeline"]["totals"]["max_ids_per_partition"] == {}


def saved_states(dataset, count=2, batches=3):
  run = hosts(dataset, count)
  take(run, batches)
  return [it.get_state() for it in run]


def error(message):
  return pytest.raises(T.IteratorStateMismatchError, match=message)


def test_workers_with_another_process_count_are_refused(dataset):
  saved = saved_states(dataset)
  for state in saved:  # as saved with 2 workers (their positions are not read)
    state["metadata"]["num_workers"] = 2
  with error(
    r"with num_workers=2 each process's batches interleave its workers' record"
    r" streams, so a data position of 2 processes has no equivalent on 1: resume"
    r" on 2 processes \(or train with data.num_workers=0 to change the process"
    r" count\)"
  ):
    T.resize_iterator_states(saved, 1, examples_per_record=PER_RECORD)


def test_another_worker_count_is_refused(dataset):
  saved = saved_states(dataset)
  target = dict(saved[0]["metadata"], num_workers=2)
  with error(
    r"data iterator state of process 0 was saved with num_workers=0, but this"
    r" pipeline has num_workers=2: batches depend on the worker count, restore"
    r" with the same num_workers"
  ):
    T.resize_iterator_state(saved, target, examples_per_record=PER_RECORD)


def test_another_global_batch_is_refused(dataset):
  saved = saved_states(dataset)
  target = dict(saved[0]["metadata"], process_index=0, process_count=1)
  with error(
    r"the checkpoint's global batch is 16 \(2 processes x 8\), but this job's is 8"
    r" \(1 x 8\): resume with global_batch_size=16"
  ):
    T.resize_iterator_state(saved, target, examples_per_record=PER_RECORD)


def test_batches_that_are_not_whole_records_are_refused(dataset):
  saved = saved_states(dataset)
  with error(
    r"the saved per_host_batch_size=8 is not a multiple of the dataset's"
    r" examples_per_record=3: hosts then read strided records, so the data"
    r" position depends on the process count; resume on the saved number of"
    r" processes"
  ):
    T.resize_iterator_states(saved, 1, examples_per_record=3)
  with error(
    r"the new per_host_batch_size=2 is not a multiple of the dataset's"
    r" examples_per_record=4"
  ):
    T.resize_iterator_states(saved, 8, examples_per_record=4)


def test_an_unknown_record_size_is_an_error_only_when_needed(dataset):
  saved = saved_states(dataset)
  assert T.resize_iterator_states(saved, 2, examples_per_record=None) == saved
  with pytest.raises(
    ValueError,
    match=(r"examples_per_record=None must be the dataset's positive manifest.examples_per_record"),
  ):
    T.resize_iterator_states(saved, 1, examples_per_record=None)


def test_positions_off_a_global_batch_boundary_are_refused(dataset):
  saved = saved_states(dataset)
  shifted = copy.deepcopy(saved)
  shifted[1]["pipeline"]["parent"]["offset"] = 1
  with error(
    r"data iterator state of process 1 is at record 12, offset 1 after 3 batches"
    r" of 4 records: not at a global batch boundary \(corrupt records skipped\?\);"
    r" resume on the saved number of processes"
  ):
    T.resize_iterator_states(shifted, 1, examples_per_record=PER_RECORD)
  behind = copy.deepcopy(saved)
  behind[1]["pipeline"]["parent"]["next_record"] = 8
  behind[1]["pipeline"]["totals"]["batches"] = 2
  with error(
    r"the saved processes consumed different numbers of batches \[3, 2\]: not one"
    r" global position; resume on the saved number of processes"
  ):
    T.resize_iterator_states(behind, 1, examples_per_record=PER_RECORD)


def test_incomplete_or_mixed_saved_states_are_refused(dataset):
  saved = saved_states(dataset)
  with error(
    r"a data iterator state has process_count=2, but 1 states were given: pass"
    r" the states of every saved process"
  ):
    T.resize_iterator_states(saved[:1], 1, examples_per_record=PER_RECORD)
  with error(r"the saved data iterator states have process indices \[0\], expected 0..1"):
    T.resize_iterator_states([saved[0], saved[0]], 1, examples_per_record=PER_RECORD)
  with error(r"the global batch 16 does not split over 0 processes"):
    T.resize_iterator_states(saved, 0, examples_per_record=PER_RECORD)
  with error(r"the global batch 16 does not split over 3 processes"):
    T.resize_iterator_states(saved, 3, examples_per_record=PER_RECORD)
  odd = copy.deepcopy(saved)
  for state in odd:
    state["pipeline"]["totals"]["required_buffer_size_per_sc"]["t_a"] = [8, 8, 8]
  with error(
    r"stack 't_a': required_buffer_size_per_sc has 6 entries over all saved"
    r" processes, not divisible by 4 processes: the device count changed, reset"
    r" the FDO maxima \(reset_stats_maxima=True\)"
  ):
    T.resize_iterator_states(odd, 4, examples_per_record=PER_RECORD)


# ------------------------------------------------- from a checkpoint's files


def write_grain_files(directory, states):
  """The data_iter item as Grain's handler writes it: one file per process."""
  directory.mkdir()
  for state in states:
    meta = state["metadata"]
    name = f"process_{meta['process_index']}-of-{meta['process_count']}.json"
    (directory / name).write_text(json.dumps(state, indent=4))
  return directory


def test_restore_resized_iterator_from_grain_files(dataset, tmp_path):
  saved_run = hosts(dataset, 2)
  take(saved_run, 3)
  saved = [it.get_state() for it in saved_run]
  item = write_grain_files(tmp_path / "data_iter", saved)
  assert (
    checkpointing.read_iterator_states(item, digests=[integrity.digest(s) for s in saved]) == saved
  )
  (resumed,) = hosts(dataset, 1)
  assert resumed.examples_per_record == PER_RECORD
  checkpointing.restore_resized_iterator(resumed, item)
  (uninterrupted,) = hosts(dataset, 1)
  take([uninterrupted], 3)
  assert_same_batches(take([resumed], 3), take([uninterrupted], 3))


def test_missing_altered_or_mixed_files_are_corrupt(dataset, tmp_path):
  saved = saved_states(dataset)
  item = write_grain_files(tmp_path / "a", saved)
  corrupt = pytest.raises
  with corrupt(
    checkpointing.CorruptCheckpointError,
    match=(
      r"step 7: item 'data_iter' file process_1-of-2.json does not match the digest saved"
      r" with it \(file altered\)"
    ),
  ):
    checkpointing.read_iterator_states(
      item, digests=[integrity.digest(saved[0])] * 2, where="step 7"
    )
  (item / "process_1-of-2.json").unlink()
  with corrupt(
    checkpointing.CorruptCheckpointError,
    match=(r"item 'data_iter' lacks the files of processes \[1\] of 2"),
  ):
    checkpointing.read_iterator_states(item)
  (item / "process_0-of-1.json").write_text("{}")
  with corrupt(
    checkpointing.CorruptCheckpointError,
    match=(r"item 'data_iter' has files of process counts \[1, 2\], expected one"),
  ):
    checkpointing.read_iterator_states(item)
  (item / "process_0-of-2.json").unlink()
  (item / "process_0-of-1.json").write_text("{not json")
  with corrupt(
    checkpointing.CorruptCheckpointError,
    match=(r"item 'data_iter' file process_0-of-1.json is unreadable \(JSONDecodeError:"),
  ):
    checkpointing.read_iterator_states(item)


def test_only_pipeline_iterators_take_resized_states(dataset, tmp_path):
  item = write_grain_files(tmp_path / "data_iter", saved_states(dataset))
  plain = iter(grain.MapDataset.range(8).to_iter_dataset())
  with pytest.raises(
    T.IteratorStateMismatchError,
    match=(
      r"a \w+ cannot take the data iterator states of 2 processes; only the"
      r" iterators of transforms.make_host_pipeline convert to another process count"
    ),
  ):
    checkpointing.restore_resized_iterator(plain, item)

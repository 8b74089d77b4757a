"""Data iterator states of N processes continued on M (issue 9): states and checkpoint files."""

import copy
import json

import datasets

import grain
import numpy as np
import pytest

from sparsepipe import checkpointing
from sparsepipe import data
from sparsepipe import transforms as T
from sparsepipe.checkpointing.integrity import digests as integrity

S = 2
GLOBAL_DEVICES = 4
GLOBAL_BATCH = 16
PER_RECORD = 2
NUM_EXAMPLES = 100  # 50 records: 6.25 global batches per epoch
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
  return datasets.feature_specs(FEATURES, GLOBAL_BATCH, GLOBAL_DEVICES, S, limit=LIMIT)


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
    T.make_host_input(
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
  states = T.resize_iterator_states(saved, new)
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


@pytest.mark.slow
def test_unchanged_count_with_two_workers_is_the_saved_state_and_continues_with_none(dataset):
  uninterrupted = hosts(dataset, 2, num_workers=2)
  take(uninterrupted, 3)
  saved = [it.get_state() for it in uninterrupted]
  resumed = hosts(dataset, 2, num_workers=0)
  try:
    for it in resumed:
      state = T.resize_iterator_state(saved[::-1], it.metadata)
      assert state == saved[it.metadata["process_index"]]
      it.set_state(state)
    assert_same_batches(take(resumed, 3), take(uninterrupted, 3))
  finally:
    close(resumed)
    close(uninterrupted)


def test_summarized_stats_maxima_keep_position_counters_and_each_stacks_maximum(dataset):
  saved_run = hosts(dataset, 2)
  take(saved_run, 3)
  saved = [it.get_state() for it in saved_run]
  want = {
    field: {
      stack: max(int(it.stats_totals().maxima[field][stack].max()) for it in saved_run)
      for stack in ("t_a", "t_b")
    }
    for field in saved_run[0].stats_totals().maxima
  }
  for count in (1, 2):  # another process count, or the same one
    for index, state in enumerate(
      T.resize_iterator_states(saved, count, summarize_stats_maxima=True)
    ):
      totals = T.StatsTotals.from_state(state["stats"])
      assert totals.batches == 3 and state["next_batch"] == 3
      got = {f: {s: v.tolist() for s, v in stacks.items()} for f, stacks in totals.maxima.items()}
      assert got == {f: {s: [m] for s, m in stacks.items()} for f, stacks in want.items()}
      drops = {s: sum(it.stats_totals().id_drops[s] for it in saved_run) for s in ("t_a", "t_b")}
      if index == 0:
        assert totals.id_drops == drops
      else:
        assert totals.id_drops == {"t_a": 0, "t_b": 0}


def saved_states(dataset, count=2, batches=3):
  run = hosts(dataset, count)
  take(run, batches)
  return [it.get_state() for it in run]


def error(message):
  return pytest.raises(T.IteratorStateMismatchError, match=message)


def test_another_global_batch_is_refused(dataset):
  saved = saved_states(dataset)
  target = dict(saved[0]["metadata"], process_index=0, process_count=1)
  with error(
    r"the checkpoint's global batch is 16 \(2 processes x 8\), but this job's is 8"
    r" \(1 x 8\): resume with global_batch_size=16"
  ):
    T.resize_iterator_state(saved, target)


def test_processes_at_different_batches_are_refused(dataset):
  behind = copy.deepcopy(saved_states(dataset))
  behind[1]["next_batch"] = 2
  with error(r"the saved processes are at different batches \[3, 2\]: not one global position"):
    T.resize_iterator_states(behind, 1)


def test_incomplete_or_mixed_saved_states_are_refused(dataset):
  saved = saved_states(dataset)
  with error(
    r"a data iterator state has process_count=2, but 1 states were given: pass"
    r" the states of every saved process"
  ):
    T.resize_iterator_states(saved[:1], 1)
  with error(r"the saved data iterator states have process indices \[0\], expected 0..1"):
    T.resize_iterator_states([saved[0], saved[0]], 1)
  with error(r"the global batch 16 does not split over 0 processes"):
    T.resize_iterator_states(saved, 0)
  with error(r"the global batch 16 does not split over 3 processes"):
    T.resize_iterator_states(saved, 3)
  odd = copy.deepcopy(saved)
  for state in odd:
    state["stats"]["required_buffer_size_per_sc"]["t_a"] = [8, 8, 8]
  with error(
    r"stack 't_a': required_buffer_size_per_sc has 6 entries over all saved"
    r" processes, not divisible by 4 processes: the device count changed, summarize"
    r" the FDO maxima \(summarize_stats_maxima=True\)"
  ):
    T.resize_iterator_states(odd, 4)


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
      r" iterators of transforms.make_host_input convert to another process count"
    ),
  ):
    checkpointing.restore_resized_iterator(plain, item)

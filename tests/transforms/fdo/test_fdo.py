"""FDO clients: record/publish/load (a history per process, max merging
across processes), atomic files, JSON state, and results and files
interchangeable with jax-tpu-embedding's NPZFileFDOClient."""

import fnmatch
import json
import os

import numpy as np
import pytest

from reference import reference_module
from sparsepipe import core
from sparsepipe import transforms as T
from sparsepipe.transforms.fdo import npz_client as npz_fdo_client


def _stats(stack="s", ids=(1, 2), unique=(1, 1), required=(8, 16), drops=0):
  return core.SparseDenseMatmulInputStats(
    max_ids_per_partition={stack: np.array(ids, np.int32)},
    max_unique_ids_per_partition={stack: np.array(unique, np.int32)},
    required_buffer_size_per_sc={stack: np.array(required, np.int32)},
    id_drop_counters={stack: drops},
  )


def _assert_stats(stats, ids, unique, required, drops, stack="s"):
  np.testing.assert_array_equal(stats.max_ids_per_partition[stack], ids)
  np.testing.assert_array_equal(stats.max_unique_ids_per_partition[stack], unique)
  np.testing.assert_array_equal(stats.required_buffer_size_per_sc[stack], required)
  np.testing.assert_array_equal(stats.id_drop_counters[stack], drops)


def _specs():
  table = core.TableSpec(name="s", vocabulary_size=64, embedding_dim=8)
  return T.prepare_feature_specs_for_training(
    {"f": core.FeatureSpec("f", table, (8, 1), (8, 8))}, 1, 2
  )


def _limits(specs):
  st = specs["f"].table_spec.stacked_table_spec
  return (
    st.max_ids_per_partition,
    st.max_unique_ids_per_partition,
    st.suggested_coo_buffer_size_per_device,
  )


def test_record_publish_load_roundtrip_keeps_the_history(tmp_path):
  client = T.NPZFileFDOClient(str(tmp_path), process_index=0)
  first = _stats(ids=(1, 5), unique=(1, 2), required=(8, 8), drops=3)
  second = _stats(ids=(4, 2), unique=(3, 1), required=(16, 8), drops=1)
  client.record(first)
  client.record(second)
  path = client.publish()
  assert os.path.basename(path).startswith("fdo_stats_0_")
  with np.load(path, allow_pickle=False) as data:
    assert {k: (data[k].dtype, data[k].tolist()) for k in data.files} == {
      "s_id_drop_counters": (np.int64, [[3], [1]]),
      "s_max_ids": (np.int32, [[1, 5], [4, 2]]),
      "s_max_unique_ids": (np.int32, [[1, 2], [3, 1]]),
      "s_required_buffer_size": (np.int32, [[8, 8], [16, 8]]),
    }
  loaded = client.load()  # one row per record, as the reference returns it
  _assert_stats(loaded, [[1, 5], [4, 2]], [[1, 2], [3, 1]], [[8, 8], [16, 8]], [[3], [1]])
  # Limits take the max of the history: the same as of the running maxima.
  tuned = T.update_preprocessing_parameters(_specs(), loaded, 2)
  assert _limits(tuned) == _limits(
    T.update_preprocessing_parameters(_specs(), T.merge_stats(first, second), 2)
  )
  assert _limits(tuned) == (5, 3, 32)


def test_multiple_records_load_as_the_reference_loads_them(tmp_path):
  """The reference's own case: the same statistics recorded twice."""
  values = {"tab_one": ([10, 20, 30, 40], [1, 2, 3, 4], [256])}

  def stats(cls):
    return cls(
      max_ids_per_partition={k: np.array(v[0]) for k, v in values.items()},
      max_unique_ids_per_partition={k: np.array(v[1]) for k, v in values.items()},
      required_buffer_size_per_sc={k: np.array(v[2]) for k, v in values.items()},
    )

  ours = T.NPZFileFDOClient(str(tmp_path / "ours"), process_index=0)
  ours.record(stats(core.SparseDenseMatmulInputStats))
  ours.record(stats(core.SparseDenseMatmulInputStats))
  ours.publish()
  got = ours.load()
  want = {
    "max_ids_per_partition": [[10, 20, 30, 40], [10, 20, 30, 40]],
    "max_unique_ids_per_partition": [[1, 2, 3, 4], [1, 2, 3, 4]],
    "required_buffer_size_per_sc": [[256], [256]],
  }
  for field, value in want.items():
    assert {k: v.tolist() for k, v in getattr(got, field).items()} == {"tab_one": value}
  assert got.id_drop_counters == {}
  file_client = reference_module("fdo.file_fdo_client")
  if file_client is None:
    return
  embedding = reference_module("nn.embedding")
  (tmp_path / "ref").mkdir()
  ref = file_client.NPZFileFDOClient(str(tmp_path / "ref"))
  ref.record(stats(embedding.SparseDenseMatmulInputStats))
  ref.record(stats(embedding.SparseDenseMatmulInputStats))
  ref.publish()
  # Each loads the other's file to what the writer loads itself.
  for theirs in (ref.load(), T.NPZFileFDOClient(str(tmp_path / "ref"), process_index=0).load()):
    for field, value in want.items():
      assert {k: np.asarray(v).tolist() for k, v in getattr(theirs, field).items()} == {
        "tab_one": value
      }
  mirrored = file_client.NPZFileFDOClient(str(tmp_path / "ours")).load()
  for field in want:
    assert {k: v.tolist() for k, v in getattr(mirrored, field).items()} == {
      k: v.tolist() for k, v in getattr(got, field).items()
    }


def test_load_takes_newest_file_per_process_and_merges_with_max(tmp_path):
  p0 = T.NPZFileFDOClient(str(tmp_path), process_index=0)
  p1 = T.NPZFileFDOClient(str(tmp_path), process_index=1)
  p0.record(_stats(ids=(50, 50)))
  p0.publish()  # superseded below by p0's newer file
  p0.set_state({"version": 1, "stats": {}})
  p0.record(_stats(ids=(1, 9), unique=(1, 1), required=(8, 8), drops=2))
  p0.publish()
  p1.record(_stats(ids=(7, 3), unique=(2, 2), required=(8, 24), drops=5))
  p1.publish()
  assert len(os.listdir(tmp_path)) == 3
  merged = p1.load()
  _assert_stats(merged, [7, 9], [2, 2], [8, 24], 5)
  specs = {
    "f": core.FeatureSpec(
      "f", core.TableSpec(name="s", vocabulary_size=64, embedding_dim=8), (8, 1), (8, 8)
    )
  }
  specs = T.prepare_feature_specs_for_training(specs, 1, 2)
  tuned = T.update_preprocessing_parameters(specs, merged, 2)
  st = tuned["f"].table_spec.stacked_table_spec
  assert (
    st.max_ids_per_partition,
    st.max_unique_ids_per_partition,
    st.suggested_coo_buffer_size_per_device,
  ) == (9, 2, 48)


def test_publish_twice_in_one_clock_tick_keeps_order(tmp_path, monkeypatch):
  monkeypatch.setattr(npz_fdo_client.time, "time_ns", lambda: 1000)
  client = T.NPZFileFDOClient(str(tmp_path), process_index=3)
  client.record(_stats(ids=(1, 1)))
  first = client.publish()
  client.set_state({"version": 1, "stats": {}})
  client.record(_stats(ids=(2, 2)))
  second = client.publish()
  assert os.path.basename(first) == "fdo_stats_3_1000.npz"
  assert os.path.basename(second) == "fdo_stats_3_1001.npz"
  np.testing.assert_array_equal(client.load().max_ids_per_partition["s"], [2, 2])


def test_load_without_files(tmp_path):
  client = T.NPZFileFDOClient(str(tmp_path / "missing"), process_index=0)
  with pytest.raises(T.NoFDOStatsError, match="no FDO stats files"):
    client.load()
  assert issubclass(T.NoFDOStatsError, FileNotFoundError)
  assert issubclass(T.NoFDOStatsError, ValueError)


def test_bad_files_are_reported(tmp_path):
  (tmp_path / "fdo_stats_0_1.npz").write_bytes(b"not a zip")
  client = T.NPZFileFDOClient(str(tmp_path), process_index=0)
  with pytest.raises(T.FDOStatsError, match="cannot read FDO stats file .*fdo_stats_0_1.npz"):
    client.load()
  os.remove(tmp_path / "fdo_stats_0_1.npz")
  np.savez(tmp_path / "fdo_stats_0_2.npz", s_bogus=np.zeros(2))
  with pytest.raises(T.FDOStatsError, match="unexpected key 's_bogus'"):
    client.load()
  os.remove(tmp_path / "fdo_stats_0_2.npz")
  np.savez(tmp_path / "fdo_stats_0_3.npz", s_max_ids=np.zeros(2, np.int32))
  np.savez(tmp_path / "fdo_stats_1_3.npz", s_max_ids=np.zeros(4, np.int32))
  with pytest.raises(
    T.FDOStatsError,
    match=r"fdo_stats_1_3.npz: max_ids_per_partition of stack 's'"
    r" has shape \(4,\), but earlier statistics have \(2,\)",
  ):
    client.load()


def test_pickled_arrays_are_refused(tmp_path):
  np.savez(tmp_path / "fdo_stats_0_1.npz", s_max_ids=np.array([object()], object))
  client = T.NPZFileFDOClient(str(tmp_path), process_index=0)
  with pytest.raises(T.FDOStatsError, match="cannot read FDO stats file"):
    client.load()


def test_writes_are_atomic(tmp_path, monkeypatch):
  client = T.NPZFileFDOClient(str(tmp_path), process_index=0)
  client.record(_stats())
  seen = []
  real_replace = os.replace

  def checking_replace(src, dst):
    # Just before the rename: the complete temp file exists, but neither
    # our loader nor the reference's glob ('fdo_stats*.npz') matches it.
    names = os.listdir(tmp_path)
    seen.extend(names)
    assert npz_fdo_client.latest_files(str(tmp_path)) == []
    assert not fnmatch.filter(names, "fdo_stats*.npz")
    real_replace(src, dst)

  monkeypatch.setattr(npz_fdo_client.os, "replace", checking_replace)
  client.publish()
  assert len(seen) == 1 and seen[0].startswith(".tmp_")

  def failing_replace(src, dst):
    raise OSError("disk went away")

  monkeypatch.setattr(npz_fdo_client.os, "replace", failing_replace)
  with pytest.raises(OSError, match="disk went away"):
    client.publish()
  names = os.listdir(tmp_path)
  assert len(names) == 1 and names[0].startswith("fdo_stats_0_")  # no leftovers


def test_state_is_json_and_restores(tmp_path):
  client = T.NPZFileFDOClient(str(tmp_path), process_index=0)
  client.record(_stats(ids=(3, 4), drops=7))
  client.record(_stats(stack="t", ids=(1,), unique=(1,), required=(8,)))
  state = json.loads(json.dumps(client.get_state()))
  assert state == {
    "version": 1,
    "stats": {
      "max_ids_per_partition": {"s": [3, 4], "t": [1]},
      "max_unique_ids_per_partition": {"s": [1, 1], "t": [1]},
      "required_buffer_size_per_sc": {"s": [8, 16], "t": [8]},
      "id_drop_counters": {"s": 7, "t": 0},
    },
  }
  restored = T.NPZFileFDOClient(str(tmp_path), process_index=0)
  restored.set_state(state)
  restored.record(_stats(ids=(5, 1)))
  history = json.loads(json.dumps(restored.get_state()))
  assert history["stats"]["max_ids_per_partition"] == {"s": [[3, 4], [5, 1]], "t": [1]}
  assert history["stats"]["id_drop_counters"] == {"s": [[7], [0]], "t": 0}
  restored.publish()
  loaded = restored.load()
  _assert_stats(loaded, [[3, 4], [5, 1]], [[1, 1], [1, 1]], [[8, 16], [8, 16]], [[7], [0]])
  again = T.NPZFileFDOClient(str(tmp_path), process_index=0)
  again.set_state(history)
  assert again.get_state() == history
  with pytest.raises(T.FDOStatsError, match="FDO state version 2 is not 1"):
    restored.set_state({"version": 2, "stats": {}})
  with pytest.raises(T.FDOStatsError, match="FDO state: unknown field 'x'"):
    restored.set_state({"version": 1, "stats": {"x": {}}})


def test_merge_stats():
  merged = T.merge_stats(
    _stats(ids=(1, 7), drops=2),
    _stats(ids=(4, 2), drops=1),
    _stats(stack="t", ids=(9,), unique=(9,), required=(16,)),
  )
  _assert_stats(merged, [4, 7], [1, 1], [8, 16], 2)
  _assert_stats(merged, [9], [9], [16], 0, stack="t")
  with pytest.raises(T.FDOStatsError, match="has shape \\(3,\\), but earlier"):
    T.merge_stats(_stats(ids=(1, 2)), _stats(ids=(1, 2, 3)))
  # A list given as one argument was "'list' object has no attribute ...".
  with pytest.raises(
    TypeError,
    match=r"^merge_stats argument 1 is a list, not SparseDenseMatmulInputStats \(give them as"
    r" separate arguments: merge_stats\(\*stats_list\)\)$",
  ):
    T.merge_stats(_stats(ids=(1, 2)), [_stats(ids=(1, 2))])


def test_interchange_with_reference_client(tmp_path, monkeypatch):
  pytest.importorskip("jax_tpu_embedding")
  from jax_tpu_embedding.sparsecore.lib.fdo import file_fdo_client  # pylint: disable=g-import-not-at-top
  from jax_tpu_embedding.sparsecore.lib.nn import embedding  # pylint: disable=g-import-not-at-top

  def ref_stats(ids, drops):
    return embedding.SparseDenseMatmulInputStats(
      max_ids_per_partition={"s": np.array(ids, np.int32)},
      max_unique_ids_per_partition={"s": np.array([1, 1], np.int32)},
      required_buffer_size_per_sc={"s": np.array([8, 8], np.int32)},
      id_drop_counters={"s": drops},
    )

  # The reference writes a stacked history per key; we merge it with max.
  ref_dir = tmp_path / "ref"
  ref_dir.mkdir()
  ref = file_fdo_client.NPZFileFDOClient(str(ref_dir))
  ref.record(ref_stats([1, 6], 2))
  ref.record(ref_stats([3, 4], 5))
  ref.publish()
  ours = T.NPZFileFDOClient(str(ref_dir), process_index=1)
  mine, theirs = ours.load(), file_fdo_client.NPZFileFDOClient(str(ref_dir)).load()
  _assert_stats(mine, [[1, 6], [3, 4]], [[1, 1], [1, 1]], [[8, 8], [8, 8]], [[2], [5]])
  for field in ("max_ids_per_partition", "id_drop_counters"):
    np.testing.assert_array_equal(getattr(mine, field)["s"], getattr(theirs, field)["s"])
  # Files we write are read by the reference, merged with its own.
  ours.record(_stats(ids=(9, 1), unique=(2, 2), required=(16, 8), drops=1))
  ours.publish()
  loaded = file_fdo_client.NPZFileFDOClient(str(ref_dir)).load()
  np.testing.assert_array_equal(loaded.max_ids_per_partition["s"], [9, 6])
  np.testing.assert_array_equal(loaded.required_buffer_size_per_sc["s"], [16, 8])

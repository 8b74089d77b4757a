"""The host input: batches by index, any host or worker count, exact resume, FDO rebuild."""

import itertools
import json
import os
import re
import signal

import datasets
import grain
import jax
import numpy as np
import pytest
from array_record.python import array_record_module

from sparsepipe import core
from sparsepipe import data
from sparsepipe import pipeline
from sparsepipe import transforms as T
from sparsepipe.core.mesh import make_mesh

S = 2  # SparseCores per device in these tests
SEED = 7
NUM_EXAMPLES = 93
PER_RECORD = 5  # 19 records, the last holds 3; batches straddle records

FEATURES = (
  data.SyntheticFeature("a", 40, 1, 3),
  data.SyntheticFeature("b", 24, 0, 4, weighted=True),
  data.SyntheticFeature("c", 16, 1, 1),
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
  """93 examples whose dense[:, 0] is the example number, in 4 shards."""
  path = str(tmp_path_factory.mktemp("pipeline") / "ds")
  datasets.write_numbered(path, FEATURES, NUM_EXAMPLES, PER_RECORD, max_records_per_shard=6)
  return path


def make_specs(global_batch, global_devices, limit=64, combiners=("sum", "mean", "sqrtn")):
  return datasets.feature_specs(
    FEATURES, global_batch, global_devices, S, limit=limit, combiners=combiners
  )


def config(path, batch, **kw):
  return T.InputConfig(path, batch, seed=SEED, num_sc_per_device=S, **kw)


# ----------------------------------------------------------------- the model
# What the input must produce, derived from the definition: the epoch's
# records (full ones in the seeded permuted order, then the short one),
# their examples decoded one record at a time, the examples of each window
# of `window` records in the window's own seeded order, batches cut from
# the stream.


def window_parts(records, order, epoch, window, schema):
  """The epoch's examples: each window's examples, permuted (stream = window + 1)."""
  parts = []
  for w in range(0, len(order), window):
    examples = data.concat_batches([records[r] for r in order[w : w + window]])
    n = examples.num_examples
    slots = T.permute(np.arange(n), n, seed=SEED, epoch=epoch, stream=w // window + 1)
    parts.append(data.batch_from_examples([data.example_at(examples, q) for q in slots], schema))
  return parts


def example_stream(path, num_examples, shuffle=True):
  """The stream without the window shuffle: records in the epoch's order."""
  manifest = data.read_manifest(path)
  source = data.manifest_source(manifest)
  records = [data.decode_batch(source[r], manifest.schema) for r in range(manifest.num_records)]
  full = [r for r, b in enumerate(records) if b.num_examples == PER_RECORD]
  short = [r for r, b in enumerate(records) if b.num_examples < PER_RECORD]
  parts = []
  for epoch in itertools.count():
    if shuffle:
      ranks = T.permute(np.arange(len(full)), len(full), seed=SEED, epoch=epoch)
      order = [full[r] for r in ranks] + short
    else:
      order = list(range(len(records)))
    parts += [records[r] for r in order]
    if sum(p.num_examples for p in parts) >= num_examples:
      return data.slice_batch(data.concat_batches(parts), 0, num_examples)


def window_lanes(path, num_examples, window, lanes=T.WINDOW_LANES):
  """Each lane of the window shuffle, num_examples or more: in epoch e, lane r holds
  the windows w with (w + e) mod lanes == r."""
  manifest = data.read_manifest(path)
  source = data.manifest_source(manifest)
  records = [data.decode_batch(source[r], manifest.schema) for r in range(manifest.num_records)]
  full = [r for r, b in enumerate(records) if b.num_examples == PER_RECORD]
  short = [r for r, b in enumerate(records) if b.num_examples < PER_RECORD]
  parts = [[] for _ in range(lanes)]
  for epoch in itertools.count():
    ranks = T.permute(np.arange(len(full)), len(full), seed=SEED, epoch=epoch)
    order = [full[r] for r in ranks] + short
    for w, part in enumerate(window_parts(records, order, epoch, window, manifest.schema)):
      parts[(w + epoch) % lanes].append(part)
    if all(sum(p.num_examples for p in lane) >= num_examples for lane in parts):
      return [data.concat_batches(lane) for lane in parts]


def expected_batches(
  path,
  specs,
  batch,
  num_batches,
  *,
  local,
  global_,
  index=0,
  count=1,
  shuffle=True,
  window=T.InputConfig.shuffle_window,
  **kw,
):
  # Batch k: with the window shuffle, examples [t*G, (t+1)*G) of lane k mod L
  # (t = k // L); else of the stream (t = k, one lane). This host: its block.
  lanes = T.WINDOW_LANES if shuffle and window else 1
  per_lane = -(-num_batches // lanes) * batch * count
  if lanes > 1:
    streams = window_lanes(path, per_lane, window)
  else:
    streams = [example_stream(path, per_lane, shuffle)]
  out = []
  for k in range(num_batches):
    t, lane = divmod(k, lanes)
    start = (t * count + index) * batch
    ex = data.slice_batch(streams[lane], start, start + batch)
    features = {name: ex.sparse[name] for name in specs}
    pre, stats = T.preprocess_sparse_dense_matmul_input(
      features, None, specs, local, global_, num_sc_per_device=S, **kw
    )
    out.append((core.TrainBatch(ex.labels, ex.dense, pre.sparse_dense_matmul_input), stats))
  return out


def assert_batch_equal(got: core.TrainBatch, want: core.TrainBatch):
  np.testing.assert_array_equal(got.labels, want.labels)
  np.testing.assert_array_equal(got.dense, want.dense)
  for g, w in zip(got.sparse, want.sparse):
    assert sorted(g) == sorted(w)
    for k in w:
      np.testing.assert_array_equal(np.asarray(g[k]), w[k])  # NaN padding compares equal


def assert_stats_equal(got, want):
  for field in (
    "max_ids_per_partition",
    "max_unique_ids_per_partition",
    "required_buffer_size_per_sc",
  ):
    g, w = getattr(got, field), getattr(want, field)
    assert sorted(g) == sorted(w)
    for k in w:
      np.testing.assert_array_equal(g[k], w[k])
  assert {k: int(v) for k, v in got.id_drop_counters.items()} == {
    k: int(v) for k, v in want.id_drop_counters.items()
  }


def host_input(path, specs, batch, *, local=2, global_=2, index=0, count=1, **kw):
  return T.make_host_input(
    config(path, batch, **kw),
    specs,
    local_device_count=local,
    global_device_count=global_,
    process_index=index,
    process_count=count,
    fdo_client=kw.pop("fdo_client", None),
  )


def take(it, n):
  return [next(it) for _ in range(n)]


# ------------------------------------------------------------------- tests


@pytest.mark.parametrize(
  "shuffle, window",
  [(True, 0), (True, 3), (True, 256), (False, 3)],
)
def test_batches_equal_direct_preprocessing(dataset, shuffle, window):
  # Windows of 3 records (15 examples; the last of an epoch 13): batches straddle them.
  specs = make_specs(12, 2)
  it = host_input(dataset, specs, 12, shuffle=shuffle, shuffle_window=window)
  got = take(it, 10)  # 120 examples: crosses the epoch boundary (93), reshuffled
  want = expected_batches(
    dataset, specs, 12, 10, local=2, global_=2, shuffle=shuffle, window=window
  )
  for g, (batch, stats) in zip(got, want):
    assert isinstance(g, T.PreprocessedBatch) and g.num_corrupt_records == 0
    assert_batch_equal(g.batch, batch)
    assert_stats_equal(g.stats, stats)
  if not shuffle:
    np.testing.assert_array_equal(got[0].batch.dense[:, 0], np.arange(12))
  it.close()


def test_stats_recorded_into_fdo_client_and_state(dataset, tmp_path):
  specs = make_specs(12, 2)
  client = T.NPZFileFDOClient(str(tmp_path / "fdo"), process_index=0)
  it = T.make_host_input(
    config(dataset, 12),
    specs,
    local_device_count=2,
    global_device_count=2,
    process_index=0,
    process_count=1,
    fdo_client=client,
  )
  got = take(it, 5)
  want = expected_batches(dataset, specs, 12, 5, local=2, global_=2)
  totals = it.stats_totals()
  assert totals.batches == 5 and totals.corrupt_records == 0
  for field in (
    "max_ids_per_partition",
    "max_unique_ids_per_partition",
    "required_buffer_size_per_sc",
  ):
    for stack in getattr(want[0][1], field):
      expected = np.max([getattr(s, field)[stack] for _, s in want], axis=0)
      np.testing.assert_array_equal(getattr(totals.as_stats(), field)[stack], expected)
      assert it.get_state()["stats"][field][stack] == expected.tolist()
  client.publish()
  history = client.load()  # one row per batch, as the reference's client keeps them
  for field in ("max_ids_per_partition", "required_buffer_size_per_sc"):
    for stack, rows in getattr(history, field).items():
      np.testing.assert_array_equal(rows, [getattr(s, field)[stack] for _, s in want])
  assert_stats_equal(T.merge_stats(history), totals.as_stats())
  del got


def test_the_global_batches_are_the_same_on_any_host_count(dataset):
  """Host h of P reads block h of every global batch: concatenated, the same batches."""
  global_batches = {}
  for count in (1, 2, 4):
    hosts = [
      T.make_example_batches(config(dataset, 8 // count), process_index=h, process_count=count)
      for h in range(count)
    ]
    global_batches[count] = [
      np.concatenate([hosts[h][k].examples.dense[:, 0] for h in range(count)]) for k in range(14)
    ]
  for k in range(14):
    np.testing.assert_array_equal(global_batches[2][k], global_batches[1][k])
    np.testing.assert_array_equal(global_batches[4][k], global_batches[1][k])
  # 14 batches of 8 span more than one epoch of 93: each epoch holds every example once.
  first_epoch = np.concatenate(global_batches[1])[:NUM_EXAMPLES]
  assert sorted(first_epoch.tolist()) == list(range(NUM_EXAMPLES))


def test_per_host_pipelines_preprocess_their_own_slice(dataset):
  specs = make_specs(16, 4)  # 2 hosts x 8 examples, 2 local of 4 global devices
  for index in range(2):
    it = host_input(dataset, specs, 8, local=2, global_=4, index=index, count=2)
    want = expected_batches(dataset, specs, 8, 4, local=2, global_=4, index=index, count=2)
    for g, (batch, stats) in zip(take(it, 4), want):
      assert_batch_equal(g.batch, batch)
      assert_stats_equal(g.stats, stats)
    assert it.get_state()["metadata"]["process_index"] == index


def check_resume_at_every_step(make, steps):
  """Saves the state before every step; a new pipeline restored there continues exactly."""
  it = make()
  states, outs = [], []
  for _ in range(steps):
    states.append(json.loads(json.dumps(it.get_state())))  # JSON round trip
    outs.append(next(it))
  it.close()
  restored = make()
  for k in reversed(range(steps)):  # also goes backwards in the same iterator
    restored.set_state(states[k])
    assert restored.get_state() == states[k]
    for j in range(k, steps):
      got = next(restored)
      assert_batch_equal(got.batch, outs[j].batch)
      assert_stats_equal(got.stats, outs[j].stats)
  restored.close()
  return outs, states


@pytest.mark.parametrize("window", [0, 3])
def test_resume_at_every_step_in_process(dataset, window):
  # Windows of 3 records (15 examples): most states are mid-window.
  specs = make_specs(12, 2)
  make = lambda: host_input(dataset, specs, 12, shuffle_window=window)  # noqa: E731
  outs, states = check_resume_at_every_step(make, 9)
  assert len(outs) == 9 and [s["next_batch"] for s in states] == list(range(9))


def test_state_is_small_json_with_position(dataset):
  specs = make_specs(12, 2)
  it = host_input(dataset, specs, 12)
  take(it, 3)
  state = it.get_state()
  assert state["metadata"] == {
    "state_version": 2,
    "per_host_batch_size": 12,
    "process_index": 0,
    "process_count": 1,
    "seed": SEED,
    "shuffle": True,
    "num_records": 19,
    "dataset": T.dataset_fingerprint(data.read_manifest(dataset)),
    "conversion": T.conversion_fingerprint(data.read_manifest(dataset)),
  }
  # The window shuffle is in the metadata (another order); without it, the metadata is 0.3's.
  windowed = host_input(dataset, specs, 12, shuffle_window=3).get_state()["metadata"]
  assert windowed == {**state["metadata"], "shuffle_window": 3}
  assert len(state["metadata"]["dataset"]) == 16
  assert state["next_batch"] == 3 and state["stats"]["batches"] == 3
  assert sorted(state) == ["metadata", "next_batch", "stats"]
  assert len(json.dumps(state)) < 2000


def test_a_state_of_another_pipeline_is_an_error(dataset):
  specs = make_specs(12, 2)
  it = host_input(dataset, specs, 12)
  state = it.get_state()
  state["metadata"]["per_host_batch_size"] = 24
  with pytest.raises(
    T.IteratorStateMismatchError,
    match=(r"saved with per_host_batch_size=24, but this pipeline has per_host_batch_size=12"),
  ):
    it.set_state(state)
  state = it.get_state()
  state["metadata"]["dataset"] = "0123456789abcdef"
  with pytest.raises(
    T.IteratorStateMismatchError,
    match=(r"saved with dataset='0123456789abcdef', but this pipeline has dataset='[0-9a-f]{16}'"),
  ):
    it.set_state(state)
  # The same data converted by other rules (a rebuilt dataset under the same path).
  state = it.get_state()
  state["metadata"]["conversion"] = "0123456789abcdef"
  with pytest.raises(
    T.IteratorStateMismatchError,
    match=r"saved with conversion='0123456789abcdef', but this pipeline has conversion='[0-9a-f]",
  ):
    it.set_state(state)
  # States saved before the conversion was recorded still resume, also resized.
  del state["metadata"]["conversion"]
  it.set_state(state)
  saved = [dict(state, metadata=dict(state["metadata"], process_count=1))]
  it.set_state(T.resize_iterator_state(saved, it.metadata))


def test_rebuild_with_new_specs_continues_from_state(dataset):
  specs = make_specs(12, 2)
  old = host_input(dataset, specs, 12)
  take(old, 4)
  state = old.get_state()
  new_specs = T.update_preprocessing_parameters(specs, old.stats_totals().as_stats(), S, 2)
  assert new_specs != specs  # the limits (and so the buffer shapes) changed
  new = host_input(dataset, new_specs, 12, allow_id_dropping=True)
  new.set_state(state)
  assert new.stats_totals().batches == 4
  want = expected_batches(dataset, new_specs, 12, 7, local=2, global_=2, allow_id_dropping=True)[4:]
  for g, (batch, stats) in zip(take(new, 3), want):
    assert_batch_equal(g.batch, batch)
    assert_stats_equal(g.stats, stats)
  old_shape = next(old).batch.sparse.lhs_embedding_ids["t_a"].shape
  assert g.batch.sparse.lhs_embedding_ids["t_a"].shape != old_shape


def test_corrupt_record_raises_with_file_and_index(tmp_path):
  shard = datasets.write_with_corrupt_records(str(tmp_path / "ds"), bad={4})
  cfg = T.InputConfig(str(tmp_path / "ds"), 2, shuffle=False)
  batches = T.make_example_batches(cfg, process_index=0, process_count=1)
  batches[0], batches[1]
  with pytest.raises(
    data.CorruptRecordError,
    match=(rf"^corrupt record 4 in '{shard}': expected 40 bytes, got 36 \(truncated\)"),
  ) as info:
    batches[2]
  assert (info.value.path, info.value.index) == (shard, 4)
  assert info.value.reason == "expected 40 bytes, got 36 (truncated)"


def test_corrupt_records_skipped_and_counted(tmp_path):
  datasets.write_with_corrupt_records(str(tmp_path / "ds"), bad={1, 4})
  schema_specs = {"a": core.FeatureSpec("a", core.TableSpec("t", 10, 8), (2, 1), (2, 8))}
  specs = T.prepare_feature_specs_for_training(schema_specs, 1, 2)
  cfg = T.InputConfig(
    str(tmp_path / "ds"), 2, shuffle=False, skip_corrupt=True, num_sc_per_device=2
  )
  it = T.make_host_input(
    cfg, specs, local_device_count=1, global_device_count=1, process_index=0, process_count=1
  )
  # Records 1 and 4 are skipped; their batches repeat their own good example.
  batches = take(it, 4)
  assert [b.batch.labels.tolist() for b in batches] == [[0, 0], [2, 3], [5, 5], [0, 0]]
  assert [b.num_corrupt_records for b in batches] == [1, 0, 1, 1]
  assert it.stats_totals().corrupt_records == 3
  assert it.get_state()["stats"]["corrupt_records"] == 3


def test_corrupt_packed_record_is_skipped_in_each_batch_of_its_window(tmp_path):
  """4 records of 2 examples (labels 0..7), record 1 (examples 2, 3) cut short."""
  path = str(tmp_path / "ds")
  schema = data.make_schema(1, {"a": 10})
  codec = data.RecordCodec(schema)
  os.makedirs(path)
  writer = array_record_module.ArrayRecordWriter(
    os.path.join(path, "part-00000.arrayrecord"), "group_size:1"
  )
  for r in range(4):
    examples = [
      data.Example(float(i), np.float32([i]), {"a": np.array([i])}) for i in (2 * r, 2 * r + 1)
    ]
    record = codec.encode_batch(data.batch_from_examples(examples, schema))
    writer.write(record[:-4] if r == 1 else record)
  writer.close()
  data.write_manifest(
    data.Manifest(path, schema, (data.ShardInfo("part-00000.arrayrecord", 4, 8),), 2)
  )
  schema_specs = {"a": core.FeatureSpec("a", core.TableSpec("t", 10, 8), (4, 1), (4, 8))}
  specs = T.prepare_feature_specs_for_training(schema_specs, 1, 2)
  cfg = T.InputConfig(path, 4, shuffle_window=4, skip_corrupt=True, num_sc_per_device=2)
  it = T.make_host_input(
    cfg, specs, local_device_count=1, global_device_count=1, process_index=0, process_count=1
  )
  # Epoch 0's window (the whole epoch) is examples 2 0 4 5 | 6 3 7 1; it is window 0
  # of epoch 0, in lane 0 of WINDOW_LANES (8): batches 0 and 8 read it. Each drops one of record
  # 1's examples and repeats its own good ones from the start.
  batches = take(it, 9)
  assert T.WINDOW_LANES == 8
  assert [batches[k].batch.labels.tolist() for k in (0, 8)] == [[0, 4, 5, 0], [6, 7, 1, 6]]
  assert [batches[k].num_corrupt_records for k in (0, 8)] == [1, 1]
  it.close()


def test_device_put_on_mesh_matches_host_batches(dataset):
  mesh = make_mesh()
  assert mesh.size == 8
  specs = make_specs(16, 8)
  it = pipeline.make_train_input(config(dataset, 16), specs, mesh)
  host = host_input(dataset, specs, 16, local=8, global_=8)
  for _ in range(2):
    placed, want = next(it), next(host).batch
    assert isinstance(placed, pipeline.DevicePackedBatch)  # one array; the step splits it
    got = placed.unpacked()
    assert isinstance(got.labels, jax.Array) and got.labels.shape == (16,)
    assert got.sparse.lhs_gains["t_b"].sharding.spec == jax.sharding.PartitionSpec("data")
    assert_batch_equal(got, want)
    # Device d holds its own slice: labels d*2:(d+1)*2, its own COO buffers.
    for shard in got.labels.addressable_shards:
      d = mesh.devices.tolist().index(shard.device)
      np.testing.assert_array_equal(shard.data, want.labels[2 * d : 2 * d + 2])
  assert it.get_state()["stats"]["batches"] == 2
  # Any batch made again from its index, placed like the ones handed out.
  again = it.batch_at(1).unpacked()
  assert_batch_equal(again, want)
  assert again.labels.sharding == got.labels.sharding
  assert it.next_batch == 2


def test_config_from_config_dict_and_spec_checks(dataset):
  import ml_collections  # pylint: disable=g-import-not-at-top

  cfg = ml_collections.ConfigDict(
    {"data_dir": dataset, "per_host_batch_size": 12, "seed": SEED, "num_sc_per_device": S}
  )
  assert T.InputConfig.from_config(cfg) == config(dataset, 12)
  with pytest.raises(ValueError, match=r"unknown input config keys \['batch'\]"):
    T.InputConfig.from_config({"data_dir": dataset, "per_host_batch_size": 1, "batch": 3})
  with pytest.raises(
    ValueError,
    match=(
      r"feature 'a': global batch size 24 in its spec, but the pipeline makes"
      r" per_host_batch_size \* process_count = 12"
    ),
  ):
    host_input(dataset, make_specs(24, 2), 12)
  other = {"zz": core.FeatureSpec("zz", core.TableSpec("t", 10, 8), (12, 1), (12, 8))}
  with pytest.raises(ValueError, match=r"feature 'zz' is not in the dataset"):
    host_input(dataset, T.prepare_feature_specs_for_training(other, 2, S), 12)


@pytest.mark.parametrize(
  "field, message",
  [
    ({"num_epochs": 0}, "num_epochs=0 must be >= 1 (or None: repeat forever)"),
    ({"sharding_strategy": "DIV"}, "sharding_strategy 'DIV' is not supported; only MOD"),
    ({"num_sc_per_device": 0}, "num_sc_per_device=0 must be >= 1"),
    ({"worker_buffer_size": 0}, "worker_buffer_size=0 must be >= 1"),
    ({"reader_max_parallelism": -1}, "reader_max_parallelism=-1 must be >= 0"),
  ],
)
def test_input_settings_no_batch_could_follow_are_refused_where_made(field, message):
  # They were refused only when the first batch was read (or an epoch of no batches
  # ended the input at once), far from the setting.
  with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
    T.InputConfig(data_dir="d", per_host_batch_size=4, **field)
  assert T.InputConfig(data_dir="d", per_host_batch_size=4, sharding_strategy="mod")


# ------------------------------------------------- worker processes (slow)


def _record_sigterm_disposition(worker_index, worker_count):
  path = os.environ["SPARSEPIPE_TEST_SIGNAL_DIR"]
  ignored = signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
  with open(os.path.join(path, f"worker{worker_index}-of-{worker_count}"), "w") as f:
    f.write(str(ignored))


def test_batches_and_states_do_not_depend_on_the_worker_count(dataset, tmp_path, monkeypatch):
  monkeypatch.setenv("SPARSEPIPE_TEST_SIGNAL_DIR", str(tmp_path))
  specs = make_specs(12, 2)
  # Windows of 3 records: every batch reads from one or two windows.
  want = expected_batches(dataset, specs, 12, 6, local=2, global_=2, window=3)

  def make(workers):
    return T.make_host_input(
      config(dataset, 12, num_workers=workers, shuffle_window=3),
      specs,
      local_device_count=2,
      global_device_count=2,
      process_index=0,
      process_count=1,
      worker_init_fn=_record_sigterm_disposition,
    )

  two = make(2)
  got = take(two, 3)
  state = two.get_state()
  got += take(two, 3)
  two.close()
  for g, (batch, stats) in zip(got, want):
    assert_batch_equal(g.batch, batch)
    assert_stats_equal(g.stats, stats)
  # A 2-worker state continues exactly with 0 or 1 workers.
  for workers in (0, 1):
    it = make(workers)
    it.set_state(state)
    for g, (batch, stats) in zip(take(it, 3), want[3:]):
      assert_batch_equal(g.batch, batch)
      assert_stats_equal(g.stats, stats)
    it.close()
  assert sorted(os.listdir(tmp_path)) == ["worker0-of-1", "worker0-of-2", "worker1-of-2"]
  assert all((tmp_path / n).read_text() == "True" for n in os.listdir(tmp_path))


@pytest.mark.slow
def test_restores_at_every_state_with_another_worker_count_grains_check(dataset):
  """Grain's generic checkpoint test, each restore with the next worker count of 0, 2, 1."""
  specs = make_specs(12, 2)
  workers = itertools.cycle([0, 2, 1])

  class Input:
    def __iter__(self):
      return host_input(dataset, specs, 12, num_epochs=1, num_workers=next(workers))

  grain.experimental.assert_equal_output_after_checkpoint(Input())


def test_orbax_checkpoint_of_the_iterator(dataset, tmp_path):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  specs = make_specs(12, 2)
  it = host_input(dataset, specs, 12)
  take(it, 2)
  manager = ocp.CheckpointManager(str(tmp_path / "ckpt"), item_names=("data_iter",))
  manager.save(2, args=ocp.args.Composite(data_iter=grain.checkpoint.CheckpointSave(it)))
  manager.wait_until_finished()
  want = take(it, 2)
  restored = host_input(dataset, specs, 12)
  manager.restore(
    2, args=ocp.args.Composite(data_iter=grain.checkpoint.CheckpointRestore(restored))
  )
  manager.close()
  for g, w in zip(take(restored, 2), want):
    assert_batch_equal(g.batch, w.batch)
  assert restored.stats_totals().batches == 4
  with open(tmp_path / "ckpt" / "2" / "data_iter" / "process_0-of-1.json") as f:
    assert json.load(f)["next_batch"] == 2


def test_labels_outside_the_range_are_an_error_naming_the_dataset(tmp_path):
  """Ratings 1..5 fed to a click model: refused before they reach a device."""
  path = str(tmp_path / "ratings")
  schema = data.synthetic_schema(FEATURES, 2)
  examples = data.concat_batches(list(data.generate_batches(FEATURES, 2, 16, 3)))
  examples.labels[:] = np.arange(16) % 5 + 1
  with data.ShardedRecordWriter(path, schema, examples_per_record=1) as writer:
    writer.write_batch(examples)
  mesh = make_mesh()
  it = pipeline.make_train_input(config(path, 16), make_specs(16, 8), mesh, label_range=(0, 1))
  with pytest.raises(
    pipeline.LabelRangeError,
    match=(
      rf"^labels outside \[0, 1\] in dataset '{path}': a batch has labels from 1 to 5"
      r" \(non-finite: 0\); the models' sigmoid cross-entropy needs click labels in \[0, 1\]:"
      r" convert ratings with --label_threshold(\n|$)"
    ),
  ):
    next(it)
  # Without a range (a regression model's pipeline) the same data passes.
  batch = next(pipeline.make_train_input(config(path, 16), make_specs(16, 8), mesh)).unpacked()
  assert sorted(np.asarray(batch.labels)) == sorted(np.arange(16) % 5 + 1)

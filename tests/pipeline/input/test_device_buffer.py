"""One host buffer per batch: packed, placed in one transfer, split on the devices."""

import datasets
import jax
import numpy as np
import pytest

from sparsepipe import core
from sparsepipe import data
from sparsepipe import pipeline
from sparsepipe import transforms
from sparsepipe.pipeline.input import device_buffer

DEVICES = 8


def host_batch() -> core.TrainBatch:
  """16 examples, two stacks; float bits a value copy could change (-0.0, NaN payloads)."""
  labels = np.arange(16, dtype=np.float32)
  labels[3] = -0.0
  labels[5] = np.uint32(0x7FC01234).view(np.float32)  # a NaN with a payload
  gains = np.linspace(-1, 1, 8 * 24, dtype=np.float32)
  gains[7::24] = np.uint32(0xFFC00001).view(np.float32)
  sparse = core.SparseDenseMatmulInput(
    lhs_row_pointers={
      "s0": np.arange(8 * 4, dtype=np.int32),
      "s1": -np.arange(8 * 4, dtype=np.int32),
    },
    lhs_embedding_ids={
      "s0": np.arange(8 * 24, dtype=np.int32) * 7,
      "s1": np.arange(8 * 8, dtype=np.int32),
    },
    lhs_sample_ids={
      "s0": np.arange(8 * 24, dtype=np.int32) % 2,
      "s1": np.arange(8 * 8, dtype=np.int32) % 3,
    },
    lhs_gains={"s0": gains, "s1": np.full(8 * 8, 0.5, np.float32)},
  )
  dense = np.arange(16 * 3, dtype=np.float32).reshape(16, 3) - 7
  return core.TrainBatch(labels, dense, sparse)


def bits(x) -> np.ndarray:
  x = np.asarray(x)
  return x.view(np.uint32) if x.dtype.itemsize == 4 else x


@pytest.mark.parametrize("where", ["own program", "inside a jitted step"])
def test_packed_placement_is_bitwise_the_per_array_placement(where):
  mesh = core.make_mesh()
  assert mesh.size == DEVICES
  batch = host_batch()
  placed = device_buffer.place_packed(device_buffer.pack_batch(batch, DEVICES), mesh)
  assert isinstance(placed, pipeline.DevicePackedBatch)
  assert placed.words.shape == (DEVICES * placed.layout.words,)
  assert placed.words.sharding == core.data_sharding(mesh)
  if where == "own program":
    got = placed.unpacked()
  else:  # as a packed trainer's step splits it, its arrays an output of the step
    step = jax.jit(
      lambda p: device_buffer.split_on_devices(p, mesh), out_shardings=core.data_sharding(mesh)
    )
    got = step(placed)
  want = pipeline.to_global_batch(batch, mesh)
  got_leaves, got_tree = jax.tree_util.tree_flatten(got)
  want_leaves, want_tree = jax.tree_util.tree_flatten(want)
  assert got_tree == want_tree
  for g, w, host in zip(got_leaves, want_leaves, jax.tree_util.tree_leaves(batch)):
    assert (g.shape, g.dtype, g.sharding) == (w.shape, w.dtype, w.sharding)
    np.testing.assert_array_equal(bits(g), bits(host))
    # Device d holds its own share of every array.
    for shard in g.addressable_shards:
      d = mesh.devices.tolist().index(shard.device)
      part = host.shape[0] // DEVICES
      np.testing.assert_array_equal(bits(shard.data), bits(host[d * part : (d + 1) * part]))


def test_row_d_holds_device_d_share_of_every_array_aligned():
  batch = host_batch()
  packed = device_buffer.pack_batch(batch, DEVICES)
  layout = packed.layout
  assert packed.data.shape == (DEVICES, layout.words) and packed.data.dtype == np.int32
  assert layout.words % 16 == 0
  assert [offset % 16 for offset, _, _ in layout.parts] == [0] * len(layout.parts)
  assert [shape for _, shape, _ in layout.parts][:2] == [(2,), (2, 3)]  # labels, dense
  for i, host in enumerate(jax.tree_util.tree_leaves(batch)):
    view = layout.host_leaf(packed.data, i)
    np.testing.assert_array_equal(bits(view.reshape(host.shape)), bits(host))


def test_the_batch_is_placed_in_one_transfer(monkeypatch):
  """Per-array placement made 10 transfers of this batch (labels, dense, 4 COO
  fields of 2 stacks); packed, one."""
  mesh = core.make_mesh()
  calls = _record_transfers(monkeypatch)
  packed = device_buffer.pack_batch(host_batch(), DEVICES)
  place = pipeline.make_placement(mesh)
  stats = core.SparseDenseMatmulInputStats({}, {})
  placed = place(transforms.PreprocessedBatch(packed, stats, 0))
  assert calls == [(DEVICES * packed.layout.words,)]
  assert placed.stats is stats
  assert isinstance(placed.batch, pipeline.DevicePackedBatch)
  assert placed.batch.layout == packed.layout


def test_labels_of_a_packed_batch_are_checked_on_the_host():
  batch = host_batch()
  batch = batch._replace(labels=np.where(np.arange(16) == 9, 5.0, 0.0).astype(np.float32))
  place = pipeline.make_placement(core.make_mesh(), label_range=(0.0, 1.0), where="dataset 'x'")
  element = transforms.PreprocessedBatch(device_buffer.pack_batch(batch, DEVICES), None, 0)
  with pytest.raises(
    pipeline.LabelRangeError,
    match=r"^labels outside \[0, 1\] in dataset 'x': a batch has labels from 0 to 5"
    r" \(non-finite: 0\)",
  ):
    place(element)


def test_arrays_packing_cannot_take_are_named():
  batch = host_batch()
  with pytest.raises(
    ValueError,
    match=r"^batch array \.dense has shape \(15, 3\): its leading dimension must be a multiple"
    r" of the 8 local devices$",
  ):
    device_buffer.pack_batch(batch._replace(dense=batch.dense[:15]), DEVICES)
  with pytest.raises(
    ValueError, match=r"^batch array \.labels has dtype float64: packing takes 4-byte dtypes$"
  ):
    device_buffer.pack_batch(batch._replace(labels=batch.labels.astype(np.float64)), DEVICES)


def test_the_train_input_places_each_batch_in_one_transfer(tmp_path, monkeypatch):
  """The job's input packs its batches where they are made (here: the read-ahead
  threads) and places each in one transfer; it placed 2 + 4 * 3 stacks = 14
  arrays one by one before. The batches are the host input's, bit for bit."""
  features = (data.SyntheticFeature("a", 40, 1, 3), data.SyntheticFeature("b", 24, 0, 4))
  path = str(tmp_path / "ds")
  datasets.write_numbered(path, features, 64, 4, max_records_per_shard=8)
  specs = datasets.feature_specs(features, 16, DEVICES, 2, limit=64)
  config = transforms.InputConfig(path, 16, num_sc_per_device=2)
  calls = _record_transfers(monkeypatch)
  it = pipeline.make_train_input(config, specs, core.make_mesh())
  host = transforms.make_host_input(
    config, specs, local_device_count=DEVICES, global_device_count=DEVICES
  )
  for _ in range(3):
    got, want = next(it).unpacked(), next(host).batch
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
      np.testing.assert_array_equal(bits(g), bits(w))
  it.close()
  host.close()
  # Every transfer (3 batches, and those placed ahead) is one packed buffer [8 * W].
  assert len(calls) >= 3 and len(set(calls)) == 1
  (shape,) = set(calls)
  assert len(shape) == 1 and shape[0] % (DEVICES * 16) == 0


def _record_transfers(monkeypatch):
  """The shapes of the host arrays placed with make_array_from_process_local_data, in order."""
  calls = []
  real = jax.make_array_from_process_local_data

  def counting(sharding, local_data, *args):
    calls.append(np.shape(local_data))
    return real(sharding, local_data, *args)

  monkeypatch.setattr(jax, "make_array_from_process_local_data", counting)
  return calls


def test_a_batch_without_dense_columns_is_placed_sharded_like_the_labels():
  """Dense [B, 0] (a dataset of no dense columns, e.g. MovieLens) came out of the split
  replicated, and the train step refused it on more than one device."""
  mesh = core.make_mesh()
  batch = host_batch()._replace(dense=np.zeros((16, 0), np.float32))
  placed = device_buffer.place_packed(device_buffer.pack_batch(batch, DEVICES), mesh)
  placed = placed.unpacked()
  want = pipeline.to_global_batch(batch, mesh)
  assert placed.dense.shape == (16, 0)
  for got, wanted in zip(jax.tree_util.tree_leaves(placed), jax.tree_util.tree_leaves(want)):
    assert got.sharding == wanted.sharding, (got.shape, got.sharding)

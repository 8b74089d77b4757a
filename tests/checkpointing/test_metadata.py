"""Checkpoint metadata, compatibility checks, digests and fingerprints."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sparsepipe.checkpointing import CheckpointMetadata
from sparsepipe.checkpointing import ConfigMismatchError
from sparsepipe.checkpointing import CorruptCheckpointError
from sparsepipe.checkpointing import CHECKPOINT_FORMAT_VERSION
from sparsepipe.checkpointing import IncompatibleCheckpointError
from sparsepipe.checkpointing import LoopPosition
from sparsepipe.checkpointing import RunInfo
from sparsepipe.checkpointing import abstract_of
from sparsepipe.checkpointing.integrity import fingerprint
from sparsepipe.checkpointing.integrity import host_fingerprint
from sparsepipe.checkpointing.integrity import digests as integrity
from sparsepipe.checkpointing import on_mesh
from sparsepipe.checkpointing.metadata import check_compatible
from sparsepipe.checkpointing.metadata import config_differences
from sparsepipe.checkpointing.metadata import UNSET
from sparsepipe.checkpointing.metadata import to_json_value

WHERE = "checkpoint at /x step 40"


def mesh_of(count, axes=("data",)):
  return Mesh(np.asarray(jax.devices()[:count]).reshape((count,) + (1,) * (len(axes) - 1)), axes)


def test_config_to_json_values():
  config = ml_collections.ConfigDict(
    {"model": {"dims": (16, 8), "rate": np.float32(0.5)}, "name": "x"}
  )
  assert to_json_value(config) == {
    "model": {"dims": [16, 8], "rate": 0.5},
    "name": "x",
  }
  with pytest.raises(ValueError, match=r"config.model.init is a function"):
    to_json_value({"model": {"init": lambda: 0}})
  with pytest.raises(ValueError, match="config has a non-string key 3"):
    to_json_value({3: 1})


def test_config_differences_with_mutable_keys():
  saved = {"model": {"dim": 16, "act": "relu"}, "num_steps": 10, "checkpoint": {"every": 5}}
  current = {"model": {"dim": 32}, "num_steps": 20, "checkpoint": {"every": 7}, "new": 1}
  assert config_differences(saved, current, ("config.num_steps", "config.checkpoint.*")) == [
    ("config.model.act", "relu", UNSET),
    ("config.model.dim", 16, 32),
    ("config.new", UNSET, 1),
  ]


def test_a_path_key_equals_where_it_names_the_same_place(tmp_path, monkeypatch):
  """A step saved with a relative data.dir resumes with it made absolute (and the
  other way round) from the directory it names it from; another place differs."""
  monkeypatch.chdir(tmp_path)
  paths = ("config.data.dir",)
  saved = {"data": {"dir": "crit"}}
  assert config_differences(saved, {"data": {"dir": str(tmp_path / "crit")}}, (), None, paths) == []
  assert config_differences({"data": {"dir": str(tmp_path / "crit")}}, saved, (), None, paths) == []
  elsewhere = {"data": {"dir": "/data/crit"}}
  assert config_differences(saved, elsewhere, (), None, paths) == [
    ("config.data.dir", "crit", "/data/crit")
  ]
  absolute = {"data": {"dir": str(tmp_path / "crit")}}
  assert config_differences(saved, absolute) == [
    ("config.data.dir", "crit", str(tmp_path / "crit"))
  ]
  assert config_differences({"data": {"dir": ""}}, absolute, (), None, paths) == [
    ("config.data.dir", "", str(tmp_path / "crit"))
  ]


def test_a_key_added_since_the_save_equals_its_former_behaviour_only():
  """A job saved before config.data.shuffle_window existed resumes with 0 (what it did)."""
  saved = {"data": {"shuffle": True}}
  added = {"config.data.shuffle_window": 0}
  same = {"data": {"shuffle": True, "shuffle_window": 0}}
  other = {"data": {"shuffle": True, "shuffle_window": 4}}
  assert config_differences(saved, same, (), added) == []
  assert config_differences(saved, other, (), added) == [("config.data.shuffle_window", 0, 4)]
  assert config_differences(saved, same) == [("config.data.shuffle_window", UNSET, 0)]
  with pytest.raises(ConfigMismatchError, match=r"config.data.shuffle_window=0, current run has 4"):
    check_compatible(
      metadata(config=saved),
      run_info(config=other),
      where="w",
      added_config_keys=added,
    )
  check_compatible(
    metadata(config=saved), run_info(config=same), where="w", added_config_keys=added
  )


def run_info(**changes):
  base = dict(
    config={"model": {"embedding_dim": 16}},
    mesh_shape={"data": 8},
    process_count=1,
    data_worker_count=2,
  )
  base.update(changes)
  return RunInfo(**base)


def metadata(**changes):
  return CheckpointMetadata(
    run_info(**changes), LoopPosition(40, 38, False), {"s": {"max_ids_per_partition": 8}}
  )


def test_metadata_json_round_trip():
  meta = metadata()
  data = meta.to_json()
  assert data["format_version"] == CHECKPOINT_FORMAT_VERSION
  assert CheckpointMetadata.from_json(data, WHERE) == meta
  flying = CheckpointMetadata(meta.run, LoopPosition(40, 38, False, in_flight=(37, None)), {})
  assert flying.to_json()["in_flight"] == [37, None]
  assert CheckpointMetadata.from_json(flying.to_json(), WHERE) == flying


def test_the_training_data_copy_round_trips_and_is_none_in_older_steps():
  manifest = {"format": "m", "schema": {"sparse": [{"name": "a"}]}, "info": {"x": [1.5]}}
  meta = CheckpointMetadata(run_info(), LoopPosition(4, 4), {}, training_data=manifest)
  assert CheckpointMetadata.from_json(meta.to_json(), WHERE).training_data == manifest
  older = metadata().to_json()
  del older["training_data"]  # steps of 0.3 and earlier
  assert CheckpointMetadata.from_json(older, WHERE).training_data is None
  older["training_data"] = ["not", "an", "object"]
  with pytest.raises(
    CorruptCheckpointError, match=f"^{WHERE}: metadata 'training_data' is list, not a JSON object$"
  ):
    CheckpointMetadata.from_json(older, WHERE)


@pytest.mark.parametrize("value", [[1], [1, -2], "x", [1.5, None]])
def test_malformed_in_flight_batches_are_corruption(value):
  data = metadata().to_json()
  data["in_flight"] = value
  with pytest.raises(
    CorruptCheckpointError, match=rf"^{WHERE}: metadata 'in_flight' is .*, not 2 batch indices$"
  ):
    CheckpointMetadata.from_json(data, WHERE)


@pytest.mark.parametrize(
  "change, message",
  [
    (lambda d: d.pop("pipeline_step"), "metadata has no 'pipeline_step'"),
    (lambda d: d.update(process_count="1"), "metadata 'process_count' is '1', not a int"),
    (lambda d: d.update(batches_consumed=True), "metadata 'batches_consumed' is True, not a int"),
  ],
)
def test_malformed_metadata_is_corrupt(change, message):
  data = metadata().to_json()
  change(data)
  with pytest.raises(CorruptCheckpointError, match=f"^{WHERE}: {message}$"):
    CheckpointMetadata.from_json(data, WHERE)


def test_newer_format_is_incompatible():
  data = metadata().to_json()
  data["format_version"] = CHECKPOINT_FORMAT_VERSION + 1
  with pytest.raises(
    IncompatibleCheckpointError,
    match=f"^{WHERE} has format_version {CHECKPOINT_FORMAT_VERSION + 1}; this sparsepipe"
    f" reads format_version {CHECKPOINT_FORMAT_VERSION} and older$",
  ):
    CheckpointMetadata.from_json(data, WHERE)


@pytest.mark.parametrize(
  "current, message",
  [
    (
      run_info(config={"model": {"embedding_dim": 32}}),
      "checkpoint at /x step 40 was written with another config:"
      " config.model.embedding_dim=16, current run has 32",
    ),
    (
      run_info(mesh_shape={"data": 4, "model": 2}),
      "checkpoint at /x step 40 was written on a mesh with axes ('data',),"
      " current mesh has axes ('data', 'model')",
    ),
  ],
)
def test_incompatible_messages(current, message):
  with pytest.raises(IncompatibleCheckpointError) as info:
    check_compatible(metadata(), current, where=WHERE)
  assert str(info.value) == message


def test_a_config_mismatch_names_the_first_three_differences_and_keeps_all():
  saved = metadata()
  current = run_info(config={"model": {"embedding_dim": 8}, "a": 1, "b": [2], "c": "x", "d": None})
  with pytest.raises(ConfigMismatchError) as info:
    check_compatible(saved, current, where=WHERE)
  assert str(info.value) == (
    "checkpoint at /x step 40 was written with another config: config.a=(unset), current run"
    ' has 1; config.b=(unset), current run has [2]; config.c=(unset), current run has "x"'
    " (and 2 more)"
  )
  assert info.value.differences[3:] == [
    ("config.d", "(unset)", "null"),
    ("config.model.embedding_dim", "16", "8"),
  ]


def test_device_count_alone_is_compatible():
  check_compatible(metadata(), run_info(mesh_shape={"data": 4}), where=WHERE)


def test_run_info_create():
  info = RunInfo.create({"a": (1, 2)}, mesh_of(4), data_worker_count=3)
  assert info == RunInfo({"a": [1, 2]}, {"data": 4}, 1, 3)
  assert info.device_count == 4


def test_seal_and_digests():
  data = {"b": 1, "a": [1.5, None, "x"]}
  sealed = integrity.seal(data)
  assert integrity.unseal(sealed, what="m", where=WHERE) == data
  assert integrity.digest({"a": [1.5, None, "x"], "b": 1}) == integrity.digest(data)
  sealed["b"] = 2
  with pytest.raises(CorruptCheckpointError, match="m does not match its sha256"):
    integrity.unseal(sealed, what="m", where=WHERE)
  with pytest.raises(ValueError, match="reserved key 'sha256'"):
    integrity.seal({"sha256": 1})


def _fp(x):
  return fingerprint.resolve(fingerprint.tree_fingerprints({"x": x}))["x"]


def test_fingerprint_ignores_sharding_and_device_count():
  x = np.arange(64 * 3, dtype=np.float32).reshape(64, 3) / 7
  want = _fp(x)
  for count in (8, 4, 1):
    mesh = mesh_of(count)
    for spec in (P("data"), P()):
      assert _fp(jax.device_put(x, NamedSharding(mesh, spec))) == want


def test_fingerprint_holds_row_sums_not_a_copy_of_the_array():
  # XLA:CPU split the one reduction over all elements into a tree that stored every
  # term first: a restore's check held a second copy of the state at once.
  mesh = mesh_of(8)
  table = jax.ShapeDtypeStruct((8 * 2**16, 16), np.float32, sharding=NamedSharding(mesh, P("data")))
  compiled = fingerprint._fingerprint_fn(mesh, 1).lower([table]).compile()  # pylint: disable=protected-access
  shard_rows = 2**16
  # a uint32 per row and the reduction tree's levels above them; the shard is 4 MiB
  assert compiled.memory_analysis().temp_size_in_bytes <= shard_rows * 4 * 5 // 4


@pytest.mark.parametrize("dtype", [np.float32, np.int32, jnp.bfloat16, np.int8, np.uint32, bool])
def test_fingerprint_sees_every_single_change(dtype):
  x = (np.arange(24) % 2 == 0) if dtype is bool else np.arange(24).astype(dtype)
  x = np.asarray(x).reshape(4, 6)
  seen = {_fp(x)}
  for i in range(x.size):
    y = x.copy().reshape(-1)
    y[i] = (not y[i]) if dtype is bool else y[i] + 1
    seen.add(_fp(y.reshape(4, 6)))
  swapped = x.copy().reshape(-1)
  swapped[[0, 1]] = swapped[[1, 0]]
  seen.add(_fp(swapped.reshape(4, 6)))
  assert len(seen) == x.size + 2


def test_verify_names_the_leaf():
  tree = {"a": {"w": np.ones((4,), np.float32)}}
  expected = fingerprint.resolve(fingerprint.tree_fingerprints(tree))
  fingerprint.verify(tree, expected, item="train_state", where=WHERE)
  tree["a"]["w"] = np.array([1, 1, 1, 2], np.float32)
  with pytest.raises(
    CorruptCheckpointError,
    match=f"^{WHERE}: item 'train_state' leaf 'a/w' restored with fingerprint"
    f" [0-9a-f]{{8}}, saved {expected['a/w']} \\(garbled data file\\)$",
  ):
    fingerprint.verify(tree, expected, item="train_state", where=WHERE)
  with pytest.raises(
    ValueError, match="item 'x' leaf 'n' is a int; checkpointed trees hold arrays"
  ):
    fingerprint.tree_fingerprints({"n": 3}, "x")


def test_abstract_of_and_on_mesh():
  x = jax.device_put(np.zeros((8, 2), np.float32), NamedSharding(mesh_of(8), P("data")))
  (a,) = jax.tree.leaves(abstract_of({"x": x}))
  assert (a.shape, a.dtype, a.sharding) == ((8, 2), np.float32, x.sharding)
  (b,) = jax.tree.leaves(on_mesh({"x": a}, mesh_of(4)))
  assert b.sharding == NamedSharding(mesh_of(4), P("data"))
  assert (b.shape, b.dtype) == (a.shape, a.dtype)


def _host_fingerprints(tree, groups=1):
  """Partial sums of the shards split over `groups` pretend processes, combined."""
  shards = host_fingerprint.take_shards(tree, "x")
  parts = [{path: members[g::groups] for path, members in shards.items()} for g in range(groups)]
  return host_fingerprint.combine(host_fingerprint.partial_sums(p) for p in parts)


@pytest.mark.parametrize("chunk_words", [5, 1 << 16])
def test_host_partial_sums_add_up_to_the_device_fingerprint(monkeypatch, chunk_words):
  monkeypatch.setattr(host_fingerprint, "_CHUNK_WORDS", chunk_words)
  rng = np.random.default_rng(0)
  mesh = jax.make_mesh((4, 2), ("a", "b"), devices=jax.devices()[:8])
  put = lambda x, *spec: jax.device_put(x, NamedSharding(mesh, P(*spec)))
  tree = {
    "blocks": put(rng.standard_normal((64, 24)).astype(np.float32), "a", "b"),
    "replicated": put(rng.standard_normal((16, 3)).astype(np.float32)),
    "rows": put(rng.integers(0, 100, (32,)).astype(np.int32), "a"),
    "bf16": put(jnp.asarray(rng.standard_normal((8, 4)), jnp.bfloat16), None, "b"),
    "int8": put(rng.integers(-100, 100, (8, 5, 3)).astype(np.int8), "a"),
    "bool": put(rng.integers(0, 2, (8,)).astype(bool), "a"),
    "scalar": put(np.int32(7)),
    "host": np.arange(10, dtype=np.uint32),
  }
  want = fingerprint.resolve(fingerprint.tree_fingerprints(tree))
  assert _host_fingerprints(tree) == want
  assert _host_fingerprints(tree, groups=3) == want


@pytest.mark.parametrize(
  "current",
  [run_info(data_worker_count=3), run_info(process_count=4), run_info(mesh_shape={"data": 2})],
)
def test_other_worker_process_and_device_counts_are_compatible(current):
  # Batches depend on none of them (0.3): a resumed job may change each.
  check_compatible(metadata(), current, where="checkpoint at /x step 40")

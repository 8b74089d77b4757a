"""Restoring onto another device count (8 <-> 4 devices, as sub-meshes).

The state is made of the real pieces: a ZeRO Adam state (flat leaves padded
to a multiple of the device count) and MOD-laid-out embedding tables with
Adagrad slots, two of them stacked with a rotation. The tables hold the same
logical values on every device count (fixed arrays, laid out for it), so a
restore must give exactly the state laid out for the current devices.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import checkpoint_toy as toy
from sparsepipe.checkpointing import IncompatibleCheckpointError
from sparsepipe.checkpointing import LoopPosition
from sparsepipe.checkpointing import RestoreTargets
from sparsepipe.checkpointing import RunInfo
from sparsepipe.checkpointing import TrainingCheckpointManager
from sparsepipe.checkpointing import CheckpointItems
from sparsepipe.checkpointing import embedding_relayout
from sparsepipe.pipeline import abstract_embedding_variables
from sparsepipe.pipeline import EmbeddingVariables
from sparsepipe.pipeline import stack_embedding_variables
from sparsepipe.core import make_mesh
from sparsepipe.pipeline import abstract_train_state
from sparsepipe.pipeline import zero_sharded
from sparsepipe.core import AdagradOptimizerSpec
from sparsepipe.core import FeatureSpec
from sparsepipe.core import TableSpec
from sparsepipe.transforms.stacking import stack_tables

S = 2  # SparseCores per device
CONFIG = {"model": {"num_sc_per_device": S}}
ADAM = optax.adam(0.1)
PARAMS = {"w": jnp.arange(20.0).reshape(5, 4) / 7, "b": jnp.ones(3)}
GRADS = {"w": jnp.cos(jnp.arange(20.0)).reshape(5, 4), "b": jnp.array([1.0, -2.0, 3.0])}
_RNG = np.random.default_rng(3)
# The logical tables and Adagrad slots of feature_specs (its shapes).
LOGICAL_TABLES = {
  name: EmbeddingVariables(
    _RNG.normal(0.0, 0.05, shape).astype(np.float32),
    (_RNG.uniform(0.1, 1.0, shape).astype(np.float32),),
  )
  for name, shape in {"t_a": (100, 8), "t_b": (40, 12), "t_c": (100, 4)}.items()
}


def mesh_of(count):
  return make_mesh(jax.devices()[:count])


def feature_specs(devices):
  """t_a and t_b in one stack (offsets and rotation depend on N; dims 8 and
  12, both padded to 16), t_c alone (128 padded rows on 8 and on 4 devices:
  same shape, other layout)."""
  opt = AdagradOptimizerSpec(learning_rate=0.1, initial_accumulator_value=0.5)
  a = TableSpec("t_a", vocabulary_size=100, embedding_dim=8, optimizer=opt)
  b = TableSpec("t_b", vocabulary_size=40, embedding_dim=12, optimizer=opt)
  c = TableSpec("t_c", vocabulary_size=100, embedding_dim=4, optimizer=opt)
  specs = {
    "f_a": FeatureSpec("f_a", a, (32, 1), (32, 8)),
    "f_b": FeatureSpec("f_b", b, (32, 1), (32, 12)),
    "f_c": FeatureSpec("f_c", c, (32, 1), (32, 4)),
  }
  specs = stack_tables(specs, ["t_a", "t_b"], devices, S, stack_name="ab")
  return stack_tables(specs, ["t_c"], devices, S)


@functools.lru_cache(maxsize=None)
def state_on(count):
  """(train_state, embeddings, pipeline_state) on `count` devices after one
  ZeRO Adam update (cached: building it compiles several programs)."""
  mesh = mesh_of(count)
  rep = NamedSharding(mesh, P())
  params = jax.device_put(PARAMS, rep)
  zero = zero_sharded(ADAM, mesh)
  opt = jax.jit(zero.init)(params)
  updates, opt = jax.jit(zero.update)(jax.device_put(GRADS, rep), opt, params)
  params = optax.apply_updates(params, updates)
  train = {"params": params, "opt": opt, "step": jax.device_put(jnp.int32(1), rep)}
  embeddings = stack_embedding_variables(
    LOGICAL_TABLES, feature_specs(mesh.size), mesh, num_sc_per_device=S
  )
  buffer = jnp.zeros((2 * mesh.size,))
  pipeline = {"buffer": jax.device_put(buffer, NamedSharding(mesh, P("data")))}
  return train, embeddings, pipeline


def abstract_state_on(mesh):
  """Restore targets built from specs alone (nothing allocated)."""
  rep = NamedSharding(mesh, P())
  struct = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep)
  train = {
    "params": jax.tree.map(struct, PARAMS),
    "opt": abstract_train_state(zero_sharded(ADAM, mesh), PARAMS, mesh, None).opt_state,
    "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=rep),
  }
  embeddings = abstract_embedding_variables(feature_specs(mesh.size), mesh, num_sc_per_device=S)
  buffer = jax.ShapeDtypeStruct(
    (2 * mesh.size,), jnp.float32, sharding=NamedSharding(mesh, P("data"))
  )
  return train, embeddings, {"buffer": buffer}


def relayouts_for(mesh):
  return {
    "embeddings": embedding_relayout(
      feature_specs(mesh.size),
      mesh,
      num_sc_per_device=S,
      saved_feature_specs=feature_specs,
    )
  }


def save_on(directory, mesh, state, *, drained=True, step=7):
  run = RunInfo.create(CONFIG, mesh, data_worker_count=0)
  with TrainingCheckpointManager(directory, run) as manager:
    manager.save(
      step,
      CheckpointItems(*state, toy.make_iterator(), {"limits": {}}),
      LoopPosition(pipeline_step=step, batches_consumed=step, pipeline_drained=drained),
      force=True,
    )


def restore_on(directory, mesh, relayouts=None):
  run = RunInfo.create(CONFIG, mesh, data_worker_count=0)
  with TrainingCheckpointManager(directory, run) as manager:
    return manager.restore(
      RestoreTargets(*abstract_state_on(mesh), toy.make_iterator()),
      relayouts=relayouts_for(mesh) if relayouts is None else relayouts,
    )


@pytest.mark.parametrize("saved, current", [(8, 4), (4, 8)])
def test_device_count_change_is_exact(tmp_path, saved, current):
  save_on(tmp_path / "c", mesh_of(saved), state_on(saved))
  restored = restore_on(tmp_path / "c", mesh_of(current))
  assert restored.relaid_out == ("train_state", "embeddings")
  assert restored.pipeline_state is None  # drained: start a fresh one
  assert restored.metadata.run.mesh_shape == {"data": saved}
  # Exactly the state that the same computation gives on `current` devices:
  # ZeRO padding cut or extended, embedding rows moved to their new SCs.
  train, embeddings, _ = state_on(current)
  toy.assert_same_trees(restored.train_state, train)
  toy.assert_same_trees(restored.embeddings, embeddings)
  flat = restored.train_state["opt"][0].mu["w"]
  assert flat.shape == ({4: (20,), 8: (24,)}[current])


def test_embedding_layout_really_differs_between_device_counts():
  """Guards the test above: a plain copy would not pass it (same shape)."""
  eight = state_on(8)[1]["t_c"].table
  four = state_on(4)[1]["t_c"].table
  assert eight.shape == four.shape
  assert not np.array_equal(np.asarray(eight), np.asarray(four))


def test_undrained_pipeline_restores_on_same_device_count(tmp_path):
  state = state_on(4)
  save_on(tmp_path / "c", mesh_of(4), state, drained=False)
  restored = restore_on(tmp_path / "c", mesh_of(4))
  assert restored.relaid_out == ()
  toy.assert_same_trees(restored.pipeline_state, state[2])


def with_nonzero_padding(state):
  """The ZeRO Adam mu of 'w' with its padding tail no longer zero."""
  train, embeddings, pipeline = state
  opt = train["opt"]
  mu = dict(opt[0].mu)
  mu["w"] = mu["w"] + 1.0
  return {**train, "opt": (opt[0]._replace(mu=mu), *opt[1:])}, embeddings, pipeline


@pytest.mark.parametrize(
  "change, drained, relayouts, message",
  [
    (
      None,
      False,
      None,
      ": item 'pipeline_state' was saved for 8 devices and the current mesh"
      " has 4; its layout depends on the device count and no relayout was"
      " given for it (pass relayouts={'pipeline_state': ...}, e.g."
      " embedding_relayout, pipeline_state_relayout)",
    ),
    (
      None,
      True,
      {},
      ": item 'embeddings' was saved for 8 devices and the current mesh"
      " has 4; its layout depends on the device count and no relayout"
      " was given for it (pass relayouts={'embeddings': ...}, e.g."
      " embedding_relayout, pipeline_state_relayout)",
    ),
    (
      with_nonzero_padding,
      True,
      None,
      ": cannot re-lay out item 'train_state' leaf 'opt/0/mu/w' from"
      " shape (24,) (8 devices) to (20,) (4 devices): the cut part holds"
      " nonzero values, so it is not zero padding",
    ),
  ],
  ids=["undrained pipeline", "no embedding relayout", "nonzero padding"],
)
def test_device_change_refusals(tmp_path, change, drained, relayouts, message):
  state = change(state_on(8)) if change else state_on(8)
  save_on(tmp_path / "c", mesh_of(8), state, drained=drained)
  with pytest.raises(IncompatibleCheckpointError) as info:
    restore_on(tmp_path / "c", mesh_of(4), relayouts=relayouts)
  where = f"checkpoint at {tmp_path / 'c'} step 7"
  assert str(info.value) == where + message

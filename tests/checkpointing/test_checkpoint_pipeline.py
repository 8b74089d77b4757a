"""Checkpoints of the real training state: TrainState (ZeRO) and PipelineState.

A DLRM trained with the pipelined step (default SC stages, ZeRO Adam) is
saved mid-pipeline, restored into targets built from specs alone
(abstract_train_state, Trainer.abstract_pipeline_state), and the
next pipeline step from the restored state equals the one from the
original state bit for bit.
"""

import jax
import optax
import pytest

import checkpoint_toy as toy
from sparsepipe import core
from sparsepipe import pipeline
from sparsepipe import transforms
from sparsepipe.checkpointing import IncompatibleCheckpointError
from sparsepipe.checkpointing import LoopPosition
from sparsepipe.checkpointing import RestoreTargets
from sparsepipe.checkpointing import RunInfo
from sparsepipe.checkpointing import TrainingCheckpointManager
from sparsepipe.checkpointing import CheckpointItems

S = 2
BATCH = 32
NUM_DENSE = 4
NUM_BATCHES = 4
CONFIG = {"num_sc_per_device": S, "batch": BATCH}


def feature_specs(devices):
  opt = core.AdagradOptimizerSpec(learning_rate=0.1)
  tables = [
    core.TableSpec(name, vocabulary_size=vocab, embedding_dim=8, optimizer=opt)
    for name, vocab in (("t_a", 100), ("t_b", 64))
  ]
  specs = {t.name: core.FeatureSpec(f"f_{t.name}", t, (BATCH, 2), (BATCH, 8)) for t in tables}
  return transforms.prepare_feature_specs_for_training(specs, devices, S)


class Setup:
  """Model, trainer and initial state on the first `devices` devices."""

  def __init__(self, devices):
    self.mesh = core.make_mesh(jax.devices()[:devices])
    self.specs = feature_specs(devices)
    model = pipeline.DLRM(bottom_mlp_dims=(16, 8), top_mlp_dims=(8,))
    self.zero = pipeline.zero_sharded(optax.adam(0.01), self.mesh)
    params = model.init(jax.random.key(1), NUM_DENSE, pipeline.feature_dims_of(self.specs))
    self.params_shape = jax.eval_shape(lambda: params)
    embeddings = pipeline.init_embedding_variables(
      jax.random.key(2), self.specs, self.mesh, num_sc_per_device=S
    )
    self.train_state = pipeline.create_train_state(self.zero, params, self.mesh, embeddings)
    example = pipeline.abstract_train_batch(
      self.specs,
      self.mesh,
      global_batch_size=BATCH,
      num_dense=NUM_DENSE,
      num_sc_per_device=S,
    )
    self.trainer = pipeline.make_trainer(
      self.mesh,
      self.train_state,
      example,
      pipeline.make_tc_stage(model, self.zero, self.mesh, self.specs),
      feature_specs=self.specs,
      num_sc_per_device=S,
      gradient_multiplier=True,
    )

  def abstract_train_state(self):
    embeddings = pipeline.abstract_embedding_variables(self.specs, self.mesh, num_sc_per_device=S)
    return pipeline.abstract_train_state(self.zero, self.params_shape, self.mesh, embeddings)

  def step(self, train_state, pipeline_state):
    return self.trainer.run_pipeline_step(
      train_state, pipeline_state, None, False, num_batches=NUM_BATCHES
    )


def split(train_state):
  return train_state.replace(embedding_variables=None), train_state.embedding_variables


def run_info(setup):
  return RunInfo.create(CONFIG, setup.mesh, data_worker_count=0)


def copy_of(tree):
  """A device copy (the step donates its inputs)."""
  return jax.tree.map(lambda x: x.copy(), tree)


def save(directory, setup, train_state, pipeline_state, *, drained):
  dense, embeddings = split(train_state)
  step = int(pipeline_state.pipeline_step)
  with TrainingCheckpointManager(directory, run_info(setup)) as manager:
    manager.save(
      step,
      CheckpointItems(dense, embeddings, pipeline_state, toy.make_iterator(), {}),
      LoopPosition(step, step, pipeline_drained=drained),
      force=True,
    )
  return step


def restore(directory, setup):
  """Restores with targets built when the step's metadata is known."""
  seen = []

  def targets(metadata):
    seen.append(metadata.progress)
    dense, embeddings = split(setup.abstract_train_state())
    return RestoreTargets(
      dense,
      embeddings,
      setup.trainer.abstract_pipeline_state,
      toy.make_iterator(),
    )

  with TrainingCheckpointManager(directory, run_info(setup)) as manager:
    restored = manager.restore(targets)
  assert seen == [restored.metadata.progress]
  return restored


@pytest.fixture(name="midway", scope="module")
def fixture_midway(tmp_path_factory):
  """The 8-device state after 2 pipeline steps, saved; and the next step."""
  setup = Setup(8)
  train_state = copy_of(setup.train_state)
  pipeline_state = setup.trainer.initial_pipeline_state()
  for _ in range(2):
    train_state, pipeline_state, _ = setup.step(train_state, pipeline_state)
  directory = tmp_path_factory.mktemp("midway") / "ckpt"
  saved = copy_of((train_state, pipeline_state))
  save(directory, setup, train_state, pipeline_state, drained=False)
  following = setup.step(train_state, pipeline_state)
  return setup, directory, saved, following


def test_pipeline_state_round_trip_and_resume_is_exact(midway):
  setup, directory, (train_state, pipeline_state), following = midway
  restored = restore(directory, setup)
  assert restored.step == 2
  got = setup.trainer.abstract_pipeline_state
  assert jax.tree.structure(restored.pipeline_state) == jax.tree.structure(got)
  toy.assert_same_trees(restored.pipeline_state, pipeline_state)
  dense, embeddings = split(train_state)
  toy.assert_same_trees(restored.train_state, dense)
  toy.assert_same_trees(restored.embeddings, embeddings)
  resumed_train = restored.train_state.replace(embedding_variables=restored.embeddings)
  resumed = setup.step(resumed_train, restored.pipeline_state)
  toy.assert_same_trees(resumed, following)


def test_buffered_pipeline_without_a_relayout_refuses_another_device_count(midway):
  """Refused from the metadata alone: the targets are never built."""
  _, directory, _, _ = midway
  mesh = core.make_mesh(jax.devices()[:4])
  run = RunInfo.create(CONFIG, mesh, data_worker_count=0)

  def targets(metadata):
    raise AssertionError(f"targets built for {metadata}")

  with TrainingCheckpointManager(directory, run) as manager:
    with pytest.raises(
      IncompatibleCheckpointError,
      match=r"item 'pipeline_state' was saved for 8 devices and the current mesh has 4; its"
      r" layout depends on the device count and no relayout was given for it",
    ):
      manager.restore(targets)

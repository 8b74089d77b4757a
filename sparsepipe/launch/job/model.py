"""What a job trains, built from its config: specs, model, trainer, input, states.

Everything that depends on the COO limits (the trainer's programs and the
input pipeline's buffer shapes) is built per set of feature specs, so FDO
and restore can rebuild it for other limits.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from sparsepipe import data
from sparsepipe import pipeline
from sparsepipe import transforms
from sparsepipe.launch.config import config_specs
from sparsepipe.launch.config.pipelining import resolve_pipelining
from sparsepipe.launch.config.from_manifest import check_max_ids, check_vocab_sizes


@dataclasses.dataclass
class Setup:
  """The parts of a job that depend on the current COO limits."""

  feature_specs: Any
  trainer: pipeline.Trainer
  iterator: transforms.InputIterator

  def close(self) -> None:
    close_iterator(self.iterator)


def close_iterator(iterator: Any) -> None:
  """Stops an input iterator's workers (if it has any)."""
  close = getattr(iterator, "close", None)
  if close is not None:
    close()


class JobModel:
  """The config's model on a mesh: feature specs, model, optimizers, input.

  `manifest` describes the training data (at `manifest.directory`): read from
  the dataset by a training job, or a checkpoint's copy of it where export and
  evaluate run without the data (checkpoints.training_manifest).
  """

  def __init__(self, config: Any, manifest: data.Manifest, mesh: jax.sharding.Mesh):
    self.config = config
    self.mesh = mesh
    self.manifest = manifest
    self.num_sc = int(config.num_sc_per_device)
    self.global_batch = config_specs.global_batch_size(config, jax.process_count())
    check_max_ids(config, manifest)
    check_vocab_sizes(config, manifest)
    self.num_dense = manifest.schema.num_dense
    # What the data's manifest says, for the job's first lines (announce.py).
    self.ids_per_example = dict(manifest.info.get("ids_per_example") or {})
    self.dense_warnings = data.scale_warnings(manifest.info)
    self.epoch_examples = manifest.num_examples
    self.base_specs = self.feature_specs_for(mesh.size)
    self.model = pipeline.make_model(config.model)
    self.feature_dims = pipeline.feature_dims_of(self.base_specs)
    self.dense_optimizer = config_specs.dense_optimizer(config, mesh)
    # The specs' names and order only (limits do not matter to the model).
    self.tc_stage = pipeline.make_tc_stage(self.model, self.dense_optimizer, mesh, self.base_specs)
    self.input_config = config_specs.input_config(config, manifest.directory)
    # The job's FDO retune points (RetunePoints.last_at_or_before), set once it
    # has a schedule: the input then switches limits at them without a restart.
    # Its workers receive it, so it is of the transforms layer, not the job's.
    self.last_retune: Any = None

  def feature_specs_for(self, global_device_count: int) -> Any:
    """The configured feature specs laid out for `global_device_count` devices."""
    return config_specs.build_feature_specs(
      self.config, global_batch_size=self.global_batch, global_device_count=global_device_count
    )

  def abstract_train_state(
    self, feature_specs: Any, *, track_updates: bool = True
  ) -> pipeline.TrainState:
    """The TrainState's shapes and shardings; `track_updates`: with the embedding
    variables' per-row last update (what checkpoints of format 4 and later hold)."""
    params = jax.eval_shape(self.init_params, jax.random.key(0))
    embeddings = pipeline.abstract_embedding_variables(
      feature_specs, self.mesh, num_sc_per_device=self.num_sc, track_updates=track_updates
    )
    return pipeline.abstract_train_state(self.dense_optimizer, params, self.mesh, embeddings)

  def init_params(self, key: jax.Array) -> Any:
    """The model's fresh dense parameters."""
    return self.model.init(key, self.num_dense, self.feature_dims)

  def predict_fn(self, feature_specs: Any) -> Any:
    """The model's forward for evaluation (probabilities)."""
    return pipeline.make_predict_fn(self.model, feature_specs)

  def fresh_train_state(self) -> pipeline.TrainState:
    params_key, tables_key = jax.random.split(jax.random.key(int(self.config.seed)))
    # One program, not one per layer and shape (34 for the criteo DLRM run
    # op by op), with the same values: each is a compilation or a load from
    # the persistent cache at every start.
    params = jax.jit(self.init_params)(params_key)
    embeddings = pipeline.init_embedding_variables(
      tables_key, self.base_specs, self.mesh, num_sc_per_device=self.num_sc, track_updates=True
    )
    return pipeline.create_train_state(self.dense_optimizer, params, self.mesh, embeddings)

  def make_trainer(self, feature_specs: Any) -> pipeline.Trainer:
    """The trainer of the input's placed batches (packed: split inside the step)."""
    example = pipeline.abstract_train_batch(
      feature_specs,
      self.mesh,
      global_batch_size=self.global_batch,
      num_dense=self.num_dense,
      num_sc_per_device=self.num_sc,
    )
    example = pipeline.abstract_packed_batch(example, self.mesh)
    return pipeline.make_trainer(
      self.mesh,
      self.abstract_train_state(feature_specs),
      example,
      self.tc_stage,
      feature_specs=feature_specs,
      num_sc_per_device=self.num_sc,
      pipelining=resolve_pipelining(
        self.config.pipelining, self.mesh.devices.flat[0].platform, self.mesh.size
      ),
    )

  def make_iterator(self, feature_specs: Any) -> transforms.InputIterator:
    return pipeline.make_train_input(
      self.input_config,
      feature_specs,
      self.mesh,
      label_range=(0.0, 1.0),  # the sigmoid cross-entropy of the TC stage
      last_retune=self.last_retune,
    )

  def setup(self, feature_specs: Any) -> Setup:
    return Setup(feature_specs, self.make_trainer(feature_specs), self.make_iterator(feature_specs))

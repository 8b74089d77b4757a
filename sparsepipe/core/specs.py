"""Immutable, hashable table and feature specifications.

The names mirror jax-tpu-embedding's `embedding_spec` so users can switch,
but every spec here is a frozen dataclass: specs are static arguments of the
jitted step, so a change of limits (FDO) must produce a *new* spec (and a
recompile), never mutate one in place. The stacking functions in
`stacking.py` return updated copies.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Union

import numpy as np

# A learning rate is a float or a schedule `step -> float` (e.g. an optax
# schedule). Schedules are compared by identity, which keeps specs hashable.
LearningRate = Union[float, Callable[[Any], Any]]


def _as_shape(value: Any) -> tuple[int, ...]:
  return tuple(int(v) for v in value)


# ----------------------------------------------------------------------------
# Initializers: small frozen dataclasses (hashable, printable, JSON-describable)
# with the jax initializer signature `(key, shape, dtype) -> array`.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TruncatedNormalInitializer:
  """Truncated normal in [-2, 2] standard deviations, scaled by `stddev`."""

  stddev: float = 0.05

  def __call__(self, key, shape, dtype=np.float32):
    import jax  # pylint: disable=g-import-not-at-top

    return self.stddev * jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype)


@dataclasses.dataclass(frozen=True)
class UniformInitializer:
  """Uniform in [-scale, scale)."""

  scale: float = 0.05

  def __call__(self, key, shape, dtype=np.float32):
    import jax  # pylint: disable=g-import-not-at-top

    return jax.random.uniform(key, shape, dtype, -self.scale, self.scale)


@dataclasses.dataclass(frozen=True)
class ConstantInitializer:
  """Every element equal to `value` (optimizer slots, tests)."""

  value: float = 0.0

  def __call__(self, key, shape, dtype=np.float32):
    del key
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

    return jnp.full(shape, self.value, dtype)


# ----------------------------------------------------------------------------
# Embedding optimizers: data only. The update kernels live in
# sparsepipe.pipeline and dispatch on the spec's type.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SGDOptimizerSpec:
  """Plain SGD on the touched rows: w -= lr * g."""

  learning_rate: LearningRate = 0.001

  def slot_names(self) -> tuple[str, ...]:
    return ()

  def slot_initializers(self) -> tuple[ConstantInitializer, ...]:
    return ()

  def short_name(self) -> str:
    return "sgd"


@dataclasses.dataclass(frozen=True)
class AdagradOptimizerSpec:
  """Adagrad with a per-element accumulator slot."""

  learning_rate: LearningRate = 0.001
  initial_accumulator_value: float = 0.1

  def slot_names(self) -> tuple[str, ...]:
    return ("accumulator",)

  def slot_initializers(self) -> tuple[ConstantInitializer, ...]:
    return (ConstantInitializer(self.initial_accumulator_value),)

  def short_name(self) -> str:
    return "adagrad"


@dataclasses.dataclass(frozen=True)
class AdamOptimizerSpec:
  """Adam with per-element momentum and velocity slots (lazy: touched rows)."""

  learning_rate: LearningRate = 0.001
  beta_1: float = 0.9
  beta_2: float = 0.999
  epsilon: float = 1e-8

  def slot_names(self) -> tuple[str, ...]:
    return ("momentum", "velocity")

  def slot_initializers(self) -> tuple[ConstantInitializer, ...]:
    return (ConstantInitializer(0.0), ConstantInitializer(0.0))

  def short_name(self) -> str:
    return "adam"


OptimizerSpec = Union[SGDOptimizerSpec, AdagradOptimizerSpec, AdamOptimizerSpec]

COMBINERS = ("sum", "mean", "sqrtn")


# ----------------------------------------------------------------------------
# Stacking metadata (filled in by stacking.py).
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FeatureIdTransformation:
  """How a feature's ids map into its stacked table (docs/coo_format.md)."""

  row_offset: int = 0  # running sum of global batch sizes in the stack
  col_offset: int = 0  # row_offset_in_shard * N
  col_shift: int = 0  # shard rotation


@dataclasses.dataclass(frozen=True)
class TableSettingInStack:
  """Where one table sits inside its stacked table."""

  stack_name: str
  padded_vocab_size: int
  padded_embedding_dim: int
  row_offset_in_shard: int = 0
  shard_rotation: int = 0


@dataclasses.dataclass(frozen=True)
class StackedTableSpec:
  """One physical (stacked) table and the preprocessing limits of its stack."""

  stack_name: str
  stack_vocab_size: int
  stack_embedding_dim: int
  optimizer: OptimizerSpec
  combiner: str
  total_sample_count: int
  max_ids_per_partition: int = 256
  max_unique_ids_per_partition: int = 256
  suggested_coo_buffer_size_per_device: int | None = None


@dataclasses.dataclass(frozen=True)
class TableSpec:
  """A logical embedding table.

  `setting_in_stack` and `stacked_table_spec` are None until the feature
  specs are prepared for training (stacking.py), which returns new specs.
  """

  name: str
  vocabulary_size: int
  embedding_dim: int
  combiner: str = "sum"
  max_ids_per_partition: int = 256
  max_unique_ids_per_partition: int = 256
  suggested_coo_buffer_size_per_device: int | None = None
  initializer: Callable[..., Any] = TruncatedNormalInitializer()
  optimizer: OptimizerSpec = SGDOptimizerSpec()
  setting_in_stack: TableSettingInStack | None = None
  stacked_table_spec: StackedTableSpec | None = None

  def __post_init__(self):
    if self.combiner not in COMBINERS:
      raise ValueError(
          f"table '{self.name}': combiner {self.combiner!r} is not one of"
          f" {COMBINERS}"
      )
    if self.vocabulary_size <= 0 or self.embedding_dim <= 0:
      raise ValueError(
          f"table '{self.name}': vocabulary_size={self.vocabulary_size} and"
          f" embedding_dim={self.embedding_dim} must be positive"
      )


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
  """A sparse input feature looked up in `table_spec`.

  input_shape is (global batch, ids per sample) and output_shape is
  (global batch, embedding_dim); shapes are stored as tuples so the spec
  stays hashable.
  """

  name: str
  table_spec: TableSpec
  input_shape: tuple[int, ...]
  output_shape: tuple[int, ...]
  id_transformation: FeatureIdTransformation | None = None

  def __post_init__(self):
    object.__setattr__(self, "input_shape", _as_shape(self.input_shape))
    object.__setattr__(self, "output_shape", _as_shape(self.output_shape))

  @property
  def global_batch_size(self) -> int:
    return int(np.prod(self.output_shape[:-1]))

  @property
  def stack_name(self) -> str:
    """The stack this feature's table belongs to (its own name if unstacked)."""
    setting = self.table_spec.setting_in_stack
    return setting.stack_name if setting is not None else self.table_spec.name

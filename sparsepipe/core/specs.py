"""Immutable, hashable table and feature specifications.

The names mirror jax-tpu-embedding's `embedding_spec` so users can switch,
but every spec here is a frozen dataclass: specs are static arguments of the
jitted step, so a change of limits (FDO) must produce a *new* spec (and a
recompile), never mutate one in place. The stacking functions in
`stacking.py` return updated copies. Initializers and embedding optimizers
live in initializers.py and optimizer_specs.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from sparsepipe.core.initializers import TruncatedNormalInitializer
from sparsepipe.core.optimizer_specs import OptimizerSpec
from sparsepipe.core.optimizer_specs import SGDOptimizerSpec

# Re-exported: these names were defined here before they got their own modules.
from sparsepipe.core.initializers import ConstantInitializer  # noqa: F401
from sparsepipe.core.initializers import UniformInitializer  # noqa: F401
from sparsepipe.core.optimizer_specs import AdagradOptimizerSpec  # noqa: F401
from sparsepipe.core.optimizer_specs import AdamOptimizerSpec  # noqa: F401
from sparsepipe.core.optimizer_specs import LearningRate  # noqa: F401


def _as_shape(value: Any) -> tuple[int, ...]:
  return tuple(int(v) for v in value)


COMBINERS = ("sum", "mean", "sqrtn")


def check_combiner(combiner: Any, what: str) -> str:
  """`combiner` if it is one of COMBINERS, else a ValueError naming `what` and the value.

  Every place that reads a combiner (specs, config, export, lookup) checks
  it: an unknown name must not fall through to one of the formulas.
  """
  if not isinstance(combiner, str) or combiner not in COMBINERS:
    raise ValueError(f"{what}: combiner {combiner!r} is not one of {', '.join(COMBINERS)}")
  return combiner


# ----------------------------------------------------------------------------
# Stacking metadata (filled in by stacking.py).
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FeatureIdTransformation:
  """How a feature's ids map into its stacked table (docs/reference/coo_format.md)."""

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

  def __post_init__(self):
    check_combiner(self.combiner, f"stack '{self.stack_name}'")


@dataclasses.dataclass(frozen=True)
class TableSpec:
  """A logical embedding table.

  `stacked_table_spec` is None until the feature specs are prepared for
  training (stacking.py), which returns new specs. Until then the table sits
  alone in its own stack, and `setting_in_stack` says so (as in the
  reference): its name, vocabulary_size and embedding_dim, offsets 0. That
  setting is derived, not kept: a table without `stacked_table_spec` always
  gets it (any given one is replaced), so `dataclasses.replace` of a name or
  size never leaves a stale one behind.
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
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f"a table's name must be a non-empty string, got {self.name!r}")
    check_combiner(self.combiner, f"table '{self.name}'")
    for field in ("vocabulary_size", "embedding_dim"):
      value = getattr(self, field)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(
          f"table '{self.name}': {field} must be an integer, got {type(value).__name__} {value!r}"
        )
    if not isinstance(self.optimizer, OptimizerSpec):
      raise TypeError(
        f"table '{self.name}': optimizer must be an OptimizerSpec (e.g."
        f" core.AdagradOptimizerSpec()), got {type(self.optimizer).__name__}"
        f" {self.optimizer!r}"
      )
    if not callable(self.initializer):
      raise TypeError(
        f"table '{self.name}': initializer must be a callable (key, shape, dtype) -> array,"
        f" got {type(self.initializer).__name__} {self.initializer!r}"
      )
    if self.vocabulary_size <= 0 or self.embedding_dim <= 0:
      raise ValueError(
        f"table '{self.name}': vocabulary_size={self.vocabulary_size} and"
        f" embedding_dim={self.embedding_dim} must be positive"
      )
    if self.stacked_table_spec is None:
      own = TableSettingInStack(self.name, self.vocabulary_size, self.embedding_dim)
      object.__setattr__(self, "setting_in_stack", own)


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
    if not isinstance(self.table_spec, TableSpec):
      raise TypeError(
        f"feature '{self.name}': table_spec must be a TableSpec, got"
        f" {type(self.table_spec).__name__} {self.table_spec!r}"
      )
    object.__setattr__(self, "input_shape", _as_shape(self.input_shape))
    object.__setattr__(self, "output_shape", _as_shape(self.output_shape))
    self._check_shapes()

  def _check_shapes(self) -> None:
    """(batch, ids per sample) in, (batch, at most the table's embedding_dim) out (a
    feature may read the first columns only): other shapes failed far from here,
    in preprocessing or inside the lookup's shard_map."""
    what = f"feature '{self.name}'"
    if len(self.input_shape) != 2 or min(self.input_shape) < 1:
      raise ValueError(
        f"{what}: input_shape {self.input_shape} must be (global batch, ids per sample), both >= 1"
      )
    dim = self.table_spec.embedding_dim
    if len(self.output_shape) != 2 or not 1 <= self.output_shape[1] <= dim:
      raise ValueError(
        f"{what}: output_shape {self.output_shape} must be (global batch, columns), the"
        f" columns at most table '{self.table_spec.name}''s embedding_dim {dim}"
      )
    if self.output_shape[0] != self.input_shape[0]:
      raise ValueError(
        f"{what}: output_shape {self.output_shape} and input_shape {self.input_shape}"
        " name other global batch sizes"
      )

  @property
  def global_batch_size(self) -> int:
    return int(np.prod(self.output_shape[:-1]))

  @property
  def stack_name(self) -> str:
    """The stack this feature's table belongs to (its own name if unstacked)."""
    setting = self.table_spec.setting_in_stack
    return setting.stack_name if setting is not None else self.table_spec.name


def with_default_id_transformation(feature: FeatureSpec) -> FeatureSpec:
  """`feature`, its unset id transformation read as (0, 0, 0).

  jax-tpu-embedding treats an unset transformation so; a stack whose
  features then overlap or miss their columns is caught by the stricter
  checks of preprocessing and of the embedding layout.
  """
  if feature.id_transformation is not None:
    return feature
  return dataclasses.replace(feature, id_transformation=FeatureIdTransformation())

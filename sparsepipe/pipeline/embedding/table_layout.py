"""The MOD layout of stacked embedding tables; conversions to logical tables.

A stacked table is one array [stack_vocab_size, stack_embedding_dim] in
*physical* order: with N = G*S global SparseCores, it is N contiguous blocks
of V/N rows, block g belonging to global SC g (device g // S holds blocks
g - g % S .. g - g % S + S - 1, so sharding the rows over the data axis gives
every device exactly its SCs). Row x of logical table k sits in block
p = (x mod N + shard_rotation_k) mod N at row e = x div N +
row_offset_in_shard_k of that block, i.e. at physical row p * V/N + e. These
are the (p, e) that the COO preprocessing writes (docs/reference/coo_format.md).

`StackLayout` gathers, per stack, everything the kernels need as static
Python values, after checking that the prepared specs are consistent.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from sparsepipe.core.specs import FeatureSpec
from sparsepipe.core.specs import StackedTableSpec
from sparsepipe.core.specs import TableSpec
from sparsepipe.core.specs import with_default_id_transformation
from sparsepipe.core.rounding import is_power_of_two, round_up
from sparsepipe.transforms.fdo.carry import most_ids_per_sparsecore
from sparsepipe.transforms.table_export import compute_physical_row_ids
from sparsepipe.transforms.table_export import mod_shard
from sparsepipe.transforms.table_export import mod_unshard


class EmbeddingLayoutError(ValueError):
  """Feature specs that cannot describe a MOD-sharded stacked table."""


@dataclasses.dataclass(frozen=True)
class FeatureSlot:
  """Where a feature's samples sit in its stack's per-SC sample range."""

  spec: FeatureSpec
  sample_offset: int  # row_offset // N: first sample id on every SC
  samples_per_sc: int  # global batch // N


@dataclasses.dataclass(frozen=True)
class StackLayout:
  """Static description of one stacked table for N global SparseCores."""

  spec: StackedTableSpec
  tables: tuple[TableSpec, ...]  # ordered by row_offset_in_shard
  features: tuple[FeatureSlot, ...]  # ordered by row_offset
  num_sparsecores: int

  @property
  def name(self) -> str:
    return self.spec.stack_name

  def physical_rows(self, table_name: str, ids: np.ndarray) -> np.ndarray:
    """Physical rows in this stacked table of logical `ids` of one of its tables."""
    table = next((t for t in self.tables if t.name == table_name), None)
    if table is None:
      raise EmbeddingLayoutError(f"stack '{self.name}' has no table '{table_name}'")
    setting = table.setting_in_stack
    return compute_physical_row_ids(
      self.num_sparsecores,
      self.vocab_size,
      setting.shard_rotation,
      setting.row_offset_in_shard,
      np.asarray(ids, np.int64),
    )

  @property
  def vocab_size(self) -> int:
    return self.spec.stack_vocab_size

  @property
  def dim(self) -> int:
    return self.spec.stack_embedding_dim

  @property
  def rows_per_sc(self) -> int:
    return self.spec.stack_vocab_size // self.num_sparsecores

  @property
  def samples_per_sc(self) -> int:
    return self.spec.total_sample_count // self.num_sparsecores

  @property
  def most_ids_per_sc(self) -> int:
    """The most ids one SC's samples of a batch can hold (its samples of every
    feature of the stack times that feature's ids per sample)."""
    specs = [slot.spec for slot in self.features]
    return most_ids_per_sparsecore(specs, self.num_sparsecores)[self.name]

  @property
  def capacity(self) -> int:
    """Entries per (SC, partition) in the exchange: round8 of the smaller of
    max_ids_per_partition (the preprocessing never writes more to one
    partition) and `most_ids_per_sc` (a partition of a SC holds only that SC's
    ids). The second bounds the step's buffers by what a batch can fill, as
    the COO buffers are (transforms.bound_coo_buffers_by_the_batch), also
    while the limits are still the starting guess before the first FDO pass."""
    return round_up(min(self.spec.max_ids_per_partition, self.most_ids_per_sc), 8)

  def logical_array(self, logical: Mapping[str, Any], table: TableSpec) -> Any:
    """`logical[table.name]`, checked to be [vocabulary_size, embedding_dim]."""
    if table.name not in logical:
      raise EmbeddingLayoutError(f"stack '{self.name}': no logical array for table '{table.name}'")
    values = logical[table.name]
    expected = (table.vocabulary_size, table.embedding_dim)
    if tuple(values.shape) != expected:
      raise EmbeddingLayoutError(
        f"stack '{self.name}', table '{table.name}': logical array has"
        f" shape {tuple(values.shape)}, expected {expected}"
      )
    return values


def _prepared(feature: FeatureSpec) -> None:
  table = feature.table_spec
  missing = [
    name
    for name, value in (
      ("table_spec.setting_in_stack", table.setting_in_stack),
      ("table_spec.stacked_table_spec", table.stacked_table_spec),
    )
    if value is None
  ]
  if missing:
    raise EmbeddingLayoutError(
      f"feature '{feature.name}' (table '{table.name}'): {missing[0]} is"
      " None; pass feature specs returned by"
      " prepare_feature_specs_for_training"
    )


def _check_tables(
  stack: StackedTableSpec, tables: list[TableSpec], n: int
) -> tuple[TableSpec, ...]:
  """Checks paddings and offsets; returns tables by row_offset_in_shard."""
  name = stack.stack_name
  if stack.stack_vocab_size % (8 * n):
    raise EmbeddingLayoutError(
      f"stack '{name}': stack_vocab_size={stack.stack_vocab_size} is not a"
      f" multiple of 8 * {n} SparseCores"
    )
  if stack.max_ids_per_partition < 1:
    raise EmbeddingLayoutError(
      f"stack '{name}': max_ids_per_partition={stack.max_ids_per_partition} must be at least 1"
    )
  ordered = sorted(tables, key=lambda t: t.setting_in_stack.row_offset_in_shard)
  offset = 0
  for table in ordered:
    setting = table.setting_in_stack
    where = f"stack '{name}', table '{table.name}'"
    if setting.stack_name != name:
      raise EmbeddingLayoutError(f"{where}: setting_in_stack names stack '{setting.stack_name}'")
    if setting.padded_vocab_size % (8 * n) or setting.padded_vocab_size < table.vocabulary_size:
      raise EmbeddingLayoutError(
        f"{where}: padded_vocab_size={setting.padded_vocab_size} must be a"
        f" multiple of 8 * {n} SparseCores and at least vocabulary_size="
        f"{table.vocabulary_size} (specs prepared for another device count?)"
      )
    if setting.padded_embedding_dim != stack.stack_embedding_dim or (
      table.embedding_dim > stack.stack_embedding_dim
    ):
      raise EmbeddingLayoutError(
        f"{where}: embedding_dim={table.embedding_dim} padded to"
        f" {setting.padded_embedding_dim} does not fit"
        f" stack_embedding_dim={stack.stack_embedding_dim}"
      )
    if setting.row_offset_in_shard != offset:
      raise EmbeddingLayoutError(
        f"{where}: row_offset_in_shard={setting.row_offset_in_shard},"
        f" expected {offset} for {n} SparseCores (tables must tile the"
        " shard; specs prepared for another device count?)"
      )
    if not 0 <= setting.shard_rotation < n:
      raise EmbeddingLayoutError(
        f"{where}: shard_rotation={setting.shard_rotation} is not in [0, {n})"
      )
    offset += setting.padded_vocab_size // n
  if offset * n != stack.stack_vocab_size:
    raise EmbeddingLayoutError(
      f"stack '{name}': tables cover {offset * n} rows but"
      f" stack_vocab_size={stack.stack_vocab_size}"
    )
  return tuple(ordered)


def _check_features(
  stack: StackedTableSpec, features: list[FeatureSpec], n: int
) -> tuple[FeatureSlot, ...]:
  """Checks batch sizes and row offsets; returns slots by row_offset."""
  ordered = sorted(features, key=lambda f: f.id_transformation.row_offset)
  slots = []
  row_offset = 0
  for feature in ordered:
    where = f"stack '{stack.stack_name}', feature '{feature.name}'"
    batch = feature.global_batch_size
    transform = feature.id_transformation
    setting = feature.table_spec.setting_in_stack
    if batch % n:
      raise EmbeddingLayoutError(
        f"{where}: global batch size {batch} is not a multiple of the {n} global SparseCores"
      )
    if transform.row_offset != row_offset:
      raise EmbeddingLayoutError(
        f"{where}: row_offset={transform.row_offset}, expected {row_offset}"
        " (the running sum of the stack's global batch sizes)"
      )
    if (
      transform.col_offset != setting.row_offset_in_shard * n
      or transform.col_shift != setting.shard_rotation
    ):
      raise EmbeddingLayoutError(
        f"{where}: col_offset={transform.col_offset},"
        f" col_shift={transform.col_shift} do not match"
        f" row_offset_in_shard={setting.row_offset_in_shard} *"
        f" {n} SparseCores and shard_rotation={setting.shard_rotation}"
        " (specs prepared for another device count?)"
      )
    dim = feature.output_shape[-1]
    if dim > feature.table_spec.embedding_dim:
      raise EmbeddingLayoutError(
        f"{where}: output dim {dim} exceeds the table's embedding_dim="
        f"{feature.table_spec.embedding_dim}"
      )
    slots.append(FeatureSlot(feature, row_offset // n, batch // n))
    row_offset += batch
  if row_offset != stack.total_sample_count:
    raise EmbeddingLayoutError(
      f"stack '{stack.stack_name}': features hold {row_offset} samples but"
      f" total_sample_count={stack.total_sample_count}"
    )
  return tuple(slots)


def stack_layouts(feature_specs: Any, num_sparsecores: int) -> dict[str, StackLayout]:
  """Static layouts of every stack used by `feature_specs`, by stack name.

  Args:
    feature_specs: a pytree of prepared FeatureSpec (every table has its
      setting_in_stack and stacked_table_spec, every feature its
      id_transformation).
    num_sparsecores: N = global devices * SparseCores per device; a power of 2.

  Returns:
    {stack name: StackLayout}, sorted by stack name.
  """
  n = int(num_sparsecores)
  if not is_power_of_two(n):
    raise EmbeddingLayoutError(f"the number of global SparseCores must be a power of two, got {n}")
  leaves = jax.tree.leaves(feature_specs)
  if not leaves:
    raise EmbeddingLayoutError("feature_specs holds no FeatureSpec")
  names = [getattr(f, "name", None) for f in leaves]
  repeated = sorted({x for x in names if names.count(x) > 1})
  if repeated:
    raise EmbeddingLayoutError(f"feature names are not unique: {repeated}")
  stacks: dict[str, StackedTableSpec] = {}
  tables: dict[str, dict[str, TableSpec]] = {}
  features: dict[str, list[FeatureSpec]] = {}
  for feature in leaves:
    if not isinstance(feature, FeatureSpec):
      raise EmbeddingLayoutError(f"feature_specs leaf {feature!r} is not a FeatureSpec")
    _prepared(feature)
    feature = with_default_id_transformation(feature)
    table = feature.table_spec
    stack = table.stacked_table_spec
    name = stack.stack_name
    if stacks.setdefault(name, stack) != stack:
      raise EmbeddingLayoutError(
        f"stack '{name}': feature '{feature.name}' carries a"
        " StackedTableSpec different from the stack's other features"
      )
    known = tables.setdefault(name, {}).setdefault(table.name, table)
    if known != table:
      raise EmbeddingLayoutError(
        f"stack '{name}': table '{table.name}' appears with two different TableSpecs"
      )
    features.setdefault(name, []).append(feature)
  return {
    name: StackLayout(
      spec=stacks[name],
      tables=_check_tables(stacks[name], list(tables[name].values()), n),
      features=_check_features(stacks[name], features[name], n),
      num_sparsecores=n,
    )
    for name in sorted(stacks)
  }


def _xp(array: Any):
  return np if isinstance(array, np.ndarray) else jnp


def logical_to_physical(
  layout: StackLayout,
  logical: Mapping[str, Any],
  fill: Any = None,
  row_sharding: jax.sharding.Sharding | None = None,
) -> Any:
  """Places logical tables [vocab, dim] into the physical stacked layout.

  Works on numpy (host) and jax arrays (jittable). Padding rows and columns
  take `fill` ([V, D], same kind of array) where given, else zero.
  `row_sharding`, under jit, keeps each padded logical table sharded by rows
  so that big tables are never gathered on one device.
  """
  n, dim = layout.num_sparsecores, layout.dim
  pieces, masks = [], []
  xp = _xp(next(iter(logical.values())) if logical else fill)
  for table in layout.tables:
    values = layout.logical_array(logical, table)
    setting = table.setting_in_stack
    pad = (
      (0, setting.padded_vocab_size - table.vocabulary_size),
      (0, dim - table.embedding_dim),
    )

    def place(x, setting=setting):
      return mod_shard(x, n, setting.shard_rotation)

    padded = xp.pad(values.astype(np.float32), pad)
    if row_sharding is not None:
      padded = jax.lax.with_sharding_constraint(padded, row_sharding)
    pieces.append(place(padded))
    if fill is not None:
      masks.append(place(xp.pad(xp.ones(values.shape, bool), pad)))
  physical = xp.concatenate(pieces, axis=1).reshape(layout.vocab_size, dim)
  if fill is None:
    return physical
  mask = xp.concatenate(masks, axis=1).reshape(layout.vocab_size, dim)
  return xp.where(mask, physical, fill)


def physical_to_logical(layout: StackLayout, physical: Any) -> dict[str, Any]:
  """Inverse of `logical_to_physical`: {table name: [vocab, embedding_dim]}."""
  n, dim = layout.num_sparsecores, layout.dim
  expected = (layout.vocab_size, dim)
  if tuple(physical.shape) != expected:
    raise EmbeddingLayoutError(
      f"stack '{layout.name}': physical array has shape"
      f" {tuple(physical.shape)}, expected {expected}"
    )
  blocks = physical.reshape(n, layout.rows_per_sc, dim)
  logical = {}
  for table in layout.tables:
    setting = table.setting_in_stack
    rows = setting.padded_vocab_size // n
    start = setting.row_offset_in_shard
    x = mod_unshard(blocks[:, start : start + rows], setting.shard_rotation)
    logical[table.name] = x[: table.vocabulary_size, : table.embedding_dim]
  return logical

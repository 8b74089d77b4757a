"""Sharded embedding tables and optimizer slots: creation, shardings, re-layout.

State is `{stack name: EmbeddingVariables(table, slots, updated)}`; table
and slots are [stack_vocab_size, stack_embedding_dim] float32 in the
physical MOD layout of table_layout.py, sharded by rows over the data
axis. Slots follow the stack optimizer's slot_names().

`updated` (optional, made with `track_updates=True`) is an int32 array of
one entry per physical row, sharded the same way: the number of the last
batch whose embedding update wrote that row (0: never). The update kernel
sets it for exactly the rows it writes, so the rows that changed between two
checkpoints are known (incremental exports), exactly across resume and
re-layout (it moves with its rows).

Re-layout (`relayout_embedding_variables`): the MOD layout places logical
row r of a stack on SparseCore r mod N, and the stacking offsets and
rotations depend on N, so a change of the device count moves rows. The
variables are brought back to logical per-table rows with the layout they
were made for, then stacked again for the new mesh (through host memory:
every process holds the logical tables of all stacks once). Checkpoint
restores use it when the device count changed.
"""

from __future__ import annotations

import functools
import zlib
from typing import Any, Iterator, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sparsepipe.pipeline.embedding.table_layout import EmbeddingLayoutError
from sparsepipe.pipeline.embedding.table_layout import StackLayout
from sparsepipe.pipeline.embedding.table_layout import logical_to_physical
from sparsepipe.pipeline.embedding.table_layout import physical_to_logical
from sparsepipe.pipeline.embedding.table_layout import stack_layouts
from sparsepipe.core.specs import TableSpec
from sparsepipe.transforms.table_export import mod_shard
from sparsepipe.core.mesh import DATA_AXIS
from sparsepipe.transforms.stacking import get_stacked_table_specs


class EmbeddingVariables(NamedTuple):
  """One stacked table, its optimizer slots (same shape and sharding), and
  optionally the last batch that updated each row (see the module docstring)."""

  table: Any
  slots: tuple[Any, ...] = ()
  updated: Any = None


def num_sparsecores(mesh: Mesh, num_sc_per_device: int) -> int:
  """N = devices on the mesh's data axis * SparseCores per device."""
  if num_sc_per_device < 1:
    raise EmbeddingLayoutError(f"num_sc_per_device={num_sc_per_device} must be positive")
  return int(mesh.shape[DATA_AXIS]) * int(num_sc_per_device)


def table_sharding(mesh: Mesh) -> NamedSharding:
  """Rows split over the data axis: device d holds SCs d*S .. d*S+S-1."""
  return NamedSharding(mesh, PartitionSpec(DATA_AXIS, None))


def row_sharding(mesh: Mesh) -> NamedSharding:
  """A per-row vector split like the table's rows."""
  return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def _layouts(feature_specs: Any, mesh: Mesh, num_sc_per_device: int):
  return stack_layouts(feature_specs, num_sparsecores(mesh, num_sc_per_device))


def _structure(layout: StackLayout, leaf: Any, updated: Any = None) -> EmbeddingVariables:
  slots = tuple(leaf for _ in layout.spec.optimizer.slot_names())
  return EmbeddingVariables(leaf, slots, updated)


def embedding_variables_sharding(
  feature_specs: Any, mesh: Mesh, *, track_updates: bool = False
) -> dict[str, EmbeddingVariables]:
  """{stack: EmbeddingVariables of NamedSharding} (for jit in/out_shardings)."""
  sharding = table_sharding(mesh)
  rows = row_sharding(mesh) if track_updates else None
  stacks = get_stacked_table_specs(feature_specs)
  return {
    name: EmbeddingVariables(
      sharding, tuple(sharding for _ in stacks[name].optimizer.slot_names()), rows
    )
    for name in sorted(stacks)
  }


def abstract_embedding_variables(
  feature_specs: Any, mesh: Mesh, *, num_sc_per_device: int, track_updates: bool = False
) -> dict[str, EmbeddingVariables]:
  """ShapeDtypeStructs with shardings: restore targets for Orbax."""
  sharding = table_sharding(mesh)
  layouts = _layouts(feature_specs, mesh, num_sc_per_device)

  def updated(layout):
    if not track_updates:
      return None
    return jax.ShapeDtypeStruct((layout.vocab_size,), jnp.int32, sharding=row_sharding(mesh))

  return {
    name: _structure(
      layout,
      jax.ShapeDtypeStruct((layout.vocab_size, layout.dim), jnp.float32, sharding=sharding),
      updated(layout),
    )
    for name, layout in layouts.items()
  }


def table_key(key: jax.Array, table_name: str) -> jax.Array:
  """The PRNG key of one logical table: independent of stacking and devices."""
  return jax.random.fold_in(key, zlib.crc32(table_name.encode()) & 0x7FFFFFFF)


def _slot_fills(layout: StackLayout, key: jax.Array) -> list[jax.Array]:
  shape = (layout.vocab_size, layout.dim)
  optimizer = layout.spec.optimizer
  return [
    jnp.asarray(init(jax.random.fold_in(key, i), shape, jnp.float32))
    for i, init in enumerate(optimizer.slot_initializers())
  ]


class _StackInit(NamedTuple):
  """The jitted programs that create one stack's variables (see _init_programs)."""

  zeros: Any  # () -> the physical table, zeros
  writers: tuple[Any, ...]  # (physical, key) -> physical with a group of tables written
  rest: Any  # (key) -> (slots, updated)


def _table_groups(layout: StackLayout) -> list[tuple[TableSpec, ...]]:
  """The stack's tables in groups of at most the largest table's rows, in stack
  order (so that a group's rows are one run in each SC's block)."""
  budget = max(t.setting_in_stack.padded_vocab_size for t in layout.tables)
  groups: list[list[TableSpec]] = [[]]
  rows = 0
  for t in layout.tables:
    size = t.setting_in_stack.padded_vocab_size
    if groups[-1] and rows + size > budget:
      groups.append([])
      rows = 0
    groups[-1].append(t)
    rows += size
  return [tuple(g) for g in groups]


def _group_offset(tables: tuple[TableSpec, ...], n: int) -> int:
  """The first row of a group's run in each SC's block (its tables follow each other)."""
  offset = tables[0].setting_in_stack.row_offset_in_shard
  at = offset
  for t in tables:
    setting = t.setting_in_stack
    if setting.row_offset_in_shard != at:
      raise EmbeddingLayoutError(
        f"table '{t.name}' starts at row {setting.row_offset_in_shard} of its SC's block,"
        f" not {at} after the tables before it"
      )
    at += setting.padded_vocab_size // n
  return offset


def _table_writer(
  layout: StackLayout, tables: tuple[TableSpec, ...], sharding: NamedSharding
) -> Any:
  """(physical, key) -> physical with `tables` initialised in their rows (donated, in place)."""
  n, dim = layout.num_sparsecores, layout.dim

  def place(table, key):
    setting = table.setting_in_stack
    shape = (table.vocabulary_size, table.embedding_dim)
    values = table.initializer(table_key(key, table.name), shape, jnp.float32)
    pad = ((0, setting.padded_vocab_size - shape[0]), (0, dim - shape[1]))
    padded = jax.lax.with_sharding_constraint(jnp.pad(values.astype(jnp.float32), pad), sharding)
    return mod_shard(padded, n, setting.shard_rotation)

  def write(physical, key):
    blocks = physical.reshape(n, layout.rows_per_sc, dim)
    # One update of the group's run of rows: XLA:CPU made a chain of
    # updates, one per table, on a copy of the whole stack.
    placed = jnp.concatenate([place(t, key) for t in tables], axis=1)
    blocks = jax.lax.dynamic_update_slice(blocks, placed, (0, _group_offset(tables, n), 0))
    return blocks.reshape(layout.vocab_size, dim)

  return jax.jit(write, donate_argnums=(0,), out_shardings=sharding)


@functools.lru_cache(maxsize=64)
def _init_programs(
  layouts: tuple[tuple[str, StackLayout], ...], mesh: Mesh, track_updates: bool
) -> dict[str, _StackInit]:
  """The initializers of a set of stacks (cached: compiled once).

  A stack's tables are written into its donated physical array in place,
  a group of tables at a time (no more rows than its largest table:
  `_table_groups`), so the peak is the state plus about one table's
  temporaries. One program making and concatenating all tables held twice
  the state: for the criteo config's 0.77 GB of tables, slots and
  `updated`, the resident set grew by 2.0 GB at its peak, 1.0 GB now,
  compilation included (benchmarks/memory.py). One program writing the
  tables one after the other in place, with optimization barriers between
  them, grew it by 2.1 GB as well: XLA:CPU drops the barriers, makes every
  table's random bits before the first write and copies the stack.
  """
  sharding = table_sharding(mesh)
  rows = row_sharding(mesh) if track_updates else None
  programs = {}
  for name, layout in layouts:

    def rest(key, layout=layout, name=name):
      slots = tuple(_slot_fills(layout, jax.random.fold_in(table_key(key, name), 1)))
      updated = jnp.zeros((layout.vocab_size,), jnp.int32) if track_updates else None
      return slots, updated

    shape = (layout.vocab_size, layout.dim)
    slots = tuple(sharding for _ in layout.spec.optimizer.slot_names())
    programs[name] = _StackInit(
      zeros=jax.jit(functools.partial(jnp.zeros, shape, jnp.float32), out_shardings=sharding),
      writers=tuple(_table_writer(layout, g, sharding) for g in _table_groups(layout)),
      rest=jax.jit(rest, out_shardings=(slots, rows)),
    )
  return programs


def init_embedding_variables(
  key: jax.Array,
  feature_specs: Any,
  mesh: Mesh,
  *,
  num_sc_per_device: int,
  track_updates: bool = False,
) -> dict[str, EmbeddingVariables]:
  """Fresh tables and slots, created sharded (never whole on one device).

  Each logical table is `TableSpec.initializer(table_key(key, name),
  (vocabulary_size, embedding_dim))`, so the same key gives the same
  logical tables for any device count or stacking; padding rows and
  columns are zero. "The same" is bit for bit where XLA computes the
  initializer alike in every program; XLA:CPU of jax 0.12 on AVX-512 hosts
  rounds some truncated-normal values (about 0.1%) up to 3 ulp differently
  by how a program fuses and shards them (docs/reference/compatibility.md). Slots are
  the optimizer's slot_initializers() over the whole stacked array. With
  `track_updates`, `updated` starts at 0 (never). Tables are made a few at a
  time into their stack's array (`_init_programs`).
  """
  layouts = _layouts(feature_specs, mesh, num_sc_per_device)
  programs = _init_programs(tuple(layouts.items()), mesh, bool(track_updates))
  state = {}
  for name, program in programs.items():
    table = program.zeros()
    for write in program.writers:
      table = write(table, key)
    slots, updated = program.rest(key)
    state[name] = EmbeddingVariables(table, slots, updated)
  return state


def _to_host(array: Any) -> np.ndarray:
  if isinstance(array, jax.Array) and not array.is_fully_addressable:
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))
  return np.asarray(array)


def _global_device_count(arrays: list[Any], given: int | None) -> int:
  if given is not None:
    return int(given)
  for array in arrays:
    sharding = getattr(array, "sharding", None)
    if isinstance(sharding, NamedSharding) and DATA_AXIS in sharding.mesh.shape:
      return int(sharding.mesh.shape[DATA_AXIS])
  raise EmbeddingLayoutError(
    f"global_device_count is needed: the tables carry no NamedSharding over the '{DATA_AXIS}' axis"
  )


def unstack_embedding_variables(
  variables: Mapping[str, EmbeddingVariables],
  feature_specs: Any,
  *,
  num_sc_per_device: int,
  global_device_count: int | None = None,
) -> dict[str, EmbeddingVariables]:
  """Physical stacked state -> {table name: EmbeddingVariables of numpy}.

  Every array comes back to the host as [vocabulary_size, embedding_dim].
  `global_device_count` is read from the arrays' sharding when omitted.
  """
  out = {}
  stacks = _stacked_layouts(
    variables, feature_specs, num_sc_per_device, global_device_count, "variables"
  )
  for layout, stacked in stacks:
    expected = len(layout.spec.optimizer.slot_names())
    if len(stacked.slots) != expected:
      raise EmbeddingLayoutError(
        f"stack '{layout.name}': {len(stacked.slots)} slots given, the optimizer has {expected}"
      )
    table = physical_to_logical(layout, _to_host(stacked.table))
    slots = [physical_to_logical(layout, _to_host(s)) for s in stacked.slots]
    updated = None if stacked.updated is None else _to_host(stacked.updated)
    for t in layout.tables:
      rows = None if updated is None else updated[layout.physical_rows(t.name, _rows(t))]
      out[t.name] = EmbeddingVariables(table[t.name], tuple(s[t.name] for s in slots), rows)
  return out


def _rows(table: Any) -> np.ndarray:
  return np.arange(table.vocabulary_size, dtype=np.int64)


def unstack_embedding_tables(
  tables: Mapping[str, Any],
  feature_specs: Any,
  *,
  num_sc_per_device: int,
  global_device_count: int | None = None,
) -> dict[str, np.ndarray]:
  """Physical stacked tables -> {table name: np.ndarray [vocab, dim]}.

  `tables` maps stack names to arrays or to EmbeddingVariables (slots are
  ignored; see unstack_embedding_variables for them).
  """
  variables = {
    name: EmbeddingVariables(v.table if isinstance(v, EmbeddingVariables) else v, ())
    for name, v in tables.items()
  }
  out = {}
  stacks = _stacked_layouts(
    variables, feature_specs, num_sc_per_device, global_device_count, "table"
  )
  for layout, stacked in stacks:
    out.update(physical_to_logical(layout, _to_host(stacked.table)))
  return out


def _stacked_layouts(
  variables: Mapping[str, EmbeddingVariables],
  feature_specs: Any,
  num_sc_per_device: int,
  global_device_count: int | None,
  what: str,
) -> Iterator[tuple[StackLayout, EmbeddingVariables]]:
  """(layout, variables) of every stack, in order; a missing stack is an error.

  A generator: each stack is checked just before its turn.
  """
  g = _global_device_count([v.table for v in variables.values()], global_device_count)
  for name, layout in stack_layouts(feature_specs, g * num_sc_per_device).items():
    if name not in variables:
      raise EmbeddingLayoutError(f"no embedding {what} for stack '{name}'")
    yield layout, variables[name]


def _device_logical(
  layout: StackLayout, logical: Mapping[str, Any], sharding: NamedSharding
) -> dict[str, Any]:
  """Logical arrays -> device arrays; host arrays go row-sharded, rows padded.

  A numpy table is padded to its padded_vocab_size rows and placed shard by
  shard (make_array_from_callback), so no device ever holds all of it;
  `_unpad_rows` undoes the row padding under jit.
  """
  out = {}
  for t in layout.tables:
    value = layout.logical_array(logical, t)
    if isinstance(value, jax.Array):
      out[t.name] = value
      continue
    rows = t.setting_in_stack.padded_vocab_size - t.vocabulary_size
    padded = np.pad(np.asarray(value, np.float32), ((0, rows), (0, 0)))
    out[t.name] = jax.make_array_from_callback(
      padded.shape, sharding, lambda index, padded=padded: padded[index]
    )
  return out


def _unpad_rows(layout: StackLayout, arrays: Mapping[str, Any]) -> dict[str, Any]:
  return {t.name: arrays[t.name][: t.vocabulary_size] for t in layout.tables}


def stack_embedding_variables(
  logical: Mapping[str, EmbeddingVariables],
  feature_specs: Any,
  mesh: Mesh,
  *,
  num_sc_per_device: int,
) -> dict[str, EmbeddingVariables]:
  """{table name: EmbeddingVariables [vocab, dim]} -> sharded physical state.

  The inverse of unstack_embedding_variables for the layout of `mesh`
  (which may have another device count than the one the tables came from:
  this is how a checkpoint is re-laid). Table padding is zero, slot
  padding the slot initializer's value.
  """
  layouts = _layouts(feature_specs, mesh, num_sc_per_device)
  sharding = table_sharding(mesh)
  out = {}
  for name, layout in layouts.items():
    n_slots = len(layout.spec.optimizer.slot_names())
    for t in layout.tables:
      got = len(logical[t.name].slots) if t.name in logical else n_slots
      if got != n_slots:
        raise EmbeddingLayoutError(
          f"stack '{name}', table '{t.name}': {got} slots given, the optimizer has {n_slots}"
        )
    table = _device_logical(layout, {k: v.table for k, v in logical.items()}, sharding)
    slots = [
      _device_logical(layout, {k: v.slots[i] for k, v in logical.items()}, sharding)
      for i in range(n_slots)
    ]

    def place(table, slots, layout=layout):
      fills = _slot_fills(layout, jax.random.key(0))
      return EmbeddingVariables(
        logical_to_physical(layout, _unpad_rows(layout, table), row_sharding=sharding),
        tuple(
          logical_to_physical(layout, _unpad_rows(layout, s), f, row_sharding=sharding)
          for s, f in zip(slots, fills)
        ),
      )

    placed = jax.jit(place, out_shardings=_structure(layout, sharding))(table, slots)
    out[name] = placed._replace(updated=_stack_updated(layout, logical, mesh))
  return out


def _stack_updated(
  layout: StackLayout, logical: Mapping[str, EmbeddingVariables], mesh: Mesh
) -> jax.Array | None:
  """The stack's per-row `updated` from its tables' (None unless every table has one)."""
  given = [logical[t.name].updated for t in layout.tables if t.name in logical]
  if not given or any(u is None for u in given):
    return None
  physical = np.zeros((layout.vocab_size,), np.int32)
  for t in layout.tables:
    if t.name in logical:
      physical[layout.physical_rows(t.name, _rows(t))] = np.asarray(logical[t.name].updated)
  return jax.make_array_from_callback(
    physical.shape, row_sharding(mesh), lambda index: physical[index]
  )


def stack_embedding_tables(
  logical: Mapping[str, Any],
  feature_specs: Any,
  mesh: Mesh,
  num_sc_per_device: int,
) -> dict[str, jax.Array]:
  """{table name: [vocab, dim]} -> {stack name: sharded physical table}."""
  layouts = _layouts(feature_specs, mesh, num_sc_per_device)
  sharding = table_sharding(mesh)
  out = {}
  for name, layout in layouts.items():
    tables = _device_logical(layout, logical, sharding)
    place = lambda t, layout=layout: logical_to_physical(
      layout, _unpad_rows(layout, t), row_sharding=sharding
    )
    out[name] = jax.jit(place, out_shardings=sharding)(tables)
  return out


def relayout_embedding_variables(
  variables: Mapping[str, EmbeddingVariables],
  *,
  from_feature_specs: Any,
  from_device_count: int,
  feature_specs: Any,
  mesh: Mesh,
  num_sc_per_device: int,
) -> dict[str, EmbeddingVariables]:
  """{stack: EmbeddingVariables} laid out for `from_device_count` -> for `mesh`.

  Args:
    variables: stacked tables and slots in the old layout (any sharding).
    from_feature_specs: the feature specs prepared for `from_device_count`
      devices (the old stacking offsets and rotations; FDO limits do not
      affect the layout).
    from_device_count: the global device count the layout was made for.
    feature_specs: the feature specs prepared for `mesh`.
    mesh: the mesh to lay the variables out on.
    num_sc_per_device: SparseCores per device (the same before and after).

  Raises:
    EmbeddingLayoutError (a ValueError): the variables do not fit the old
      layout (another stacking, slot count or shape).
  """
  logical = unstack_embedding_variables(
    variables,
    from_feature_specs,
    num_sc_per_device=num_sc_per_device,
    global_device_count=from_device_count,
  )
  return stack_embedding_variables(
    logical, feature_specs, mesh, num_sc_per_device=num_sc_per_device
  )

"""Stacking and unstacking table values on the host, with the reference's names.

Users import and export trained tables with these (e.g. to serve them, or
to start from tables trained elsewhere): same names, arguments and results
as jax-tpu-embedding 0.1.0's `table_stacking` helpers, computed with numpy
(jax arrays are read to the host). The functions that take the reference's
`EmbeddingSpecProto` accept it, or the `EmbeddingSpecDescription` of
`describe_stacked_tables`, which has the same field names (no protobuf
needed). `mod_shard` / `mod_unshard` are the MOD layout itself, shared with
the device-side layout (sparsepipe.pipeline), on numpy or jax arrays.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sparsepipe.core import specs as specs_lib
from sparsepipe.core.rounding import round_up
from sparsepipe.transforms.coo import buffer_sizes
from sparsepipe.transforms import stacking

Nested = Any


def _xp(array: Any):
  return np if isinstance(array, np.ndarray) else jnp


def mod_shard(padded: Any, num_shards: int, rotation: int) -> Any:
  """[V, D] (V a multiple of num_shards) -> [num_shards, V / num_shards, D].

  Row x goes to shard (x mod N + rotation) mod N at row x div N.
  """
  x = padded.reshape(-1, num_shards, padded.shape[-1])
  return _xp(padded).roll(x, rotation, axis=1).transpose(1, 0, 2)


def mod_unshard(blocks: Any, rotation: int) -> Any:
  """Inverse of `mod_shard`: [N, V / N, D] -> [V, D]."""
  x = _xp(blocks).roll(blocks, -rotation, axis=0)
  return x.transpose(1, 0, 2).reshape(-1, blocks.shape[-1])


def round_up_dim_and_vocab_size(
  tables: Mapping[str, specs_lib.TableSpec], num_sc: int
) -> tuple[dict[str, int], dict[str, int]]:
  """({table: dim rounded to 8}, {table: vocabulary rounded to 8 * num_sc})."""
  dims = {n: round_up(t.embedding_dim, buffer_sizes.ALIGNMENT) for n, t in tables.items()}
  vocabs = {
    n: round_up(t.vocabulary_size, buffer_sizes.ALIGNMENT * num_sc) for n, t in tables.items()
  }
  return dims, vocabs


def compute_physical_row_ids(
  num_sparse_cores: int,
  stack_vocab_size: int,
  shard_rotation: int,
  row_offset_in_shard: int,
  row_ids: Any,
) -> Any:
  """Rows in the stacked table of logical `row_ids` (int or array) of a table."""
  shard = (row_ids % num_sparse_cores + shard_rotation) % num_sparse_cores
  return (
    shard * (stack_vocab_size // num_sparse_cores)
    + row_ids // num_sparse_cores
    + row_offset_in_shard
  )


def get_row_ids_in_stacked_table(
  stack_table_spec: Any, table_spec: Any, row_ids: Sequence[int]
) -> list[int]:
  """Stacked-table rows of `row_ids` of one table (reference proto fields).

  `stack_table_spec` has num_sparsecores and stack_vocab_size, `table_spec`
  table_name, vocab_size, shard_rotation and row_offset_in_shard. An id
  outside [0, vocab_size) is an error naming the table.
  """
  out = []
  for row_id in row_ids:
    if not 0 <= row_id < table_spec.vocab_size:
      raise ValueError(
        f"table '{table_spec.table_name}': row id {row_id} is outside [0, {table_spec.vocab_size})"
      )
    out.append(
      int(
        compute_physical_row_ids(
          stack_table_spec.num_sparsecores,
          stack_table_spec.stack_vocab_size,
          table_spec.shard_rotation,
          table_spec.row_offset_in_shard,
          row_id,
        )
      )
    )
  return out


def get_row_ids_in_stacked_tables(
  embedding_specs: Any, row_ids: Mapping[str, Sequence[int]]
) -> dict[str, list[int]]:
  """{stack: stacked rows} of {table: logical rows}, stack by stack."""
  out: dict[str, list[int]] = {}
  for stack in embedding_specs.stacked_table_specs:
    for table in stack.table_specs:
      if table.table_name in row_ids:
        out.setdefault(stack.stack_name, []).extend(
          get_row_ids_in_stacked_table(stack, table, row_ids[table.table_name])
        )
  return out


def _stacked_spec(table: specs_lib.TableSpec, num_shards: int) -> specs_lib.StackedTableSpec:
  """The table's stack, or the one it would have alone (like the reference)."""
  if table.stacked_table_spec is not None:
    return table.stacked_table_spec
  return specs_lib.StackedTableSpec(
    stack_name=table.name,
    stack_vocab_size=round_up(table.vocabulary_size, buffer_sizes.ALIGNMENT * num_shards),
    stack_embedding_dim=round_up(table.embedding_dim, buffer_sizes.ALIGNMENT),
    optimizer=table.optimizer,
    combiner=table.combiner,
    total_sample_count=0,
  )


def _setting(table: specs_lib.TableSpec) -> specs_lib.TableSettingInStack:
  return table.setting_in_stack or specs_lib.TableSettingInStack(
    table.name, table.vocabulary_size, table.embedding_dim
  )


def _check_table_shape(table: specs_lib.TableSpec, value: Any) -> None:
  """Every part of `table`'s value (a table, its slots) is [vocabulary_size, embedding_dim]."""
  expected = (table.vocabulary_size, table.embedding_dim)
  for part in jax.tree.leaves(value):
    shape = tuple(np.shape(part))
    if shape != expected:
      raise ValueError(
        f"table '{table.name}': a value of shape {shape}, expected {expected}"
        " (vocabulary_size, embedding_dim)"
      )


def stack_and_shard_tables(
  table_specs: Nested,
  tables: Nested,
  num_shards: int,
  pad_value: float = np.nan,
  delete_input: bool = False,
) -> dict[str, Nested]:
  """{stack name: stacked [V, D] numpy values} of logical tables.

  `tables` has the structure of `table_specs` (a leaf per TableSpec may be
  a pytree, e.g. a table and its slots: each part is stacked alike). Rows
  and columns of a table's padding take `pad_value`. With `delete_input`,
  every input leaf that is a jax.Array is deleted (its buffers freed) as
  soon as its values are copied, as jax-tpu-embedding's does: the inputs
  are not held beside their stacked copy. Numpy inputs are left alone.
  """
  if int(num_shards) < 1:
    raise ValueError(f"num_shards={num_shards} must be at least 1")
  members: dict[str, tuple[specs_lib.StackedTableSpec, list]] = {}
  values: dict[str, Any] = {}

  def collect(table: specs_lib.TableSpec, value: Any) -> None:
    _check_table_shape(table, value)  # all of them before any input is deleted
    stacked = _stacked_spec(table, num_shards)
    members.setdefault(stacked.stack_name, (stacked, []))[1].append(table)
    values[table.name] = value

  try:
    jax.tree.map(collect, table_specs, tables, is_leaf=lambda x: isinstance(x, specs_lib.TableSpec))
  except ValueError as e:
    if "pytree" not in str(e):
      raise
    raise ValueError(f"tables must have the structure of table_specs (a value per TableSpec): {e}")
  out = {}
  for name, (stacked, group) in members.items():
    dim = stacked.stack_embedding_dim

    def stack_leaves(*leaves, group=group, dim=dim):
      blocks = []
      for table, leaf in sorted(
        zip(group, leaves), key=lambda tl: _setting(tl[0]).row_offset_in_shard
      ):
        if delete_input and isinstance(leaf, jax.Array):
          # A copy: on CPU, np.asarray may be a view of the buffer deleted here.
          host = np.array(leaf, np.float32, copy=True)
          leaf.delete()
          leaf = host
        leaf = np.asarray(leaf, np.float32)
        padded_vocab = round_up(table.vocabulary_size, buffer_sizes.ALIGNMENT * num_shards)
        padded = np.pad(
          leaf,
          ((0, padded_vocab - leaf.shape[0]), (0, dim - leaf.shape[1])),
          constant_values=pad_value,
        )
        blocks.append(mod_shard(padded, num_shards, _setting(table).shard_rotation))
      return np.concatenate(blocks, axis=1).reshape(-1, dim)

    out[name] = jax.tree.map(stack_leaves, *[values[t.name] for t in group])
  return out


def unshard_and_unstack_tables(
  table_specs: Nested, stacked_tables: Mapping[str, Nested], num_shards: int
) -> Nested:
  """Logical numpy tables, structured like `table_specs`, of stacked values."""

  def unstack(table: specs_lib.TableSpec) -> Nested:
    setting = _setting(table)
    rows = round_up(table.vocabulary_size, buffer_sizes.ALIGNMENT * num_shards) // num_shards
    stack_name = _stacked_spec(table, num_shards).stack_name

    def leaf(stacked):
      stacked = np.asarray(stacked)
      blocks = stacked.reshape(num_shards, -1, stacked.shape[-1])
      start = setting.row_offset_in_shard
      logical = mod_unshard(blocks[:, start : start + rows], setting.shard_rotation)
      return logical[: table.vocabulary_size, : table.embedding_dim]

    return jax.tree.map(leaf, stacked_tables[stack_name])

  return jax.tree.map(unstack, table_specs, is_leaf=lambda x: isinstance(x, specs_lib.TableSpec))


@dataclasses.dataclass(frozen=True)
class TableDescription:
  """One table in its stack (the fields of the reference's TableSpecProto)."""

  table_name: str
  vocab_size: int
  embedding_dim: int
  padded_vocab_size: int
  padded_embedding_dim: int
  row_offset_in_shard: int
  shard_rotation: int


@dataclasses.dataclass(frozen=True)
class StackedTableDescription:
  """One stack (the fields of the reference's StackedTableSpecProto we use)."""

  stack_name: str
  stack_vocab_size: int
  stack_embedding_dim: int
  total_sample_count: int
  max_ids_per_partition: int
  max_unique_ids_per_partition: int
  num_sparsecores: int
  table_specs: tuple[TableDescription, ...]


@dataclasses.dataclass(frozen=True)
class EmbeddingSpecDescription:
  """All stacks (the fields of the reference's EmbeddingSpecProto we use)."""

  stacked_table_specs: tuple[StackedTableDescription, ...]


def describe_stacked_tables(
  feature_specs: Nested, global_device_count: int, num_sc_per_device: int
) -> EmbeddingSpecDescription:
  """What `create_proto_from_feature_specs` records, for the functions below."""
  n = buffer_sizes.num_global_sparsecores(global_device_count, num_sc_per_device)
  stacks = stacking.get_stacked_table_specs(feature_specs)
  tables: dict[str, dict[str, TableDescription]] = {}
  for f in jax.tree.leaves(feature_specs):
    t, s = f.table_spec, f.table_spec.setting_in_stack
    tables.setdefault(s.stack_name, {})[t.name] = TableDescription(
      t.name,
      t.vocabulary_size,
      t.embedding_dim,
      s.padded_vocab_size,
      s.padded_embedding_dim,
      s.row_offset_in_shard,
      s.shard_rotation,
    )
  return EmbeddingSpecDescription(
    tuple(
      StackedTableDescription(
        name,
        st.stack_vocab_size,
        st.stack_embedding_dim,
        st.total_sample_count,
        st.max_ids_per_partition,
        st.max_unique_ids_per_partition,
        n,
        tuple(tables[name].values()),
      )
      for name, st in stacks.items()
    )
  )


def stack_and_shard_feature_tables(
  feature_tables: Mapping[str, Any], embedding_specs: Any, delete_input: bool = False
) -> dict[str, np.ndarray]:
  """{stack: stacked numpy table} of {table: logical table}; zero padding.

  Tables are placed by row_offset_in_shard (the reference concatenates them
  in the order of `table_specs`, which misplaces them when that differs).
  `delete_input` is accepted for the reference's signature; host arrays are
  freed by the caller dropping them.
  """
  del delete_input
  out = {}
  for stack in embedding_specs.stacked_table_specs:
    n, dim = stack.num_sparsecores, stack.stack_embedding_dim
    blocks = []
    for table in sorted(stack.table_specs, key=lambda t: t.row_offset_in_shard):
      if table.table_name not in feature_tables:
        raise ValueError(
          f"stack '{stack.stack_name}': table '{table.table_name}' is not in feature_tables"
        )
      if table.padded_embedding_dim != dim:
        raise ValueError(
          f"stack '{stack.stack_name}': table '{table.table_name}' has padded"
          f" embedding dim {table.padded_embedding_dim}, the stack {dim}"
        )
      values = np.asarray(feature_tables[table.table_name], np.float32)
      padded = np.pad(
        values, ((0, table.padded_vocab_size - values.shape[0]), (0, dim - values.shape[1]))
      )
      blocks.append(mod_shard(padded, n, table.shard_rotation))
    out[stack.stack_name] = np.concatenate(blocks, axis=1).reshape(-1, dim)
  return out


def unstack_and_unshard_stacked_tables(
  stacked_tables: Mapping[str, Any], embedding_specs: Any, donate: bool = False
) -> dict[str, np.ndarray]:
  """{table: logical numpy table} of {stack: stacked table}."""
  del donate
  out = {}
  for stack in embedding_specs.stacked_table_specs:
    if stack.stack_name not in stacked_tables:
      raise ValueError(f"stacked table '{stack.stack_name}' is not in stacked_tables")
    values = np.asarray(stacked_tables[stack.stack_name])
    blocks = values.reshape(stack.num_sparsecores, -1, stack.stack_embedding_dim)
    for table in stack.table_specs:
      rows = table.padded_vocab_size // stack.num_sparsecores
      start = table.row_offset_in_shard
      logical = mod_unshard(blocks[:, start : start + rows], table.shard_rotation)
      out[table.table_name] = logical[: table.vocab_size, : table.embedding_dim]
  return out

"""Table stacking on frozen specs (docs/reference/coo_format.md).

Mirrors jax-tpu-embedding 0.1.0's `prepare_feature_specs_for_training`,
`stack_tables` and `auto_stack_tables` (same names, arguments and results;
`update_preprocessing_parameters` is in limits.py), except that specs are frozen: every
function RETURNS new feature specs with the same pytree structure instead of
mutating them, because specs are static arguments of the jitted step.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
from typing import Any, Callable, Mapping, Sequence

from absl import logging
import jax
import numpy as np

from sparsepipe.transforms.coo import buffer_sizes
from sparsepipe.transforms import errors
from sparsepipe.core import specs as specs_lib
from sparsepipe.core.rounding import round_up

Nested = Any
# (stack_name, stack_sample_count) -> limit, like the reference's callables.
LimitsCallable = Callable[[str, int], int]

# Floors of FDO-derived limits: a stack that saw no id would otherwise get a
# limit of 0, which no buffer can be built from (the reference crashes).


def get_default_limits(name: str, batch_size: int) -> int:
  """Default limit of a multi-table stack (256), as in the reference."""
  del name, batch_size
  return 256


def _leaves(feature_specs: Nested) -> list[specs_lib.FeatureSpec]:
  leaves = jax.tree_util.tree_leaves(feature_specs)
  for f in leaves:
    if not isinstance(f, specs_lib.FeatureSpec):
      raise errors.StackingError(
        f"feature_specs leaves must be FeatureSpec, got {type(f).__name__}"
      )
  names = collections.Counter(f.name for f in leaves)
  for name, count in names.items():
    if count > 1:
      raise errors.StackingError(f"feature '{name}' is defined {count} times")
  return leaves


def _tables(leaves: Sequence[specs_lib.FeatureSpec]) -> dict[str, specs_lib.TableSpec]:
  """Table name -> spec, in first-appearance order; one spec per name."""
  tables: dict[str, specs_lib.TableSpec] = {}
  for f in leaves:
    t = f.table_spec
    if t.name in tables and tables[t.name] != t:
      raise errors.StackingError(
        f"table '{t.name}' appears with two different TableSpecs (feature '{f.name}')"
      )
    tables.setdefault(t.name, t)
  return tables


def _is_stacked(table: specs_lib.TableSpec) -> bool:
  return table.stacked_table_spec is not None


def _stacked_elsewhere(table: specs_lib.TableSpec) -> bool:
  """In a stack not named after itself (a table alone may be re-stacked)."""
  setting = table.setting_in_stack
  return setting is not None and setting.stack_name != table.name


def _batch(feature: specs_lib.FeatureSpec) -> int:
  return int(np.prod(feature.output_shape[:-1]))


def _padded_dim(table: specs_lib.TableSpec) -> int:
  return round_up(table.embedding_dim, buffer_sizes.ALIGNMENT)


def _padded_vocab(table: specs_lib.TableSpec, num_sc: int) -> int:
  return round_up(table.vocabulary_size, buffer_sizes.ALIGNMENT * num_sc)


def _check_columns_fit_int32(
  stack_name: str, table: specs_lib.TableSpec, col_offset: int, num_sc: int
) -> None:
  """COO columns (id + col_offset, MOD-rounded) are int32 in the buffers.

  The last column a table can reach is col_offset + roundup(vocab, N) - 1;
  past INT_MAX the ids would wrap to negative values (and the reference
  computes them in int32 too), and a row id (column div N) of INT_MAX would
  read as padding, so such a stack is refused.
  """
  last = col_offset + round_up(table.vocabulary_size, num_sc) - 1
  if last > buffer_sizes.INT_MAX or last // num_sc >= buffer_sizes.INT_MAX:
    raise errors.StackingError(
      f"stack '{stack_name}': table '{table.name}' reaches column {last}"
      f" (col_offset {col_offset} + {table.vocabulary_size} rows); COO columns"
      f" are int32 and must stay below INT_MAX={buffer_sizes.INT_MAX}: stack"
      " fewer or smaller tables"
    )


def _replace_features(
  feature_specs: Nested, update: Callable[[specs_lib.FeatureSpec], specs_lib.FeatureSpec]
) -> Nested:
  return jax.tree_util.tree_map(update, feature_specs)


def prepare_feature_specs_for_training(
  feature_specs: Nested, global_device_count: int, num_sc_per_device: int
) -> Nested:
  """Gives every not yet stacked table its own stack; returns new specs.

  Several features on one table share its stack (feature stacking); their
  row_offsets are running sums of global batch sizes in feature-name order.
  Already stacked tables are returned unchanged.
  """
  num_sc = buffer_sizes.num_global_sparsecores(global_device_count, num_sc_per_device)
  leaves = _leaves(feature_specs)
  _tables(leaves)
  by_table: dict[str, list[specs_lib.FeatureSpec]] = collections.defaultdict(list)
  for f in leaves:
    if not _is_stacked(f.table_spec):
      by_table[f.table_spec.name].append(f)

  row_offsets: dict[str, int] = {}
  new_tables: dict[str, specs_lib.TableSpec] = {}
  for table_name, features in by_table.items():
    offset = 0
    for f in sorted(features, key=lambda f: f.name):
      row_offsets[f.name] = offset
      offset += _batch(f)
    table = features[0].table_spec
    _check_columns_fit_int32(table_name, table, 0, num_sc)
    padded_vocab = _padded_vocab(table, num_sc)
    padded_dim = _padded_dim(table)
    stacked = specs_lib.StackedTableSpec(
      stack_name=table_name,
      stack_vocab_size=padded_vocab,
      stack_embedding_dim=padded_dim,
      optimizer=table.optimizer,
      combiner=table.combiner,
      total_sample_count=offset,
      max_ids_per_partition=table.max_ids_per_partition,
      max_unique_ids_per_partition=table.max_unique_ids_per_partition,
      suggested_coo_buffer_size_per_device=table.suggested_coo_buffer_size_per_device,
    )
    new_tables[table_name] = dataclasses.replace(
      table,
      setting_in_stack=specs_lib.TableSettingInStack(
        stack_name=table_name,
        padded_vocab_size=padded_vocab,
        padded_embedding_dim=padded_dim,
        row_offset_in_shard=0,
        shard_rotation=0,
      ),
      stacked_table_spec=stacked,
    )

  transformations = _missing_transformations(leaves, num_sc)

  def update(f: specs_lib.FeatureSpec) -> specs_lib.FeatureSpec:
    if f.name in transformations:
      return dataclasses.replace(f, id_transformation=transformations[f.name])
    if f.name not in row_offsets:
      return f
    return dataclasses.replace(
      f,
      table_spec=new_tables[f.table_spec.name],
      id_transformation=specs_lib.FeatureIdTransformation(
        row_offset=row_offsets[f.name], col_offset=0, col_shift=0
      ),
    )

  return _replace_features(feature_specs, update)


def _missing_transformations(
  leaves: Sequence[specs_lib.FeatureSpec], num_sc: int
) -> dict[str, specs_lib.FeatureIdTransformation]:
  """Id transformations of stacked tables' features built without one.

  Specs may come with their table's stack settings but no transformation
  (e.g. built by hand from saved settings). When no feature of a stack has
  one, they are derived as stack_tables would: row offsets are running sums
  of batch sizes in leaf order, columns follow the table's setting. A stack
  where only some features have one is ambiguous and an error.
  """
  by_stack: dict[str, list[specs_lib.FeatureSpec]] = collections.defaultdict(list)
  for f in leaves:
    if not _is_stacked(f.table_spec):
      continue
    stack = f.table_spec.stacked_table_spec.stack_name
    if f.table_spec.setting_in_stack is None:
      raise errors.StackingError(
        f"table '{f.table_spec.name}' has the StackedTableSpec of stack"
        f" '{stack}' but no setting_in_stack; give both or neither"
      )
    by_stack[stack].append(f)
  out: dict[str, specs_lib.FeatureIdTransformation] = {}
  for stack, features in by_stack.items():
    missing = [f.name for f in features if f.id_transformation is None]
    if not missing:
      continue
    if len(missing) < len(features):
      given = next(f.name for f in features if f.id_transformation is not None)
      raise errors.StackingError(
        f"stack '{stack}': features {missing} have no id_transformation but"
        f" feature '{given}' has one; set all or none of them"
      )
    offset = 0
    for f in features:
      setting = f.table_spec.setting_in_stack
      out[f.name] = specs_lib.FeatureIdTransformation(
        row_offset=offset,
        col_offset=setting.row_offset_in_shard * num_sc,
        col_shift=setting.shard_rotation,
      )
      offset += _batch(f)
  return out


def stack_name_for(
  table_names: Sequence[str],
  use_short_stack_names: bool = True,
  max_display_length: int = 50,
  hash_length: int = 12,
) -> str:
  """Default stack name: joined table names, shortened with a sha256 suffix."""
  name = "_".join(table_names)
  if not use_short_stack_names or len(name) <= max_display_length:
    return name
  digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:hash_length]
  return name[:max_display_length] + "..." + digest


def stack_tables(
  feature_specs: Nested,
  table_names: Sequence[str],
  global_device_count: int,
  num_sc_per_device: int,
  rotation: int | None = None,
  stack_to_max_ids_per_partition: LimitsCallable = get_default_limits,
  stack_to_max_unique_ids_per_partition: LimitsCallable = get_default_limits,
  stack_name: str | None = None,
  fail_on_excess_padding: bool = False,
) -> Nested:
  """Stacks the named tables into one physical table; returns new specs.

  Tables are placed in the given order; table k gets row_offset_in_shard =
  sum of earlier padded vocabularies / N and shard_rotation = k*rotation
  mod N (rotation defaults to S). Features of these tables get row_offsets
  in pytree-leaf order. A single table keeps its own M and U; a stack of
  several gets the limits of the two callables (default 256), as in the
  reference. The tables must share optimizer and combiner. Tables of
  different padded embedding dims (multiples of 8) are all padded to the
  largest: a warning reports the excess padding, an error with
  `fail_on_excess_padding=True` (the reference's flag). Each feature still
  gets activations of its own dim.
  """
  num_sc = buffer_sizes.num_global_sparsecores(global_device_count, num_sc_per_device)
  table_names = list(table_names)
  if not table_names:
    raise errors.StackingError("stack_tables needs at least one table name")
  stack_name = stack_name or stack_name_for(table_names)
  leaves = _leaves(feature_specs)
  tables = _tables(leaves)
  _verify_stack(stack_name, table_names, tables, leaves)
  stack_dim = _stack_dim(stack_name, table_names, tables, num_sc, fail_on_excess_padding)

  rotation = int(num_sc_per_device if rotation is None else rotation)
  settings: dict[str, specs_lib.TableSettingInStack] = {}
  row_offset_in_shard = 0
  for k, name in enumerate(table_names):
    table = tables[name]
    _check_columns_fit_int32(stack_name, table, row_offset_in_shard * num_sc, num_sc)
    padded_vocab = _padded_vocab(table, num_sc)
    settings[name] = specs_lib.TableSettingInStack(
      stack_name=stack_name,
      padded_vocab_size=padded_vocab,
      padded_embedding_dim=stack_dim,
      row_offset_in_shard=row_offset_in_shard,
      shard_rotation=(k * rotation) % num_sc,
    )
    row_offset_in_shard += padded_vocab // num_sc

  row_offsets: dict[str, int] = {}
  sample_count = 0
  for f in leaves:
    if f.table_spec.name in settings:
      row_offsets[f.name] = sample_count
      sample_count += _batch(f)

  first = tables[table_names[0]]
  if len(table_names) == 1:
    max_ids, max_unique = first.max_ids_per_partition, first.max_unique_ids_per_partition
  else:
    max_ids = stack_to_max_ids_per_partition(stack_name, sample_count)
    max_unique = stack_to_max_unique_ids_per_partition(stack_name, sample_count)
  stacked = specs_lib.StackedTableSpec(
    stack_name=stack_name,
    stack_vocab_size=sum(s.padded_vocab_size for s in settings.values()),
    stack_embedding_dim=stack_dim,
    optimizer=first.optimizer,
    combiner=first.combiner,
    total_sample_count=sample_count,
    max_ids_per_partition=int(max_ids),
    max_unique_ids_per_partition=int(max_unique),
  )
  new_tables = {
    name: dataclasses.replace(
      tables[name], setting_in_stack=settings[name], stacked_table_spec=stacked
    )
    for name in table_names
  }

  def update(f: specs_lib.FeatureSpec) -> specs_lib.FeatureSpec:
    setting = settings.get(f.table_spec.name)
    if setting is None:
      return f
    return dataclasses.replace(
      f,
      table_spec=new_tables[f.table_spec.name],
      id_transformation=specs_lib.FeatureIdTransformation(
        row_offset=row_offsets[f.name],
        col_offset=setting.row_offset_in_shard * num_sc,
        col_shift=setting.shard_rotation,
      ),
    )

  return _replace_features(feature_specs, update)


def _verify_stack(
  stack_name: str,
  table_names: Sequence[str],
  tables: Mapping[str, specs_lib.TableSpec],
  leaves: Sequence[specs_lib.FeatureSpec],
) -> None:
  counts = collections.Counter(table_names)
  for name, count in counts.items():
    if count > 1:
      # The reference's words, which its users may match on.
      raise errors.StackingError(f"Table {name} is repeated in group {stack_name}.")
    if name not in tables:
      raise errors.StackingError(f"table '{name}' of stack '{stack_name}' is used by no feature")
    if _stacked_elsewhere(tables[name]):
      raise errors.StackingError(
        f"table '{name}' is already stacked in stack '{tables[name].setting_in_stack.stack_name}'"
      )
  for f in leaves:
    if _stacked_elsewhere(f.table_spec) and f.table_spec.setting_in_stack.stack_name == stack_name:
      raise errors.StackingError(
        f"stack name '{stack_name}' is already used by table '{f.table_spec.name}'"
      )
  first = tables[table_names[0]]
  for name in table_names[1:]:
    t = tables[name]
    for what, a, b in (
      ("optimizers", first.optimizer, t.optimizer),
      ("combiners", first.combiner, t.combiner),
    ):
      if a != b:
        raise errors.StackingError(
          f"stack '{stack_name}': tables '{first.name}' and '{name}' have"
          f" different {what} ({a!r} vs {b!r})"
        )


def _stack_dim(
  stack_name: str,
  table_names: Sequence[str],
  tables: Mapping[str, specs_lib.TableSpec],
  num_sc: int,
  fail_on_excess_padding: bool,
) -> int:
  """The stack's embedding dim: the largest padded dim of its tables.

  Narrower tables are padded up to it; the padding (values) is reported as
  a warning, or raised as a StackingError if `fail_on_excess_padding`.
  """
  dims = {name: _padded_dim(tables[name]) for name in table_names}
  stack_dim = max(dims.values())
  excess = sum(
    (stack_dim - dims[name]) * _padded_vocab(tables[name], num_sc) for name in table_names
  )
  if excess:
    message = (
      f"stack '{stack_name}': tables {list(table_names)} have padded"
      f" embedding dims {list(dims.values())}; padding them to {stack_dim}"
      f" adds {excess} values. Stack tables of equal padded dims to save"
      " memory"
    )
    if fail_on_excess_padding:
      raise errors.StackingError(message)
    logging.warning("%s", message)
  return stack_dim


def _stack_groups(
  leaves: Sequence[specs_lib.FeatureSpec],
  tables: Mapping[str, specs_lib.TableSpec],
  num_sc: int,
  activation_mem_bytes_limit: int,
) -> list[list[str]]:
  """Reference grouping: (padded dim, optimizer, combiner), then memory split."""
  groups: dict[tuple, list[str]] = {}
  for name, t in tables.items():
    groups.setdefault((_padded_dim(t), t.optimizer, t.combiner), []).append(name)
  samples: dict[str, int] = collections.defaultdict(int)
  for f in leaves:
    samples[f.table_spec.name] += _batch(f) // num_sc
  mem = {name: _padded_dim(t) * samples[name] * 4 for name, t in tables.items()}
  result = []
  for group in groups.values():
    split: list[list[str]] = []
    for name in group:
      for candidate in split:
        if sum(mem[c] for c in candidate) + mem[name] <= activation_mem_bytes_limit:
          candidate.append(name)
          break
      else:
        split.append([name])
    result.extend(split)
  return result


def auto_stack_tables(
  feature_specs: Nested,
  global_device_count: int,
  num_sc_per_device: int,
  rotation: int | None = None,
  stack_to_max_ids_per_partition: LimitsCallable = get_default_limits,
  stack_to_max_unique_ids_per_partition: LimitsCallable = get_default_limits,
  *,
  use_short_stack_names: bool = True,
  activation_mem_bytes_limit: int = 2048 * 1024,
) -> Nested:
  """Stacks all compatible tables as the reference does; returns new specs.

  Tables (first-appearance order in the pytree leaves) are grouped by padded
  embedding dim, optimizer and combiner; a group is split first-fit so that
  the per-SC activation bytes (padded dim * batch/N * 4) of a stack stay
  within `activation_mem_bytes_limit`. Every group becomes one stack named
  by `stack_name_for`. Tables must not be stacked yet.
  """
  num_sc = buffer_sizes.num_global_sparsecores(global_device_count, num_sc_per_device)
  leaves = _leaves(feature_specs)
  tables = _tables(leaves)
  groups = _stack_groups(leaves, tables, num_sc, activation_mem_bytes_limit)
  for group in groups:
    feature_specs = stack_tables(
      feature_specs,
      group,
      global_device_count,
      num_sc_per_device,
      rotation=rotation,
      stack_to_max_ids_per_partition=stack_to_max_ids_per_partition,
      stack_to_max_unique_ids_per_partition=stack_to_max_unique_ids_per_partition,
      stack_name=stack_name_for(group, use_short_stack_names),
    )
  return feature_specs


def get_stacked_table_specs(feature_specs: Nested) -> dict[str, specs_lib.StackedTableSpec]:
  """Stack name -> StackedTableSpec of prepared feature specs."""
  result: dict[str, specs_lib.StackedTableSpec] = {}
  for f in _leaves(feature_specs):
    stacked = f.table_spec.stacked_table_spec
    if stacked is None:
      raise errors.StackingError(
        f"feature '{f.name}' (table '{f.table_spec.name}') is not prepared:"
        " call prepare_feature_specs_for_training first"
      )
    if stacked.stack_name in result and result[stacked.stack_name] != stacked:
      raise errors.StackingError(
        f"stack '{stacked.stack_name}': feature '{f.name}' carries a"
        " different StackedTableSpec than other features of the stack"
      )
    result.setdefault(stacked.stack_name, stacked)
  return result


def get_table_stacks(feature_specs: Nested) -> dict[str, list[str]]:
  """Stack name -> names of its tables, in order of their place in the stack."""
  stacks: dict[str, dict[str, int]] = collections.defaultdict(dict)
  for f in _leaves(feature_specs):
    t = f.table_spec
    setting = t.setting_in_stack
    if setting is None or t.stacked_table_spec is None:
      stacks[t.name][t.name] = 0
    else:
      stacks[setting.stack_name][t.name] = setting.row_offset_in_shard
  return {name: sorted(members, key=members.get) for name, members in stacks.items()}

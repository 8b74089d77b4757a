"""Per-host COO preprocessing: features -> SparseCore buffers + statistics.

Same signatures, outputs and statistics as jax-tpu-embedding 0.1.0's
`preprocess_sparse_dense_matmul_input(_from_sparse_tensor)` (see
docs/reference/coo_format.md), computed with vectorised numpy. Where the reference
aborts or silently drops data we raise a `PreprocessingError` (a ValueError)
that names the feature/stack, the limit and the observed value.
"""

from __future__ import annotations

from typing import Any, Sequence

from absl import logging
import jax

from sparsepipe.transforms.coo import inputs as coo_inputs
from sparsepipe.transforms.coo import buffer_sizes
from sparsepipe.transforms.coo import stack as coo_stack
from sparsepipe.core import coo_types
from sparsepipe.transforms import errors
from sparsepipe.core import specs as specs_lib

Nested = Any


def _flatten_specs(
  feature_specs: Nested,
) -> tuple[list[specs_lib.FeatureSpec], Any]:
  leaves, treedef = jax.tree_util.tree_flatten(feature_specs)
  seen = set()
  for i, spec in enumerate(leaves):
    if not isinstance(spec, specs_lib.FeatureSpec):
      raise errors.PreprocessingError(
        f"feature_specs leaves must be FeatureSpec, got {type(spec).__name__}"
      )
    if spec.name in seen:
      raise errors.PreprocessingError(f"feature '{spec.name}' is defined twice")
    seen.add(spec.name)
    table = spec.table_spec
    if table.stacked_table_spec is None or table.setting_in_stack is None:
      raise errors.PreprocessingError(
        f"feature '{spec.name}' (table '{table.name}') is not prepared: call"
        " prepare_feature_specs_for_training (or stack_tables) first"
      )
    leaves[i] = specs_lib.with_default_id_transformation(spec)
  return leaves, treedef


def _flatten_like(what: str, tree: Nested, treedef: Any) -> list[Any]:
  try:
    return treedef.flatten_up_to(tree)
  except (ValueError, TypeError) as e:
    raise errors.PreprocessingError(
      f"{what} do not have the structure of feature_specs ({treedef}): {e}"
    ) from None


def _geometry(
  local_device_count: int,
  global_device_count: int,
  num_sc_per_device: int,
  sharding_strategy: str,
) -> buffer_sizes.Geometry:
  if str(sharding_strategy).upper() != "MOD":
    raise errors.PreprocessingError(
      f"sharding_strategy {sharding_strategy!r} is not supported; only MOD"
    )
  buffer_sizes.num_global_sparsecores(global_device_count, num_sc_per_device)
  local, total = int(local_device_count), int(global_device_count)
  if local < 1 or total % local:
    raise errors.PreprocessingError(
      f"local_device_count={local} must be positive and divide global_device_count={total}"
    )
  return buffer_sizes.Geometry(local, total, int(num_sc_per_device))


def _group_by_stack(
  specs: Sequence[specs_lib.FeatureSpec],
  inputs: Sequence[coo_inputs.FeatureInput],
) -> dict[str, tuple[specs_lib.StackedTableSpec, list]]:
  stacks: dict[str, tuple[specs_lib.StackedTableSpec, list]] = {}
  for spec, x in zip(specs, inputs):
    stacked = spec.table_spec.stacked_table_spec
    name = spec.table_spec.setting_in_stack.stack_name
    if name not in stacks:
      stacks[name] = (stacked, [])
    elif stacks[name][0] != stacked:
      other = stacks[name][1][0][0].name
      raise errors.PreprocessingError(
        f"stack '{name}': features '{other}' and '{spec.name}' carry"
        " different StackedTableSpecs (limits or sizes); re-run stacking or"
        " update_preprocessing_parameters on all features"
      )
    stacks[name][1].append((spec, x))
  return stacks


def _run(
  specs: Sequence[specs_lib.FeatureSpec],
  inputs: Sequence[coo_inputs.FeatureInput],
  geo: buffer_sizes.Geometry,
  has_leading_dimension: bool,
  allow_id_dropping: bool,
  batch_number: int,
) -> tuple[coo_types.PreprocessedInput, coo_types.SparseDenseMatmulInputStats]:
  logging.vlog(1, "preprocessing batch %d: %d features", batch_number, len(specs))
  row_pointers, embedding_ids, sample_ids, gains = {}, {}, {}, {}
  max_ids, max_unique, required, drops = {}, {}, {}, {}
  for name, (stacked, members) in _group_by_stack(specs, inputs).items():
    r = coo_stack.preprocess_stack(name, stacked, members, geo, allow_id_dropping)
    if has_leading_dimension:
      shape = (geo.local_devices, -1)
      row_pointers[name] = r.row_pointers.reshape(shape)
      embedding_ids[name] = r.embedding_ids.reshape(shape)
      sample_ids[name] = r.sample_ids.reshape(shape)
      gains[name] = r.gains.reshape(shape)
    else:
      row_pointers[name] = r.row_pointers
      embedding_ids[name] = r.embedding_ids
      sample_ids[name] = r.sample_ids
      gains[name] = r.gains
    max_ids[name] = r.max_ids_per_partition
    max_unique[name] = r.max_unique_ids_per_partition
    required[name] = r.required_buffer_size_per_sc
    drops[name] = r.id_drop_counter
  return (
    coo_types.PreprocessedInput(
      coo_types.SparseDenseMatmulInput(
        lhs_row_pointers=row_pointers,
        lhs_embedding_ids=embedding_ids,
        lhs_sample_ids=sample_ids,
        lhs_gains=gains,
      )
    ),
    coo_types.SparseDenseMatmulInputStats(
      max_ids_per_partition=max_ids,
      max_unique_ids_per_partition=max_unique,
      required_buffer_size_per_sc=required,
      id_drop_counters=drops,
    ),
  )


def preprocess_sparse_dense_matmul_input(
  features: Nested,
  features_weights: Nested | None,
  feature_specs: Nested,
  local_device_count: int,
  global_device_count: int,
  *,
  num_sc_per_device: int,
  sharding_strategy: str = "MOD",
  has_leading_dimension: bool = False,
  allow_id_dropping: bool = False,
  batch_number: int = 0,
) -> tuple[coo_types.PreprocessedInput, coo_types.SparseDenseMatmulInputStats]:
  """Turns this host's sparse features into per-stack COO buffers.

  Args:
    features: pytree like feature_specs; each leaf a dense [B, k] int array,
      ragged rows (1-D object array or list of 1-D int arrays) or a
      `sparsepipe.data.RaggedBatch`. B is this host's batch.
    features_weights: None (all weights 1.0) or a pytree like features with
      float weights of the same shapes (a leaf may be None).
    feature_specs: pytree of prepared FeatureSpecs (stacking done).
    local_device_count: devices of this host, L.
    global_device_count: devices of the mesh, G.
    num_sc_per_device: SparseCores per device, S (G*S a power of two).
    sharding_strategy: only "MOD".
    has_leading_dimension: shapes (L, ...) instead of flat (L*...,).
    allow_id_dropping: drop ids over the limits (counted in the statistics)
      instead of raising LimitExceededError.
    batch_number: the batch's number, for logging (as in the reference).

  Returns:
    (PreprocessedInput, SparseDenseMatmulInputStats), keyed by stack name.
  """
  specs, treedef = _flatten_specs(feature_specs)
  geo = _geometry(local_device_count, global_device_count, num_sc_per_device, sharding_strategy)
  leaves = _flatten_like("features", features, treedef)
  if features_weights is None:
    weight_leaves = [None] * len(specs)
  else:
    weight_leaves = _flatten_like("features_weights", features_weights, treedef)
  inputs = [
    coo_inputs.normalize_feature(spec.name, x, w)
    for spec, x, w in zip(specs, leaves, weight_leaves)
  ]
  return _run(specs, inputs, geo, has_leading_dimension, allow_id_dropping, batch_number)


def preprocess_sparse_dense_matmul_input_from_sparse_tensor(
  indices: Nested,
  values: Nested,
  dense_shapes: Nested,
  feature_specs: Nested,
  local_device_count: int,
  global_device_count: int,
  *,
  num_sc_per_device: int,
  sharding_strategy: str = "MOD",
  has_leading_dimension: bool = False,
  allow_id_dropping: bool = False,
  batch_number: int = 0,
) -> tuple[coo_types.PreprocessedInput, coo_types.SparseDenseMatmulInputStats]:
  """Like preprocess_sparse_dense_matmul_input for sparse-tensor features.

  Each feature is (indices [n, 2] row-major, values [n], dense_shape [B, k]);
  all weights are 1.0, as in the reference. `batch_number` is for logging.
  """
  specs, treedef = _flatten_specs(feature_specs)
  geo = _geometry(local_device_count, global_device_count, num_sc_per_device, sharding_strategy)
  index_leaves = _flatten_like("indices", indices, treedef)
  value_leaves = _flatten_like("values", values, treedef)
  shape_leaves = _flatten_like("dense_shapes", dense_shapes, treedef)
  inputs = [
    coo_inputs.from_sparse_tensor(spec.name, i, v, s)
    for spec, i, v, s in zip(specs, index_leaves, value_leaves, shape_leaves)
  ]
  return _run(specs, inputs, geo, has_leading_dimension, allow_id_dropping, batch_number)

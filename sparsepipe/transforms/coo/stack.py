"""COO buffers and statistics of one stack (docs/reference/coo_format.md): checks, then
sort (coo_sort) and layout (coo_buffers)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from sparsepipe.transforms.coo import buffers as coo_buffers
from sparsepipe.transforms.coo import inputs as coo_inputs
from sparsepipe.transforms.coo import buffer_sizes
from sparsepipe.transforms.coo import sort as coo_sort
from sparsepipe.transforms import errors
from sparsepipe.core import specs as specs_lib

Geometry = buffer_sizes.Geometry
StackResult = coo_buffers.StackResult


def _who(stack: str, features: Sequence[coo_sort.StackFeature]) -> str:
  if len(features) == 1:
    return f"feature '{features[0].spec.name}' (stack '{stack}')"
  names = ", ".join(f"'{f.spec.name}'" for f in features)
  return f"features {names} (stack '{stack}')"


def _check_feature(
  stack: str,
  spec: specs_lib.FeatureSpec,
  x: coo_inputs.FeatureInput,
  geo: Geometry,
) -> int:
  """Batch splits evenly over local SCs, matches the spec; ids in range.

  Returns the largest id (-1 without ids).
  """
  batch = x.row_lengths.shape[0]
  who = f"feature '{spec.name}' (stack '{stack}')"
  if batch % geo.local_sc:
    raise errors.PreprocessingError(
      f"{who}: batch of {batch} rows is not divisible by"
      f" local_device_count*num_sc_per_device="
      f"{geo.local_devices}*{geo.sc_per_device}={geo.local_sc}"
    )
  global_batch = math.prod(spec.output_shape[:-1])
  if batch * geo.global_devices != global_batch * geo.local_devices:
    raise errors.PreprocessingError(
      f"{who}: batch of {batch} rows on this host does not match the global"
      f" batch {global_batch} of its spec for {geo.local_devices}"
      f" local of {geo.global_devices} global devices (expected"
      f" {global_batch * geo.local_devices // geo.global_devices})"
    )
  values = x.values
  if values.size == 0:
    return -1
  vocab = spec.table_spec.vocabulary_size
  lo, hi = int(values.min()), int(values.max())
  if lo >= 0 and hi < vocab:
    return hi
  bad = lo if lo < 0 else hi
  position = int(np.flatnonzero(values == bad)[0])
  sample = int(np.searchsorted(np.cumsum(x.row_lengths), position, "right"))
  raise errors.PreprocessingError(
    f"{who}: id {bad} in sample {sample} is outside the vocabulary"
    f" [0, {vocab}) of table '{spec.table_spec.name}'"
  )


def preprocess_stack(
  stack_name: str,
  stacked_spec: specs_lib.StackedTableSpec,
  features: Sequence[tuple[specs_lib.FeatureSpec, coo_inputs.FeatureInput]],
  geo: Geometry,
  allow_id_dropping: bool,
) -> StackResult:
  """Builds the COO buffers and statistics of one stack.

  Args:
    stack_name: name keying the outputs.
    stacked_spec: limits and combiner of the stack.
    features: (spec, input) of every feature of the stack, any order.
    geo: device geometry.
    allow_id_dropping: drop ids over the limits (counted) instead of raising.

  Returns:
    The stack's buffers and statistics.
  """
  feats = []
  for spec, x in sorted(features, key=lambda fx: fx[0].id_transformation.row_offset):
    max_id = _check_feature(stack_name, spec, x, geo)
    t = spec.id_transformation
    # Largest stacked column: col_offset + the id's row rounded up to N.
    max_col = (
      max_id if not (t.col_shift or t.col_offset) else t.col_offset + (max_id | (geo.num_sc - 1))
    )
    feats.append(
      coo_sort.StackFeature(
        spec, x, x.batch_size // geo.local_sc, t.row_offset // geo.num_sc, max_col
      )
    )
  who = _who(stack_name, feats)
  for before, after in zip(feats, feats[1:]):
    if after.sid_base < before.sid_base + before.rows_per_sc:
      raise errors.PreprocessingError(
        f"{who}: feature '{after.spec.name}' (row_offset"
        f" {after.spec.id_transformation.row_offset}) overlaps the samples"
        f" of feature '{before.spec.name}'"
      )
  limits = (int(stacked_spec.max_ids_per_partition), int(stacked_spec.max_unique_ids_per_partition))
  if min(limits) < 1:
    raise errors.PreprocessingError(
      f"{who}: max_ids_per_partition={limits[0]} and"
      f" max_unique_ids_per_partition={limits[1]} must be positive"
    )
  coo_size = buffer_sizes.compute_coo_buffer_size_per_device(
    stacked_spec, geo.sc_per_device, geo.global_devices
  )
  nonempty = [f for f in feats if f.x.values.size]
  if not nonempty:
    return coo_buffers.empty_result(geo, coo_size)
  if any(f.x.weights is not None for f in nonempty):
    ids = coo_sort.sort_by_position(nonempty, stacked_spec.combiner, geo, who)
  else:
    ids = coo_sort.sort_by_sample(nonempty, stacked_spec.combiner, geo, who)
  return coo_buffers.layout(ids, who, stacked_spec, limits, coo_size, geo, allow_id_dropping)

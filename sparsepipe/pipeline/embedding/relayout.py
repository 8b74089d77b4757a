"""Re-laying out stacked embedding variables for another device count.

The MOD layout places logical row r of a stack on SparseCore r mod N, and
the stacking offsets and rotations depend on N, so a change of the device
count moves rows. The variables are brought back to logical per-table rows
with the layout they were made for, then stacked again for the new mesh
(through host memory: every process holds the logical tables of all stacks
once). Checkpoint restores use it when the device count changed.
"""

from __future__ import annotations

from typing import Any, Mapping

from jax.sharding import Mesh

from sparsepipe.pipeline.embedding.variables import EmbeddingVariables
from sparsepipe.pipeline.embedding.variables import stack_embedding_variables
from sparsepipe.pipeline.embedding.variables import unstack_embedding_variables


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

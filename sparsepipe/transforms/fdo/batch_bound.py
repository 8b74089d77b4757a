"""COO buffers no larger than one batch can fill.

A stack without a suggested buffer size gets room for every partition of
every SparseCore full to max_ids_per_partition (T = round8(M) * S * N per
device), about N times what a batch can fill: one SC gets ceil(batch / N)
samples with at most I ids of the stack each (`most_ids_per_sparsecore`),
and rounds each of its N partitions up to 8, so it never needs more than
I_sc + 7 * N entries. `bound_coo_buffers_by_the_batch` sets that bound as
the suggestion where it is below T (and lowers larger suggestions, e.g.
an FDO result with headroom, to it): smaller input blocks and step
buffers, and no batch can overflow them. Buffers stay byte-identical to
the reference's for the same specs: this only chooses the suggestion.

Likewise max_ids_per_partition and max_unique_ids_per_partition are
lowered to I_sc where they are above it (one partition of a SC never holds
more ids than the SC's samples do): FDO's headroom, or limits carried over
a resize, would otherwise size the step's exchange buffers for counts no
batch can reach (e.g. 1280 where a batch can put at most 832 ids in a
partition, after a 1 -> 4 -> 1 device round trip).
"""

from __future__ import annotations

from typing import Any

from sparsepipe.core.rounding import round_up
from sparsepipe.transforms.coo import buffer_sizes
from sparsepipe.transforms.fdo import carry
from sparsepipe.transforms.fdo import limits as limits_lib


def _most_ids(
  feature_specs: Any, num_sc_per_device: int, global_device_count: int
) -> tuple[int, dict[str, int]]:
  """(N global SparseCores, {stack: the most ids one SC's samples hold})."""
  n = buffer_sizes.num_global_sparsecores(global_device_count, num_sc_per_device)
  return n, carry.most_ids_per_sparsecore(feature_specs, n)


def _entries(per_sc: dict[str, int], n: int, num_sc_per_device: int) -> dict[str, int]:
  pad = (buffer_sizes.ALIGNMENT - 1) * n
  return {
    stack: round_up(ids + pad, buffer_sizes.ALIGNMENT) * int(num_sc_per_device)
    for stack, ids in per_sc.items()
  }


def most_coo_entries_per_device(
  feature_specs: Any, num_sc_per_device: int, global_device_count: int
) -> dict[str, int]:
  """{stack: the most COO entries a batch can put in one device's buffer}, as a
  suggested_coo_buffer_size_per_device (a multiple of 8 * S)."""
  n, per_sc = _most_ids(feature_specs, num_sc_per_device, global_device_count)
  return _entries(per_sc, n, num_sc_per_device)


def bound_coo_buffers_by_the_batch(
  feature_specs: Any, num_sc_per_device: int, global_device_count: int
) -> Any:
  """New specs whose limits and suggested COO buffers are at most what a batch can
  fill (module doc)."""
  n, most_ids = _most_ids(feature_specs, num_sc_per_device, global_device_count)
  most = _entries(most_ids, n, num_sc_per_device)
  stack_limits = limits_lib.get_stack_limits(feature_specs)
  for stack, values in stack_limits.items():
    for name in ("max_ids_per_partition", "max_unique_ids_per_partition"):
      values[name] = min(int(values[name]), most_ids[stack])
    theoretical = buffer_sizes.compute_theoretical_max_coo_buffer_size(
      values["max_ids_per_partition"], global_device_count, num_sc_per_device
    )
    current = values["suggested_coo_buffer_size_per_device"]
    current = theoretical if current is None else int(current)
    if most[stack] < current:
      values["suggested_coo_buffer_size_per_device"] = most[stack]
  return limits_lib.apply_stack_limits(feature_specs, stack_limits)

"""Sizes of the COO buffers (docs/reference/coo_format.md "Buffer sizes"), shared with devices.

The device side allocates its static shapes from these numbers, so they are
the single source of truth for: the number of global SparseCores N, the row
pointer count per device R*S, the theoretical maximum COO buffer T and the
COO buffer size per device C.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from sparsepipe.transforms import errors
from sparsepipe.core import specs as specs_lib
from sparsepipe.core.rounding import is_power_of_two, round_up

INT_MAX = 2**31 - 1
ALIGNMENT = 8


@dataclasses.dataclass(frozen=True)
class Geometry:
  """Device geometry of one preprocessing call."""

  local_devices: int  # L
  global_devices: int  # G
  sc_per_device: int  # S

  @property
  def num_sc(self) -> int:  # N
    return self.global_devices * self.sc_per_device

  @property
  def local_sc(self) -> int:  # L*S
    return self.local_devices * self.sc_per_device

  @property
  def row_pointer_stride(self) -> int:  # R
    return max(self.num_sc, ALIGNMENT)


def num_global_sparsecores(global_device_count: int, num_sc_per_device: int) -> int:
  """N = G*S, checked to be a power of two (the MOD layout needs it)."""
  g, s = int(global_device_count), int(num_sc_per_device)
  if g < 1 or s < 1:
    raise errors.PreprocessingError(
      f"global_device_count={g} and num_sc_per_device={s} must be positive"
    )
  n = g * s
  if not is_power_of_two(n):
    raise errors.PreprocessingError(
      f"global_device_count*num_sc_per_device={g}*{s}={n} SparseCores is not a power of two"
    )
  return n


def compute_row_pointers_size_per_device(global_device_count: int, num_sc_per_device: int) -> int:
  """R*S row pointers per device, R = max(N, 8)."""
  n = num_global_sparsecores(global_device_count, num_sc_per_device)
  return max(n, ALIGNMENT) * int(num_sc_per_device)


def compute_theoretical_max_coo_buffer_size(
  max_ids_per_partition: int, global_device_count: int, num_sc_per_device: int
) -> int:
  """T = round8(M) * S * N: every partition of every SC full to M."""
  n = num_global_sparsecores(global_device_count, num_sc_per_device)
  if int(max_ids_per_partition) < 1:
    raise errors.PreprocessingError(
      f"max_ids_per_partition={max_ids_per_partition} must be positive"
    )
  return round_up(max_ids_per_partition, ALIGNMENT) * int(num_sc_per_device) * n


def compute_coo_buffer_size_per_device(
  stacked_spec: specs_lib.StackedTableSpec,
  num_sc_per_device: int,
  global_device_count: int,
) -> int:
  """C: T if no suggestion, else the suggestion Q rounded up to 8*S (Q <= T)."""
  theoretical = compute_theoretical_max_coo_buffer_size(
    stacked_spec.max_ids_per_partition, global_device_count, num_sc_per_device
  )
  suggested = stacked_spec.suggested_coo_buffer_size_per_device
  if suggested is None:
    return theoretical
  suggested = int(suggested)
  if suggested > theoretical:
    raise errors.PreprocessingError(
      f"stack '{stacked_spec.stack_name}':"
      f" suggested_coo_buffer_size_per_device={suggested} exceeds the"
      f" theoretical maximum {theoretical} (max_ids_per_partition="
      f"{stacked_spec.max_ids_per_partition})"
    )
  if suggested <= 0:
    raise errors.PreprocessingError(
      f"stack '{stacked_spec.stack_name}':"
      f" suggested_coo_buffer_size_per_device={suggested} must be positive"
    )
  return round_up(suggested, ALIGNMENT * int(num_sc_per_device))


def compute_coo_buffer_sizes(
  stacked_specs: Mapping[str, specs_lib.StackedTableSpec],
  num_sc_per_device: int,
  global_device_count: int,
) -> dict[str, int]:
  """C for every stack, keyed by stack name (see get_stacked_table_specs)."""
  return {
    name: compute_coo_buffer_size_per_device(spec, num_sc_per_device, global_device_count)
    for name, spec in stacked_specs.items()
  }

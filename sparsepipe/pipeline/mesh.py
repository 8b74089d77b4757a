"""The device mesh: one data axis over every device of every host."""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "data"


def make_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh over `devices` (default: all global devices), axis 'data'."""
  devices = jax.devices() if devices is None else list(devices)
  return Mesh(np.asarray(devices), (DATA_AXIS,))


def data_sharding(mesh: Mesh) -> NamedSharding:
  """Leading dimension split over the data axis."""
  return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def replicated_sharding(mesh: Mesh) -> NamedSharding:
  """Every device holds the whole array."""
  return NamedSharding(mesh, PartitionSpec())

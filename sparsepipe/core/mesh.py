"""The device mesh: one data axis over every device of every host."""

from __future__ import annotations

from typing import Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "data"


def make_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh over `devices` (default: all global devices), axis 'data'.

  The axis is `Auto` (jax.make_mesh defaults to `Explicit`): the step's
  shardings are given by NamedShardings and shard_map, not by types.
  """
  devices = jax.devices() if devices is None else list(devices)
  return jax.make_mesh(
    (len(devices),), (DATA_AXIS,), axis_types=(jax.sharding.AxisType.Auto,), devices=devices
  )


def data_sharding(mesh: Mesh) -> NamedSharding:
  """Leading dimension split over the data axis."""
  return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def replicated_sharding(mesh: Mesh) -> NamedSharding:
  """Every device holds the whole array."""
  return NamedSharding(mesh, PartitionSpec())

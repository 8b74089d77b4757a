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
  if not devices:
    raise ValueError("make_mesh was given no devices (None: all of jax.devices())")
  return jax.make_mesh(
    (len(devices),), (DATA_AXIS,), axis_types=(jax.sharding.AxisType.Auto,), devices=devices
  )


def check_mesh(mesh: Mesh) -> None:
  """Raises ValueError, saying how to make one, unless `mesh` is one Auto axis 'data'
  (`make_mesh`'s): jax.make_mesh's Explicit axes fail deep in the first jitted step."""
  if tuple(mesh.axis_names) != (DATA_AXIS,):
    raise ValueError(
      f"the mesh has axes {tuple(mesh.axis_names)}: sparsepipe needs one axis '{DATA_AXIS}'"
      " over every device (sparsepipe.core.make_mesh())"
    )
  types = tuple(getattr(mesh, "axis_types", ()) or ())
  if any(t != jax.sharding.AxisType.Auto for t in types):
    raise ValueError(
      f"the mesh's axis '{DATA_AXIS}' is {types[0].name} (jax.make_mesh's default):"
      " sparsepipe gives its shardings by NamedSharding and shard_map, on an Auto axis;"
      " make the mesh with sparsepipe.core.make_mesh(), or jax.make_mesh(...,"
      " axis_types=(jax.sharding.AxisType.Auto,))"
    )


def data_sharding(mesh: Mesh) -> NamedSharding:
  """Leading dimension split over the data axis."""
  return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def replicated_sharding(mesh: Mesh) -> NamedSharding:
  """Every device holds the whole array."""
  return NamedSharding(mesh, PartitionSpec())

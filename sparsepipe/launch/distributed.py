"""Multi-host start-up: jax.distributed, before anything touches devices."""

from __future__ import annotations

import jax
from absl import logging


def initialize(
  coordinator_address: str | None,
  num_processes: int | None,
  process_id: int | None,
  *,
  auto: bool = False,
) -> bool:
  """Starts jax.distributed when asked; returns whether it runs.

  Explicit: all of coordinator_address ("host:port"), num_processes and
  process_id. `auto=True` lets JAX detect a TPU pod or SLURM/Kubernetes
  cluster by itself. With neither, the job runs as a single process.
  """
  given = [v is not None for v in (coordinator_address, num_processes, process_id)]
  if any(given) and not all(given):
    raise ValueError(
      "multi-host needs all of --coordinator_address, --num_processes and"
      f" --process_id; got coordinator_address={coordinator_address!r},"
      f" num_processes={num_processes}, process_id={process_id}"
    )
  if all(given):
    if not 0 <= process_id < num_processes:
      raise ValueError(f"--process_id={process_id} outside 0..{num_processes - 1}")
    jax.distributed.initialize(
      coordinator_address=coordinator_address,
      num_processes=num_processes,
      process_id=process_id,
    )
  elif auto:
    jax.distributed.initialize()
  else:
    return False
  logging.info(
    "jax.distributed: process %d of %d, %d local / %d global devices",
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
  )
  return True


def coordination_client():
  """This process's jax.distributed client (the coordination service's key-value
  store), or None before it connects, or without one."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top

  return distributed.global_state.client


def shutdown(started: bool) -> None:
  if started:
    jax.distributed.shutdown()

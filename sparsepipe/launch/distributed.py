"""Multi-host start-up: jax.distributed, before anything touches devices.

A user's mistakes are named before JAX sees them: a coordinator address
that is not host:port (JAX raised an IndexError, segfaulted on a port that
is not a number, waited 300 s and aborted on one over 65535), a process
count below 1, and, on process 0, a port already in use on this host (gRPC
binds it anyway: another job's processes then joined this job's
coordinator, and the running job aborted, "tried to connect with a
different incarnation"). The wait for the other processes runs in a thread
of its own, so that a stop signal ends it with the launcher's one line and
status 42 (JAX's wait took no signal); it is said after a few seconds, and
after `wait_s` it ends with an error naming the address and the process
count (JAX aborted with a dump after its own 300 s).
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import threading
import time

import jax
from absl import logging

# The wait for the other processes is said after this long.
_SAY_WAITING_AFTER_S = 5.0


def initialize(
  coordinator_address: str | None,
  num_processes: int | None,
  process_id: int | None,
  *,
  auto: bool = False,
  wait_s: float = 300.0,
) -> bool:
  """Starts jax.distributed when asked; returns whether it runs.

  Explicit: all of coordinator_address ("host:port"), num_processes and
  process_id; the other processes must connect within `wait_s` seconds.
  `auto=True` lets JAX detect a TPU pod or SLURM/Kubernetes cluster by
  itself. With neither, the job runs as a single process.
  """
  given = [v is not None for v in (coordinator_address, num_processes, process_id)]
  if any(given) and not all(given):
    raise ValueError(
      "multi-host needs all of --coordinator_address, --num_processes and"
      f" --process_id; got coordinator_address={coordinator_address!r},"
      f" num_processes={num_processes}, process_id={process_id}"
    )
  if all(given):
    port = _check_address(coordinator_address)
    if num_processes < 1:
      raise ValueError(f"--num_processes={num_processes} must be >= 1")
    if not 0 <= process_id < num_processes:
      raise ValueError(f"--process_id={process_id} outside 0..{num_processes - 1}")
    if process_id == 0:  # the coordinator's port, on this host
      _check_port_free(coordinator_address, port)
    _initialize_or_give_up(coordinator_address, num_processes, process_id, wait_s)
    if jax.process_count() != num_processes:
      raise ValueError(
        f"--num_processes={num_processes} on process {process_id}, but the job's"
        f" coordinator (process 0) has {jax.process_count()}: start every process with"
        " the same --num_processes"
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


def _check_address(address: str) -> int:
  """The port of a host:port address; else ValueError naming it."""
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(
      f"--coordinator_address={address!r}: expected host:port, with a port in 1..65535"
    )
  return int(port)


def _check_port_free(address: str, port: int) -> None:
  """ValueError if `port` is in use on this host (a listening socket; a closed
  connection's TIME_WAIT does not count)."""
  family = socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET
  try:
    probe = socket.socket(family, socket.SOCK_STREAM)
  except OSError:  # no IPv6 on this host after all
    family, probe = socket.AF_INET, socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  with probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      probe.bind(("::" if family == socket.AF_INET6 else "", port))
    except OSError as e:
      if e.errno != errno.EADDRINUSE:
        raise
      raise ValueError(
        f"--coordinator_address={address!r}: port {port} is in use on this host (another"
        " job's coordinator, or another program): give each job a port of its own"
      ) from None


def _initialize_or_give_up(address: str, num_processes: int, process_id: int, wait_s: float):
  """jax.distributed.initialize in a thread, while this one takes stop signals
  and ends the launch after `wait_s` (os._exit: JAX's thread cannot be ended)."""
  done, failed = threading.Event(), []

  def connect() -> None:
    try:
      jax.distributed.initialize(
        coordinator_address=address,
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=int(wait_s) + 60,  # this wait ends first
      )
    except BaseException as e:  # pylint: disable=broad-exception-caught
      failed.append(e)
    finally:
      done.set()

  threading.Thread(target=connect, name="jax.distributed.initialize", daemon=True).start()
  started, said = time.monotonic(), False
  try:
    while not done.wait(0.2):
      waited = time.monotonic() - started
      if not said and waited >= _SAY_WAITING_AFTER_S:
        said = True
        print(
          f"sparsepipe: process {process_id} of {num_processes}: waiting for the job's"
          f" processes to connect at {address} (up to {wait_s:g} s)",
          file=sys.stderr,
          flush=True,
        )
      if waited >= wait_s:
        _end(
          f"error: the job's {num_processes} processes did not all connect to the"
          f" coordinator at {address} within {wait_s:g} s (process {process_id} waited):"
          " start each with the same --coordinator_address and --num_processes and a"
          " --process_id of its own, or wait longer with --distributed_wait_s",
          1,
        )
  except SystemExit as stop:  # a stop signal: launch/stopping.py printed its line
    _end("", stop.code if isinstance(stop.code, int) else 1)
  if failed:
    raise failed[0]


def _end(line: str, status: int) -> None:
  """Ends the process now: JAX's connecting thread would hold up a normal exit."""
  if line:
    print(line, file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(status)  # pylint: disable=protected-access


def coordination_client():
  """This process's jax.distributed client (the coordination service's key-value
  store), or None before it connects, or without one."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top

  return distributed.global_state.client


def shutdown(started: bool) -> None:
  if started:
    jax.distributed.shutdown()

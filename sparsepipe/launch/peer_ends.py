"""A multi-process job ends together when one of its processes ends abnormally.

A process that fails (an error, a stop while starting, a second Ctrl-C)
takes no further part in the job's collectives. The others used to wait in
them, and the failed process itself at jax.distributed.shutdown's barrier,
until JAX's timeouts aborted every process with a fatal-error dump, 100 to
300 s later; the failed process's own one-line error was lost in it, since
the launcher prints that after the shutdown.

Instead, a process that ends abnormally prints its line, records it in the
coordination service's key-value store (`end_abnormally`) and exits at once,
without the shutdown barrier. Every process polls that store in a thread
(`PeerEnds`, every POLL_S); one that finds another's end prints one line
naming that process and what it said, and exits too: with status 42 if that
process was stopped (nothing to save, or saved), else 1, without saving its
own work since the newest checkpoint. Process 0 holds the store, so when it
ends it waits (at most WAIT_FOR_PEERS_S) until the others have read it, and
then EXIT_GRACE_S for them to be gone.
A process killed outright (SIGKILL) records nothing: JAX's heartbeat
timeout still ends the others.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import NoReturn

from sparsepipe.launch.distributed import coordination_client
from sparsepipe.launch.stopping import STOPPED_EXIT_CODE

_ENDED = "sparsepipe/ended/"  # + process index: {"status": int, "line": str}
_SEEN = "sparsepipe/seen/"  # + process index: it has read an end, or ended itself
POLL_S = 1.0
WAIT_FOR_PEERS_S = 10.0
# Process 0, once the others have marked themselves gone, waits this long before it
# exits: each exits right after marking, but a process still connected when the
# service ends is aborted by JAX's client (SIGABRT and a stack dump; seen on a
# loaded machine).
EXIT_GRACE_S = 2.0


class PeerEnds:
  """Watches for another process's abnormal end (a daemon thread); see the module docstring."""

  def __init__(self):
    self._ending = threading.Event()  # this process ends (normally or not): stop watching
    self._thread = threading.Thread(target=self._watch, name="sparsepipe-peer-ends", daemon=True)
    self._thread.start()

  def stop(self) -> None:
    """Stops watching (this process ends: normally, or by `end_abnormally`)."""
    self._ending.set()
    if self._thread is not threading.current_thread():
      self._thread.join()

  def _watch(self) -> None:
    while not self._ending.wait(POLL_S):
      try:
        ended = _ended_peer()
      except Exception:  # pylint: disable=broad-exception-caught
        return  # the service is gone: JAX ends this process
      if ended is not None and not self._ending.is_set():
        _follow(*ended)


def connected() -> bool:
  """Whether this process has joined a multi-process job (a jax.distributed client)."""
  return coordination_client() is not None


def follow_an_ended_peer(watch: PeerEnds | None) -> None:
  """Exits as `PeerEnds` would if another process has ended abnormally: this
  process's own failure (a collective with it broken) is a consequence."""
  if watch is not None:
    watch.stop()
  try:
    ended = _ended_peer()
  except Exception:  # pylint: disable=broad-exception-caught
    return
  if ended is not None:
    _follow(*ended)


def end_abnormally(status: int, line: str, watch: PeerEnds | None) -> None:
  """In a multi-process job: records this process's end (`line`, already printed)
  for the others and exits with `status`. Returns only without a connected
  jax.distributed client (one process, or the failure came before it connected)."""
  if coordination_client() is None:
    return
  if watch is not None:
    watch.stop()
  me, _ = _process_index_and_count()
  try:
    coordination_client().key_value_set(
      f"{_ENDED}{me}", json.dumps({"status": status, "line": line})
    )
  except Exception:  # pylint: disable=broad-exception-caught
    pass  # the service is gone (process 0 ended): the others end by JAX's own timeouts
  _leave(status)


def _process_index_and_count() -> tuple[int, int]:
  """This process's index and the job's process count, from jax.distributed's state."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top

  state = distributed.global_state
  return int(state.process_id), int(state.num_processes)


def _ended_peer() -> tuple[int, dict] | None:
  """The lowest other process that recorded an abnormal end, and its record."""
  me, _ = _process_index_and_count()
  ended = [
    (int(k.rsplit("/", 1)[1]), v) for k, v in coordination_client().key_value_dir_get(_ENDED)
  ]
  others = sorted((k, json.loads(v)) for k, v in ended if k != me)
  return others[0] if others else None


def _follow(process: int, end: dict) -> NoReturn:
  """Says that `process` ended (its record `end`) and ends this one too."""
  me, _ = _process_index_and_count()
  line = end["line"].removeprefix("sparsepipe: ")
  stopped = end["status"] == STOPPED_EXIT_CODE
  again = "run the same commands again" if stopped else "once that is mended, run the commands"
  print(
    f"sparsepipe: process {process} of the job ended ({line}), so process {me} ends"
    f" too, without saving: {again} on every process to go on from the newest checkpoint",
    file=sys.stderr,
    flush=True,
  )
  _leave(STOPPED_EXIT_CODE if stopped else 1)


def _leave(status: int) -> NoReturn:
  """Marks this process as gone; process 0, which holds the store, first waits
  (at most WAIT_FOR_PEERS_S) for the others to have read it, and EXIT_GRACE_S
  for them to exit. Then exits."""
  me, count = _process_index_and_count()
  try:
    client = coordination_client()
    client.key_value_set(f"{_SEEN}{me}", "", allow_overwrite=True)
    deadline = time.monotonic() + WAIT_FOR_PEERS_S
    while me == 0 and len(client.key_value_dir_get(_SEEN)) < count:
      if time.monotonic() > deadline:
        break
      time.sleep(0.1)
    if me == 0 and count > 1:
      time.sleep(EXIT_GRACE_S)
  except Exception:  # pylint: disable=broad-exception-caught
    pass  # the service is gone: nothing to wait for
  _exit(status)


def _exit(status: int) -> NoReturn:
  """Ends the process now: no shutdown barrier (the others may never reach it).

  Nor Python's exit: another thread of this process may be stuck in a
  collective, or closing the input meanwhile. (The resource tracker may then
  warn of the data workers' semaphores, as after a SIGKILL; they are freed.)
  """
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # pylint: disable=protected-access

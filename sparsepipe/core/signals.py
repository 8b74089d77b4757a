"""Data workers leave stop signals to the main process.

Grain's worker processes are in the training process's group, so a group
SIGTERM (preemption) or Ctrl-C reaches them too; if they died first, the
main process could not save. They ignore both; the main process saves,
then closes its iterator, which stops them.

A worker that ignores SIGTERM would outlive a main process killed with
SIGKILL (or crashed), holding its memory and Python's resource tracker
(which exits once no process holds its pipe). So each worker also exits
as soon as its parent is gone. Not PR_SET_PDEATHSIG: Linux sends it when
the *thread* that started the child ends, and Grain starts its workers from
its prefetch threads, which end and restart while the workers must live on.
The worker instead waits on the sentinel of its parent that
multiprocessing's spawn start gives every child (a pipe that closes when
the parent process ends, on every platform spawn runs on).

A worker runs its init only after seconds of start-up (a fresh interpreter
importing the program, JAX and the pipeline); a group signal in that time
killed it, and the main process then failed with "Worker process was
terminated unexpectedly". So the workers are started with both signals
blocked (`stop_signals_blocked` around the start: the threads it starts
and their spawned processes inherit the mask, through exec), and a worker
unblocks them only once it ignores them: a signal sent meanwhile waits,
then is dropped.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from typing import Iterator

# Exit status of a worker whose parent process ended without stopping it.
PARENT_GONE_EXIT_CODE = 1


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def ignore_stop_signals_in_worker(worker_index: int, worker_count: int) -> None:
  """Grain `worker_init_fn`: this worker ignores SIGTERM and SIGINT (then unblocks
  them: see stop_signals_blocked), and exits when its parent process ends
  (exit_with_parent)."""
  del worker_index, worker_count
  for signum in _STOP_SIGNALS:
    signal.signal(signum, signal.SIG_IGN)
  signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
  exit_with_parent()


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
  """Blocks SIGTERM and SIGINT in the calling thread while the block runs.

  Around the start of data workers: the threads started in the block and the
  processes they spawn inherit the mask, so a worker takes no stop signal
  before its init ignores them. This thread takes the ones sent meanwhile
  when the block ends (nothing is lost: only delayed).
  """
  previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
  try:
    yield
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def exit_with_parent() -> bool:
  """In a multiprocessing child: ends this process as soon as its parent ends.

  A daemon thread waits on the parent's sentinel, then calls os._exit (the
  main thread may be blocked on a queue the dead parent no longer reads).
  Returns False, doing nothing, in a process multiprocessing did not start.
  """
  parent = multiprocessing.parent_process()
  if parent is None:
    return False

  def wait_then_exit() -> None:
    parent.join()
    os._exit(PARENT_GONE_EXIT_CODE)  # pylint: disable=protected-access

  threading.Thread(target=wait_then_exit, name="sparsepipe-exit-with-parent", daemon=True).start()
  return True

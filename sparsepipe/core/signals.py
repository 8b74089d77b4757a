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
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading

# Exit status of a worker whose parent process ended without stopping it.
PARENT_GONE_EXIT_CODE = 1


def ignore_stop_signals_in_worker(worker_index: int, worker_count: int) -> None:
  """Grain `worker_init_fn`: this worker ignores SIGTERM and SIGINT, and exits
  when its parent process ends (exit_with_parent)."""
  del worker_index, worker_count
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  exit_with_parent()


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

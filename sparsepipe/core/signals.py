"""Data workers leave stop signals to the main process.

Grain's worker processes are in the training process's group, so a group
SIGTERM (preemption) or Ctrl-C reaches them too; if they died first, the
main process could not save. They ignore both; the main process saves,
then closes its iterator, which stops them.
"""

from __future__ import annotations

import signal


def ignore_stop_signals_in_worker(worker_index: int, worker_count: int) -> None:
  """Grain `worker_init_fn`: this worker ignores SIGTERM and SIGINT."""
  del worker_index, worker_count
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  signal.signal(signal.SIGINT, signal.SIG_IGN)

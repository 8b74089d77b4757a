"""Preemption: save at the next step boundary on every process, then exit.

A preempted process gets SIGTERM and some seconds of grace. The loop asks
`PreemptionWatcher.should_stop(step)` after every step; when it says yes,
the loop saves that step (forced, on every process), waits for the write
and exits with PREEMPTED_EXIT_CODE, so a supervisor can tell a preemption
(restart me) from success (0) or a crash (anything else).

- Single process (jax.distributed not initialized): the watcher installs a
  SIGTERM handler that only sets a flag.
- jax.distributed initialized: JAX's preemption service already catches
  SIGTERM on the host that receives it and makes all processes agree on a
  step; should_stop(step) asks CheckpointManager.reached_preemption(step),
  which is True on every process at that same step. The watcher then does
  not install its own handler (it would replace JAX's). Call should_stop at
  every step on every process, starting from the same step.
- Ctrl-C (SIGINT) is a stop request too, handled the same way: the first
  one saves at the next pipeline step boundary and exits with
  PREEMPTED_EXIT_CODE (a rerun resumes); a second one aborts at once
  (KeyboardInterrupt). Under jax.distributed the first SIGINT is turned into
  a SIGTERM to this process, so JAX's preemption service makes every
  process agree on the step to save.
- Grain workers (mp_prefetch) are in the same process group and would die
  on a group SIGTERM or Ctrl-C before the main process saved: start them
  with `worker_init_fn=core.ignore_stop_signals_in_worker` (sparsepipe's
  input pipeline does), which also ends them when the main process ends
  (a SIGKILLed job leaves no worker behind).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any, Sequence

import jax
from absl import logging

# Exit status of a process that saved a checkpoint because it was preempted.
PREEMPTED_EXIT_CODE = 42


class PreemptionWatcher:
  """Tells the training loop when to save and stop because of preemption.

  Use as a context manager around the loop (restores the previous signal
  handlers on exit), or call install()/uninstall().
  """

  def __init__(
    self,
    manager: Any = None,
    *,
    signals: Sequence[int] = (signal.SIGTERM,),
    use_jax_preemption: bool | None = None,
  ):
    """Creates the watcher; install() (or `with`) starts watching.

    Args:
      manager: a TrainingCheckpointManager (or anything with
        reached_preemption(step)); needed for the JAX preemption service.
      signals: signals that request a stop (handled in single-process mode).
      use_jax_preemption: ask JAX's preemption sync point instead of
        handling signals; default: whether jax.distributed is initialized.
    """
    if use_jax_preemption is None:
      use_jax_preemption = jax.distributed.is_initialized()
    if use_jax_preemption and manager is None:
      raise ValueError(
        "PreemptionWatcher with the JAX preemption service needs the"
        " checkpoint manager (its reached_preemption)"
      )
    self._manager = manager
    self._signals = tuple(signals)
    self._use_jax = bool(use_jax_preemption)
    self._requested = threading.Event()
    self._previous: dict[int, Any] = {}
    self._signal_seen: int | None = None

  @property
  def requested(self) -> bool:
    """True once a stop signal arrived (single-process mode)."""
    return self._requested.is_set()

  @property
  def uses_jax_preemption(self) -> bool:
    return self._use_jax

  def _handle(self, signum: int, frame: Any) -> None:
    del frame
    if not self._requested.is_set():
      self._signal_seen = signum
      self._requested.set()

  def _handle_interrupt(self, signum: int, frame: Any) -> None:
    """First Ctrl-C: stop at the next boundary; the next one aborts at once."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(
      "sparsepipe: Ctrl-C: saving at the next pipeline step boundary, then exiting"
      " (Ctrl-C again to abort without saving)",
      file=sys.stderr,
      flush=True,
    )
    if self._use_jax:
      os.kill(os.getpid(), signal.SIGTERM)  # JAX's preemption service syncs the step
    else:
      self._handle(signum, frame)

  def install(self) -> "PreemptionWatcher":
    """Installs the signal handlers (main thread only)."""
    if not self._use_jax:
      for signum in self._signals:
        self._previous[signum] = signal.signal(signum, self._handle)
    if signal.SIGINT not in self._previous:
      self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._handle_interrupt)
    return self

  def uninstall(self) -> None:
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    self._previous.clear()

  def __enter__(self) -> "PreemptionWatcher":
    return self.install()

  def __exit__(self, *exc: Any) -> None:
    self.uninstall()

  def should_stop(self, step: int) -> bool:
    """Whether to save `step` and exit now. Call after every step."""
    if self._use_jax:
      return bool(self._manager.reached_preemption(step))
    if self.requested and self._signal_seen is not None:
      logging.warning(
        "Received signal %d: saving step %d and exiting",
        self._signal_seen,
        step,
      )
      self._signal_seen = None
    return self.requested

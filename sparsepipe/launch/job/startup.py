"""Where a job's time went before it trained, and in any other named pause.

A start has five phases, each measured from the end of the one before:

    data      the dataset found (or generated) and the model built
    state     a fresh state initialised, or the newest checkpoint restored
              (the input pipeline starts before: its workers start
              meanwhile)
    eval      the eval of the boundary a resumed job stopped at, when it
              had not finished (0 otherwise; the line names it when it ran)
    input     the waits for batches until the first batch is trained
    compile   the rest of that time: the step's programs compiled, and the
              first pipeline steps run

At the first trained batch (its result on the host) the job prints one
line and writes one `startup` record to metrics.jsonl, with a
`startup/<field>` TensorBoard point each: the phases' seconds, the seconds
from the job's call to that batch (`first_batch_s`), and the compilations
JAX reported meanwhile: programs compiled (`programs_compiled`), the
seconds spent compiling or loading programs (`compile_seconds`), and with
the persistent cache on (core/compile_cache.py) the programs it held
(`cache_hits`) and those it did not and now holds (`cache_misses`).

`record_phase(output, name, batch, seconds)` records any other named
duration the same way (an FDO retune's stall, for one): a `phase` record
and a `time/<name>_s` TensorBoard point at that batch.
"""

from __future__ import annotations

import time
from typing import Any

import jax

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
CACHE_MISS_EVENT = "/jax/compilation_cache/cache_misses"
PHASES = ("data", "state", "eval", "input", "compile")


def record_phase(output: Any, name: str, batch: int, seconds: float, **fields: Any) -> None:
  """One named duration in metrics.jsonl ({"event": "phase", "phase": name, ...})
  and TensorBoard (`time/<name>_s` at `batch`)."""
  output.record(
    {
      "event": "phase",
      "phase": name,
      "batch": int(batch),
      "seconds": round(float(seconds), 6),
      **fields,
    }
  )


class CompileCounter:
  """What JAX compiled while this counter listened (jax.monitoring events).

  Attributes:
    requests: programs compiled or loaded from the persistent cache.
    seconds: the time that took.
    cache_hits: programs loaded from the persistent compilation cache.
    cache_misses: programs compiled and written to it.
  """

  def __init__(self):
    self.requests = 0
    self.seconds = 0.0
    self.cache_hits = 0
    self.cache_misses = 0
    self._listening = True
    jax.monitoring.register_event_duration_secs_listener(self._on_duration)
    jax.monitoring.register_event_listener(self._on_event)

  def _on_duration(self, event: str, seconds: float, **kwargs: Any) -> None:
    del kwargs
    if event == BACKEND_COMPILE_EVENT:  # a compilation, or a load from the cache
      self.requests += 1
      self.seconds += seconds

  def _on_event(self, event: str, **kwargs: Any) -> None:
    del kwargs
    if event == CACHE_HIT_EVENT:
      self.cache_hits += 1
    elif event == CACHE_MISS_EVENT:
      self.cache_misses += 1

  ZERO = {"programs_compiled": 0, "compile_seconds": 0.0, "cache_hits": 0, "cache_misses": 0}

  @property
  def compiled(self) -> int:
    """Programs the compiler built (not found in the cache)."""
    return self.requests - self.cache_hits

  def as_dict(self) -> dict[str, Any]:
    return {
      "programs_compiled": self.compiled,
      "compile_seconds": round(self.seconds, 3),
      "cache_hits": self.cache_hits,
      "cache_misses": self.cache_misses,
    }

  def close(self) -> None:
    """Stops listening (later calls do nothing)."""
    if self._listening:
      self._listening = False
      jax.monitoring.unregister_event_duration_listener(self._on_duration)
      jax.monitoring.unregister_event_listener(self._on_event)


class StartupTimer:
  """The phases of one start (see the module docstring)."""

  def __init__(self):
    self.started = time.perf_counter()
    self._last = self.started
    self.seconds: dict[str, float] = {}
    # Listening from the end of the data phase, which compiles nothing: a
    # job whose config or data is refused leaves no listener behind.
    self.compiles: CompileCounter | None = None
    self.restored = False
    self.done = False
    self._waits = 0.0

  def mark(self, phase: str) -> None:
    """Ends `phase` (data, state, eval) now."""
    now = time.perf_counter()
    self.seconds[phase] = now - self._last
    self._last = now
    if self.compiles is None:
      self.compiles = CompileCounter()

  def step(self, data_wait_seconds: float, output: Any) -> bool:
    """After a pipeline step until the first trained batch (`output` its TC
    output, else None); True once that batch's result is on the host."""
    self._waits += data_wait_seconds
    if output is None:
      return False
    jax.block_until_ready(output)
    now = time.perf_counter()
    self.seconds["input"] = self._waits
    self.seconds["compile"] = now - self._last - self._waits
    self.seconds["first_batch"] = now - self.started
    return True

  def close(self) -> None:
    """Stops counting compilations."""
    if self.compiles is not None:
      self.compiles.close()

  def record(self, output: Any, batch: int) -> None:
    """The start's line and `startup` record, at the first trained batch `batch`."""
    self.done = True
    self.close()
    seconds = {f"{p}_s": round(self.seconds.get(p, 0.0), 3) for p in PHASES}
    counts = self.compiles.as_dict() if self.compiles else CompileCounter.ZERO
    state = "restore" if self.restored else "init"
    parts = ", ".join(
      f"{p} {self.seconds.get(p, 0.0):.1f} s" for p in PHASES if p != "eval" or p in self.seconds
    )
    output.event(
      "startup",
      batch,
      f"sparsepipe: first batch after {self.seconds['first_batch']:.1f} s: {parts} (state"
      f" {state}; {counts['programs_compiled']} programs compiled, {counts['cache_hits']} from"
      " the compilation cache)",
      first_batch_s=round(self.seconds["first_batch"], 3),
      state=state,
      **seconds,
      **counts,
    )

"""FDO in the loop: merge every process's statistics and derive new limits.

At a segment's end every process writes its running
statistics (element-wise max over all batches it has preprocessed, kept in
the input iterator's state, so a resumed job writes the same numbers) as an
NPZ file, the record of what FDO saw, in the reference's format. The merge
itself is a collective (`multihost_utils.process_allgather`, then the
element-wise max), so no process waits on another's file. The limits follow
with `headroom`: a later batch may exceed what earlier batches showed, and
exceeding a limit is an error (or counted drops with allow_id_dropping).

The step of a retune's new limits, compiled ahead of the retune
(`AheadCompiles`): a retune after batch R takes the limits that the
statistics of batches <= R give; the step for them could only compile then,
and it takes far longer than a batch. Part-way through a segment that ends
in a retune (`fdo.compile_ahead`: once that fraction of its batches is
read), the job derives the limits that the statistics so far give, with the
retune's own derivation (`merged_limits`), and when they differ from the
segment's it compiles their step in a background thread while the segment
trains. The real retune decides: when its limits
(transforms.get_stack_limits) equal the ones compiled ahead, the next
segment trains on that program; otherwise its step compiles as it would
without this, once the compilation ahead has ended. So the batches, limits
and losses are exactly those of the job without it: only the wait at the
retune differs. FDO limits are running maxima, scaled and rounded up, so
the segment's later batches often leave them as they are; with batches
alike, the chance that the maxima of a fraction f of the segment's batches
are those of all of them is about f, while a compilation longer than the
rest of the segment saves that rest, about (1 - f): the default f = 0.5
makes the expected saving f * (1 - f) largest.

Every process derives the same limits: the derivation merges all
processes' statistics (a collective, at the same pipeline step on every
process: the step follows from the position), so all of them take the same
decision. One compilation at a time runs in the background, and a program
that the retune does not use is dropped once its compilation ends: besides
the running step's, the job holds at most one program.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
from typing import Any, Callable

import numpy as np
from jax.experimental import multihost_utils

from sparsepipe import core
from sparsepipe import transforms
from sparsepipe.launch.job.schedule import Position
from sparsepipe.launch.job.schedule import Schedule


def merge_stats_across_processes(
  stats: core.SparseDenseMatmulInputStats,
) -> core.SparseDenseMatmulInputStats:
  """Element-wise max of every process's statistics (call on all processes)."""
  fields = [{k: np.asarray(v) for k, v in sorted(part.items())} for part in stats]
  gathered = multihost_utils.process_allgather(fields)
  return core.SparseDenseMatmulInputStats(
    *({k: np.max(v, axis=0) for k, v in part.items()} for part in gathered[:3]),
    id_drop_counters={k: int(np.max(v)) for k, v in gathered[3].items()},
  )


def scale_stats(
  stats: core.SparseDenseMatmulInputStats, headroom: float, steps_per_doubling: int = 0
) -> core.SparseDenseMatmulInputStats:
  """Statistics multiplied by `headroom` (>= 1), rounded up to `steps_per_doubling`
  values per doubling (core.round_up_to_steps; 0: to the next integer), buffer sizes
  then to a multiple of 8."""
  if not headroom >= 1.0:
    raise ValueError(f"fdo.headroom={headroom} must be >= 1.0")
  if not int(steps_per_doubling) >= 0:
    raise ValueError(f"fdo.steps_per_doubling={steps_per_doubling} must be >= 0")

  def scale(values: Any, align: int) -> np.ndarray:
    scaled = np.ceil(np.asarray(values, np.int64) * headroom).astype(np.int64)
    rounded = [
      core.round_up(core.round_up_to_steps(v, steps_per_doubling), align) for v in scaled.ravel()
    ]
    return np.asarray(rounded, np.int32).reshape(scaled.shape)

  return core.SparseDenseMatmulInputStats(
    max_ids_per_partition={k: scale(v, 1) for k, v in stats.max_ids_per_partition.items()},
    max_unique_ids_per_partition={
      k: scale(v, 1) for k, v in stats.max_unique_ids_per_partition.items()
    },
    required_buffer_size_per_sc={
      k: scale(v, 8) for k, v in stats.required_buffer_size_per_sc.items()
    },
    id_drop_counters=dict(stats.id_drop_counters),
  )


def retune_limits(
  feature_specs: Any,
  local_stats: core.SparseDenseMatmulInputStats,
  *,
  stats_dir: str,
  headroom: float,
  num_sc_per_device: int,
  global_device_count: int,
  steps_per_doubling: int = 0,
) -> tuple[Any, core.SparseDenseMatmulInputStats]:
  """Records `local_stats`, merges all processes', returns (new specs, merged).

  Call on every process at the same point. `stats_dir` (one per retune, e.g.
  per segment) receives this process's statistics file.
  """
  os.makedirs(stats_dir, exist_ok=True)
  client = transforms.NPZFileFDOClient(stats_dir)
  client.record(local_stats)
  client.publish()
  return merged_limits(
    feature_specs,
    local_stats,
    headroom=headroom,
    num_sc_per_device=num_sc_per_device,
    global_device_count=global_device_count,
    steps_per_doubling=steps_per_doubling,
  )


def merged_limits(
  feature_specs: Any,
  local_stats: core.SparseDenseMatmulInputStats,
  *,
  headroom: float,
  num_sc_per_device: int,
  global_device_count: int,
  steps_per_doubling: int = 0,
) -> tuple[Any, core.SparseDenseMatmulInputStats]:
  """What `retune_limits` returns for these statistics, without recording them.

  A collective (call on every process at the same point); the job also calls
  it part-way through a segment to compile the step a retune will likely
  need ahead of time (AheadCompiles).
  """
  merged = merge_stats_across_processes(local_stats)
  specs = transforms.update_preprocessing_parameters(
    feature_specs,
    scale_stats(merged, headroom, steps_per_doubling),
    num_sc_per_device,
    global_device_count,
  )
  # Headroom past what a batch can fill buys nothing.
  return transforms.bound_coo_buffers_by_the_batch(
    specs, num_sc_per_device, global_device_count
  ), merged


def _shown(limit: int | None) -> Any:
  """A limit for a message: no suggested buffer (None) is the theoretical max."""
  return "max" if limit is None else limit


def describe_limits(before: Any, after: Any) -> str:
  """'stack: max_ids 256->40, ..., buffer max->2272' for the stacks whose limits changed."""
  old, new = transforms.get_stack_limits(before), transforms.get_stack_limits(after)
  parts = []
  for stack in sorted(new):
    short = {n: n.replace("_per_partition", "") for n in transforms.LIMIT_NAMES}
    short["suggested_coo_buffer_size_per_device"] = "buffer"
    changes = [
      f"{short[name]} {_shown(old[stack][name])}->{_shown(new[stack][name])}"
      for name in transforms.LIMIT_NAMES
      if old[stack][name] != new[stack][name]
    ]
    if changes:
      parts.append(f"{stack}: " + ", ".join(changes))
  return "; ".join(parts) if parts else "unchanged"


class _Compiling:
  """The step of `specs`, made and compiled in its own background thread.

  The thread first waits for `after` (the compilation before it), so that
  two never run at once; it ends with the compilation.
  """

  def __init__(self, model: Any, specs: Any, after: _Compiling | None, fill_and_drain: bool):
    self.specs = specs
    self.trainer = None
    previous = [after.future] if after is not None else []

    def run() -> None:
      concurrent.futures.wait(previous)
      previous.clear()  # the earlier program is not kept alive by this thread
      trainer = model.make_trainer(specs)
      trainer.compile_ahead(model.abstract_train_state(specs), fill_and_drain=fill_and_drain)
      self.trainer = trainer

    executor = concurrent.futures.ThreadPoolExecutor(1, "sparsepipe-compile")
    self.future = executor.submit(run)
    executor.shutdown(wait=False)

  def result(self) -> Any:
    """Waits for the compilation; the compiled Trainer (raises what it raised)."""
    self.future.result()
    return self.trainer


class AheadCompiles:
  """A job's compilations of a retune's step ahead of the retune (see the module).

  Attributes:
    used: retunes whose step was compiled ahead (their limits were foreseen).
    missed: retunes whose limits differ from the ones compiled ahead.
    foreseen: of the latest retune: True (its step was compiled ahead), False
      (one was, for other limits) or None (none was).
  """

  def __init__(
    self,
    model: Any,
    schedule: Schedule,
    fraction: float,
    headroom: float,
    steps_per_doubling: int = 0,
  ):
    if not 0.0 <= fraction <= 1.0:
      raise ValueError(f"fdo.compile_ahead={fraction} must be between 0 and 1")
    self.model = model
    self.schedule = schedule
    self.fraction = fraction
    self.headroom = headroom
    self.steps_per_doubling = steps_per_doubling
    self.used = 0
    self.missed = 0
    self.foreseen: bool | None = None
    self._done: tuple[int, int] | None = None  # (segment, start) derived for
    self._ahead: _Compiling | None = None
    self._latest: _Compiling | None = None  # the compilation started last

  def due(self, position: Position) -> bool:
    """Whether to derive the next retune's limits now: once per segment ending in a
    retune, at its first step with the fraction of its batches read."""
    end = position.start + position.length
    if not self.fraction or self._done == (position.segment, position.start):
      return False
    if end >= self.schedule.num_steps or not self.schedule.retunes_after(end):
      return False
    read = position.batches_read - position.start
    return read >= max(1, math.ceil(self.fraction * position.length))

  def derive(self, setup: Any, position: Position) -> None:
    """Derives the limits of the statistics so far; compiles their step if they change."""
    self._done = (position.segment, position.start)
    specs, _ = merged_limits(
      setup.feature_specs,
      setup.iterator.stats_totals().as_stats(),
      headroom=self.headroom,
      num_sc_per_device=self.model.num_sc,
      global_device_count=self.model.mesh.size,
      steps_per_doubling=self.steps_per_doubling,
    )
    ahead, self._ahead = self._ahead, None
    if _limits(specs) != _limits(setup.feature_specs):
      self._ahead = self._start(specs, ahead, position)

  def step_for(self, specs: Any, position: Position) -> Callable[[], Any]:
    """At the retune ending `position`'s segment, to `specs`' limits: what waits for
    their compiled Trainer."""
    ahead, self._ahead = self._ahead, None
    self.foreseen = None if ahead is None else _limits(ahead.specs) == _limits(specs)
    if self.foreseen:
      self.used += 1
      return ahead.result
    self.missed += ahead is not None
    return self._start(specs, ahead, position).result

  def _start(self, specs: Any, ahead: _Compiling | None, position: Position) -> _Compiling:
    """Compiles the programs the segment after `position`'s runs: a segment carried
    in that hands over in turn has neither a fill nor a drain step."""
    following = self.schedule.next_segment(position)
    fill_and_drain = following is None or not following.carried_in or following.drains
    self._latest = _Compiling(self.model, specs, ahead, fill_and_drain)
    return self._latest

  def wait(self) -> None:
    """Waits for the background compilations (e.g. one discarded) to end."""
    latest, self._latest = self._latest, None
    if latest is not None:
      concurrent.futures.wait([latest.future])

  def discard(self) -> None:
    """At a retune that keeps the limits: a step compiled ahead for others is dropped."""
    self.foreseen = None if self._ahead is None else False
    self.missed += self._ahead is not None
    self._ahead = None


def _limits(specs: Any) -> dict[str, dict[str, Any]]:
  return transforms.get_stack_limits(specs)

"""Where the job stands: segments of pipeline runs, batch boundaries, checkpoint steps.

Batches are numbered 1, 2, ...: batch n is the n-th batch trained, and
"after batch n" is the one point of the job where n batches are trained.
Every output uses this number: metrics.jsonl, the progress line,
TensorBoard steps, and the checkpoint steps (Orbax's step number is the
batches trained, so `checkpoints/500` is the job after batch 500).

A job trains its batches as consecutive *segments*, each one pipeline run
with one set of COO limits. Between segments FDO may change the limits (new
specs, a step compiled for them); the input keeps running and switches to
them at the retune point (transforms/fdo/retune_points.py, input/limits_board.py).
FDO retunes after fixed batch numbers: after every multiple of
`fdo.every_steps` (0: FDO off, never), and once early, after batch
`fdo.first_after` when that is below every_steps (0: no early pass), so
that a new job's buffers follow its data after a few batches instead of a
whole interval.
A segment is planned when it starts: it ends at the next retune point
(or at `num_steps` if that comes first); with no retune point ahead it runs
to the end of the job, `num_steps`. The retune points are absolute batch
numbers, so a job stopped and extended, resumed, resized or cut anywhere
retunes after the same batches as an uninterrupted one; a segment that
ended at a former num_steps (a job extended after it finished) is followed
by one that runs to the next retune point, without a retune between them.
A checkpoint records its segment, so a resumed job continues the same run;
raising or lowering num_steps, or changing the FDO fields, re-plans
(`Schedule.resume`): a segment planned to the end follows the new
num_steps (and, with FDO now on, ends at the first retune point at or past
the batches it has read), any segment is cut at num_steps, and at the
first retune point of changed FDO fields past the batches it has read (the
input's workers wait for the limits of that point: a segment that ran past
it hung). Batches already read always stay in their segment.

Segments follow one another without a drain: a pipelined segment that
ends before num_steps (at a retune point) hands its last two batches, still
in flight, to the next segment (`drains=False`, and the next is
`carried_in`; pipelining/handover.py re-lays out their COO buffers for the
new limits), so the job trains as one pipeline run would. Only the job's
last segment drains (and a job extended after it finished starts its next
segment afresh, with a fill step).

Inside a pipelined segment of L batches starting after batch s, pipeline
step p has read min(p, L) batches. It takes L + 2 steps when it drains
(step 0: the fill, or a steady step when carried in; L more; the drain),
else L (it ends with the step that reads its last batch).
Without a carry-in, the dense step of batch s+p-1 ran at step p-1, so after
step p there are s+p-1 trained batches for 1 <= p <= L+1, and s+L after
the drain; carried in, step 0 trains batch s (the previous segment's last),
so after step p there are s+p-1 for 0 <= p <= L+1. The batch boundary of
batch n is the position after which n batches are trained and no other
position has that count later: p = n - s + 1 for 2 <= p <= L (carried in:
1 <= p <= L), and p = L+2 for n = s+L in a segment that drains; a segment
that hands over ends at the boundary of batch s+L-1 (its step L), and the
next one's step 0 is no boundary. Checkpoints, evals and preemption stops
happen at batch boundaries only, and consecutive boundaries are consecutive
batches, over segment ends too (docs/reference/pipeline_schedule.md). Without
pipelining (sequential mode) a segment of L batches takes L steps and every
step is a boundary.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from sparsepipe.launch.config.pipelining import resolve_pipelining
from sparsepipe.transforms.fdo.retune_points import RetunePoints


@dataclasses.dataclass(frozen=True)
class Position:
  """Pipeline step `pipeline_step` of a segment of `length` batches after batch `start`.

  Attributes:
    segment: the segment's index in the job (0, 1, ...).
    start: batches trained before the segment (its first batch is start + 1).
    length: batches of the segment.
    to_end: the segment was planned to the end of the job (FDO off).
    pipeline_step: pipeline steps of the segment run so far (0..steps).
    pipelined: fill and drain steps (False: sequential mode).
    carried_in: pipelined, it starts with the previous segment's last two
      batches in flight (no fill step: step 0 trains batch `start`).
    drains: pipelined, it ends with the drain (False: it hands its last two
      batches to the next segment). True in sequential mode.
  """

  segment: int
  start: int
  length: int
  to_end: bool
  pipeline_step: int = 0
  pipelined: bool = True
  carried_in: bool = False
  drains: bool = True

  @property
  def end(self) -> int:
    """The segment's last batch (its retune point, or num_steps)."""
    return self.start + self.length

  @property
  def steps(self) -> int:
    """Pipeline steps of the whole segment."""
    return self.length + (2 if self.pipelined and self.drains else 0)

  @property
  def batches_read(self) -> int:
    """Batches taken from the input so far (the next one's global index)."""
    return self.start + min(self.pipeline_step, self.length)

  def _done_by_lag(self, lag: int) -> int:
    """Batches `lag` pipeline steps behind the reads (never before the segment,
    unless carried in: then its step 0 works on the previous segment's)."""
    behind = self.pipeline_step - lag
    return self.start + min(behind if self.carried_in else max(behind, 0), self.length)

  @property
  def batches_trained(self) -> int:
    """Batches whose dense step ran (the TC stage lags one step when pipelined)."""
    return self._done_by_lag(1 if self.pipelined else 0)

  @property
  def updates_applied(self) -> int:
    """Batches whose embedding update is in the tables (the update lags two steps)."""
    return self._done_by_lag(2 if self.pipelined else 0)

  @property
  def drained(self) -> bool:
    """No batch buffered in the PipelineState."""
    if not self.pipelined:
      return True
    return (self.pipeline_step == 0 and not self.carried_in) or (self.finished and self.drains)

  @property
  def finished(self) -> bool:
    """All steps of the segment ran."""
    return self.pipeline_step == self.steps

  @property
  def at_boundary(self) -> bool:
    """Whether this is the batch boundary of `batches_trained` (see the module)."""
    if not self.pipelined:
      return self.pipeline_step >= 1
    first = 1 if self.carried_in else 2
    return first <= self.pipeline_step <= self.length or (self.finished and self.drains)

  @property
  def in_flight(self) -> tuple[int | None, int | None]:
    """Global indices of the batches buffered in the PipelineState (step i-1's, i-2's).

    None where the buffer holds no batch (before the first, or a drain step's zeros).
    """
    if not self.pipelined:
      return (None, None)
    first = -2 if self.carried_in else 0

    def batch(step: int) -> int | None:
      return self.start + step if first <= step < self.length else None

    return batch(self.pipeline_step - 1), batch(self.pipeline_step - 2)

  def at_step(self, pipeline_step: int) -> Position:
    return dataclasses.replace(self, pipeline_step=pipeline_step)


@dataclasses.dataclass(frozen=True)
class Schedule:
  """How a job's batches split into segments, from its config.

  Attributes:
    num_steps: batches of the job.
    fdo_every: FDO retunes after every multiple of this batch number (0: never).
    pipelined: fill and drain steps (False: sequential mode).
    fdo_first: with FDO on, it also retunes after this batch (0: no early pass).
  """

  num_steps: int
  fdo_every: int
  pipelined: bool = True
  fdo_first: int = 0

  def __post_init__(self):
    if self.num_steps < 1:
      raise ValueError(f"num_steps={self.num_steps} must be >= 1")
    if self.fdo_every < 0:
      raise ValueError(f"fdo.every_steps={self.fdo_every} must be >= 0")
    if self.fdo_first < 0:
      raise ValueError(f"fdo.first_after={self.fdo_first} must be >= 0")

  @classmethod
  def from_config(cls, config: Any) -> Schedule:
    """The schedule of a job config (num_steps, fdo.every_steps and first_after, pipelining)."""
    return cls(
      int(config.num_steps),
      int(config.fdo.every_steps),
      resolve_pipelining(config.pipelining, jax.devices()[0].platform, jax.device_count()),
      int(config.fdo.get("first_after", 0)),
    )

  @property
  def retune_points(self) -> RetunePoints:
    """The batches FDO retunes after (what the input's workers switch limits at)."""
    return RetunePoints(self.fdo_every, self.fdo_first)

  def retunes_after(self, batch: int) -> bool:
    """Whether FDO retunes the limits after batch `batch` (an absolute batch number)."""
    return self.retune_points.after(batch)

  def next_retune(self, batch: int) -> int | None:
    """The first batch after `batch` that FDO retunes after (None: no more)."""
    return self.retune_points.next_after(batch)

  def _plan(self, segment: int, start: int, read: int = 0, carried_in: bool = False) -> Position:
    """The segment after batch `start`, at least `read` batches long (its batches read)."""
    remaining = self.num_steps - start
    end = self.next_retune(start + max(read - 1, 0))
    if end is None:
      length, to_end = remaining, True
    else:
      length, to_end = min(end - start, remaining), False
    position = Position(segment, start, length, to_end, 0, self.pipelined, carried_in)
    return self._with_drain(position)

  def _with_drain(self, position: Position) -> Position:
    """Only the job's last segment drains; the others hand over to the next."""
    drains = not self.pipelined or position.end >= self.num_steps
    return dataclasses.replace(position, drains=drains)

  def first(self) -> Position:
    """The job's first segment, at its start."""
    return self._plan(0, 0)

  def next_segment(self, position: Position) -> Position | None:
    """The segment after `position`'s, or None when the job is done there."""
    if position.end >= self.num_steps:
      return None
    return self._plan(position.segment + 1, position.end, carried_in=not position.drains)

  def resume(self, saved: Position) -> Position:
    """`saved` re-planned for this schedule (see the module docstring).

    The length (and whether the segment drains) changes only before its
    drain started and never below the batches already read; the result may
    lie past num_steps (the job is then done after its segment).
    """
    carried_in = saved.carried_in and self.pipelined
    saved = dataclasses.replace(saved, pipelined=self.pipelined, carried_in=carried_in)
    step = saved.pipeline_step
    if step > saved.length or saved.start >= self.num_steps:
      return dataclasses.replace(saved, drains=True)
    if saved.to_end:
      planned = self._plan(saved.segment, saved.start, read=step)
      length, to_end = planned.length, planned.to_end
    else:
      length, to_end = min(saved.length, self.num_steps - saved.start), False
      retune = self.next_retune(saved.start + max(step - 1, 0))  # past the batches read
      if retune is not None:  # changed FDO fields may put one inside the segment
        length = min(length, retune - saved.start)
    return self._with_drain(dataclasses.replace(saved, length=max(length, step), to_end=to_end))

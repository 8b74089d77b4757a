"""Where the job stands: FDO segments of pipeline runs, and checkpoint steps.

A job trains `num_steps` batches as consecutive *segments*, each one
pipeline run (its batches + 2 fill/drain pipeline steps) with one set of
COO limits. Between segments the pipeline is drained, FDO may change the
limits (new specs, recompiled step) and the input pipeline is rebuilt at
the same data position. Without FDO there is one segment.

The drained boundary is what makes limit changes exact: the PipelineState
buffers the sparse inputs of two earlier batches in the old shapes, and a
drained state buffers none. A resumed job switches at the same batches
because segment boundaries depend only on the config.

Checkpoint steps count pipeline steps over the whole job:
step(k, p) = k * (segment_batches + 2) + p for pipeline step p of segment k
(docs/pipeline_schedule.md). Without pipelining (sequential mode) a segment
of n batches takes n steps and every step boundary is drained.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Position:
  """Pipeline step `pipeline_step` (0..length+2) of segment `segment`."""

  segment: int
  pipeline_step: int


@dataclasses.dataclass(frozen=True)
class SegmentSchedule:
  """Splits `num_steps` batches into segments of `segment_batches`."""

  num_steps: int
  segment_batches: int
  pipelined: bool = True

  def __post_init__(self):
    if self.num_steps < 1:
      raise ValueError(f"num_steps={self.num_steps} must be >= 1")
    if self.segment_batches < 1:
      raise ValueError(f"segment_batches={self.segment_batches} must be >= 1")

  @classmethod
  def create(
    cls, num_steps: int, fdo_every_steps: int, *, pipelined: bool = True
  ) -> "SegmentSchedule":
    """One segment per FDO interval; a single segment when FDO is off (0)."""
    if fdo_every_steps < 0:
      raise ValueError(f"fdo.every_steps={fdo_every_steps} must be >= 0")
    return cls(num_steps, fdo_every_steps or num_steps, pipelined)

  @classmethod
  def from_config(cls, config: Any) -> "SegmentSchedule":
    """The schedule of a job config (num_steps, fdo.every_steps, pipelining)."""
    return cls.create(
      int(config.num_steps), int(config.fdo.every_steps), pipelined=bool(config.pipelining)
    )

  @property
  def fill_drain_steps(self) -> int:
    """Pipeline steps a segment takes beyond its batches (2, or 0 sequentially)."""
    return 2 if self.pipelined else 0

  @property
  def num_segments(self) -> int:
    return -(-self.num_steps // self.segment_batches)

  def length(self, segment: int) -> int:
    """Batches of `segment`."""
    if not 0 <= segment < self.num_segments:
      raise ValueError(f"segment {segment} outside 0..{self.num_segments - 1}")
    return min(self.segment_batches, self.num_steps - segment * self.segment_batches)

  def pipeline_steps(self, segment: int) -> int:
    return self.length(segment) + self.fill_drain_steps

  def checkpoint_step(self, position: Position) -> int:
    stride = self.segment_batches + self.fill_drain_steps
    return position.segment * stride + position.pipeline_step

  def first_batch(self, segment: int) -> int:
    return segment * self.segment_batches

  def batches_consumed(self, position: Position) -> int:
    """Batches read from the data iterator before `position`."""
    return self.first_batch(position.segment) + min(
      position.pipeline_step, self.length(position.segment)
    )

  def batches_with_output(self, position: Position) -> int:
    """Batches whose loss was produced before `position` (TC lags one step when pipelined)."""
    lag = 1 if self.pipelined else 0
    done = min(max(position.pipeline_step - lag, 0), self.length(position.segment))
    return self.first_batch(position.segment) + done

  def is_drained(self, position: Position) -> bool:
    """No batch buffered in the PipelineState (always, without pipelining)."""
    return not self.pipelined or position.pipeline_step in (
      0,
      self.pipeline_steps(position.segment),
    )

  def final(self) -> Position:
    last = self.num_segments - 1
    return Position(last, self.pipeline_steps(last))

"""SegmentSchedule: FDO segments, checkpoint steps and resume positions."""

import pytest

from sparsepipe.launch import Position
from sparsepipe.launch import SegmentSchedule


def test_segments_split_num_steps_with_a_short_last_one():
  schedule = SegmentSchedule.create(num_steps=10, fdo_every_steps=4)
  assert schedule.num_segments == 3
  assert [schedule.length(k) for k in range(3)] == [4, 4, 2]
  assert [schedule.pipeline_steps(k) for k in range(3)] == [6, 6, 4]
  assert [schedule.first_batch(k) for k in range(3)] == [0, 4, 8]
  assert schedule.final() == Position(2, 4)


def test_fdo_off_is_one_segment():
  schedule = SegmentSchedule.create(num_steps=7, fdo_every_steps=0)
  assert schedule.num_segments == 1
  assert schedule.length(0) == 7
  assert schedule.final() == Position(0, 9)


def test_checkpoint_steps_are_unique_and_increasing_over_the_job():
  schedule = SegmentSchedule.create(num_steps=10, fdo_every_steps=4)
  positions = [
    Position(k, p)
    for k in range(schedule.num_segments)
    for p in range(1, schedule.pipeline_steps(k) + 1)
  ]
  steps = [schedule.checkpoint_step(p) for p in positions]
  assert steps == sorted(steps)
  assert len(set(steps)) == len(steps)
  # The end of segment k and the start of segment k+1 share a step number;
  # only the end is ever saved.
  assert schedule.checkpoint_step(Position(0, 6)) == schedule.checkpoint_step(Position(1, 0)) == 6


def test_batches_consumed_and_with_output_lag_as_the_pipeline_does():
  schedule = SegmentSchedule.create(num_steps=10, fdo_every_steps=4)
  # After pipeline steps 0..p-1 of segment 1: p batches read (at most 4), the
  # dense step has run for p-1 of them (TC lags one pipeline step).
  consumed = [schedule.batches_consumed(Position(1, p)) for p in range(7)]
  with_output = [schedule.batches_with_output(Position(1, p)) for p in range(7)]
  assert consumed == [4, 5, 6, 7, 8, 8, 8]
  assert with_output == [4, 4, 5, 6, 7, 8, 8]
  assert schedule.is_drained(Position(1, 0)) and schedule.is_drained(Position(1, 6))
  assert not schedule.is_drained(Position(1, 5))


@pytest.mark.parametrize(
  "kwargs, message",
  [
    (dict(num_steps=0, fdo_every_steps=4), "num_steps=0 must be >= 1"),
    (dict(num_steps=5, fdo_every_steps=-1), r"fdo.every_steps=-1 must be >= 0"),
  ],
)
def test_bad_schedules_are_refused(kwargs, message):
  with pytest.raises(ValueError, match=message):
    SegmentSchedule.create(**kwargs)


def test_segment_out_of_range_is_an_error():
  schedule = SegmentSchedule.create(num_steps=10, fdo_every_steps=4)
  with pytest.raises(ValueError, match=r"segment 3 outside 0..2"):
    schedule.length(3)

"""Schedule and Position: segments, batch boundaries, checkpoint steps, re-planning."""

import dataclasses
import pickle

import pytest

from sparsepipe.launch import Position
from sparsepipe.launch import Schedule


def segments(schedule):
  position, out = schedule.first(), []
  while position is not None:
    out.append((position.start, position.length, position.to_end))
    position = schedule.next_segment(position.at_step(position.steps))
  return out


def test_fdo_segments_split_num_steps_with_a_short_last_one():
  assert segments(Schedule(10, 4)) == [(0, 4, False), (4, 4, False), (8, 2, False)]
  assert segments(Schedule(7, 0)) == [(0, 7, True)]


def test_batch_boundaries_are_consecutive_batches_over_segment_ends():
  """Each batch has exactly one boundary, in order: checkpoint steps never repeat."""
  for pipelined in (True, False):
    schedule, position, trained = Schedule(10, 4, pipelined), None, []
    position = schedule.first()
    while position is not None:
      for step in range(position.steps + 1):
        at = position.at_step(step)
        if at.at_boundary:
          trained.append(at.batches_trained)
      position = schedule.next_segment(position.at_step(position.steps))
    assert trained == list(range(1, 11)), pipelined


def test_a_pipelined_segment_reads_trains_and_buffers_as_the_pipeline_does():
  # Segment of 4 batches after batch 4: after pipeline step p, min(p, 4)
  # batches read; the dense step lags one step; batches in flight are the
  # inputs of steps p-1 and p-2 (global indices 4.. of this segment).
  segment = Position(1, 4, 4, False)
  steps = range(7)
  assert [segment.at_step(p).batches_read for p in steps] == [4, 5, 6, 7, 8, 8, 8]
  assert [segment.at_step(p).batches_trained for p in steps] == [4, 4, 5, 6, 7, 8, 8]
  assert [segment.at_step(p).at_boundary for p in steps] == [0, 0, 1, 1, 1, 0, 1]
  assert [segment.at_step(p).drained for p in steps] == [1, 0, 0, 0, 0, 0, 1]
  assert [segment.at_step(p).in_flight for p in steps] == [
    (None, None),
    (4, None),
    (5, 4),
    (6, 5),
    (7, 6),
    (None, 7),
    (None, None),
  ]


def test_a_segment_carried_in_trains_the_last_one_s_batches_in_flight_and_hands_over():
  # After batch 4, 4 batches, between two retunes: step 0 trains batch 4 (the
  # previous segment's last, in flight with batch 3) and no step drains; the
  # segment ends at the boundary of batch 7 with batches 8 and 7 in flight.
  segment = Position(1, 4, 4, False, carried_in=True, drains=False)
  steps = range(5)
  assert segment.steps == 4 and segment.end == 8
  assert [segment.at_step(p).batches_read for p in steps] == [4, 5, 6, 7, 8]
  assert [segment.at_step(p).batches_trained for p in steps] == [3, 4, 5, 6, 7]
  assert [segment.at_step(p).updates_applied for p in steps] == [2, 3, 4, 5, 6]
  assert [segment.at_step(p).at_boundary for p in steps] == [0, 1, 1, 1, 1]
  assert not any(segment.at_step(p).drained for p in steps)
  assert [segment.at_step(p).in_flight for p in steps] == [(3, 2), (4, 3), (5, 4), (6, 5), (7, 6)]
  # The job's last segment, carried in, drains: batch 8 at step 6.
  last = dataclasses.replace(segment, drains=True)
  assert last.steps == 6 and last.at_step(6).at_boundary and last.at_step(6).drained
  assert [last.at_step(p).batches_trained for p in range(7)] == [3, 4, 5, 6, 7, 8, 8]


def test_only_the_last_segment_of_a_pipelined_job_drains():
  schedule, position, kinds = Schedule(10, 4), Schedule(10, 4).first(), []
  while position is not None:
    kinds.append((position.start, position.carried_in, position.drains))
    position = schedule.next_segment(position.at_step(position.steps))
  assert kinds == [(0, False, False), (4, True, False), (8, True, True)]
  first = Schedule(10, 4, pipelined=False).first()
  assert (first.carried_in, first.drains) == (False, True)


def test_sequential_segments_are_drained_at_every_step():
  segment = Position(0, 0, 3, True, pipelined=False)
  assert segment.steps == 3
  assert [segment.at_step(p).batches_trained for p in range(4)] == [0, 1, 2, 3]
  assert all(segment.at_step(p).drained for p in range(4))
  assert segment.at_step(2).in_flight == (None, None)


def test_resume_follows_num_steps_for_a_segment_planned_to_the_end():
  saved = Position(0, 0, 1500, True, pipeline_step=700)
  assert Schedule(1600, 0).resume(saved) == dataclasses.replace(saved, length=1600)
  # Cut at num_steps, never below the batches already read.
  assert Schedule(1000, 0).resume(saved).length == 1000
  assert Schedule(650, 0).resume(saved).length == 700
  # FDO now on: the segment ends at the first retune point at or past the batches read.
  # It then hands over to the next segment instead of draining.
  assert Schedule(1600, 500).resume(saved) == dataclasses.replace(
    saved, length=1000, to_end=False, drains=False
  )
  assert Schedule(1600, 350).resume(saved) == dataclasses.replace(
    saved, length=700, to_end=False, drains=False
  )


def test_resume_keeps_fdo_segments_and_their_drain():
  saved = Position(2, 40, 20, False, pipeline_step=5, carried_in=True, drains=False)
  assert Schedule(100, 30).resume(saved) == saved  # fdo.every_steps applies to the next ones
  # Cut at a lowered num_steps, the segment is the job's last: it drains.
  assert Schedule(50, 20).resume(saved) == dataclasses.replace(saved, length=10, drains=True)
  assert Schedule(60, 20).resume(saved).drains
  # The handing over end (step 20) still re-plans; raised past it, the job hands over.
  ended = dataclasses.replace(saved, pipeline_step=20, drains=True)
  assert Schedule(100, 20).resume(ended) == dataclasses.replace(ended, drains=False)
  draining = dataclasses.replace(saved, pipeline_step=21, drains=True)
  assert Schedule(45, 20).resume(draining) == draining  # the drain started: length fixed


def test_a_changed_fdo_interval_applies_from_the_next_segment():
  schedule = Schedule(100, 30)
  ended = Position(2, 40, 20, False, pipeline_step=20, drains=False)
  assert schedule.next_segment(ended) == Position(3, 60, 30, False, carried_in=True, drains=False)
  assert schedule.next_segment(Position(3, 90, 10, False, 12)) is None


def test_retunes_belong_to_absolute_batch_numbers():
  """A job extended after it finished at batch 90 retunes after 100 and 120, not 90 and 110."""
  stopped = Position(4, 80, 10, False, pipeline_step=12)
  schedule = Schedule(128, 20)
  assert schedule.resume(stopped) == stopped
  following = schedule.next_segment(stopped)
  # It drained at batch 90: the next segment fills the pipeline again.
  assert following == Position(5, 90, 10, False, drains=False)
  assert [schedule.retunes_after(b) for b in (80, 90, 100, 110, 120)] == [1, 0, 1, 0, 1]
  assert segments(schedule)[4:] == [(80, 20, False), (100, 20, False), (120, 8, False)]
  # Lowering num_steps cuts the segment; raising it back plans up to the multiple again.
  assert segments(Schedule(90, 20))[-1] == (80, 10, False)


def test_an_early_first_fdo_pass_then_every_multiple():
  assert segments(Schedule(20, 8, fdo_first=3)) == [
    (0, 3, False),
    (3, 5, False),
    (8, 8, False),
    (16, 4, False),
  ]
  assert [b for b in range(1, 21) if Schedule(20, 8, fdo_first=3).retunes_after(b)] == [3, 8, 16]
  # At or past every_steps, or with FDO off, there is no early pass.
  assert segments(Schedule(10, 4, fdo_first=4)) == segments(Schedule(10, 4))
  assert segments(Schedule(10, 4, fdo_first=6)) == segments(Schedule(10, 4))
  assert segments(Schedule(7, 0, fdo_first=3)) == [(0, 7, True)]
  assert not Schedule(7, 0, fdo_first=3).retunes_after(3)
  # A job resumed before its early pass keeps it; a segment planned to the end
  # (FDO turned on on resume) ends at the early pass if it has not read past it.
  assert Schedule(20, 8, fdo_first=3).resume(Position(0, 0, 3, False, 2)).length == 3
  assert Schedule(20, 8, fdo_first=3).resume(Position(0, 0, 20, True, 2)).length == 3
  assert Schedule(20, 8, fdo_first=3).resume(Position(0, 0, 20, True, 5)).length == 8


@pytest.mark.parametrize(
  "args, message",
  [
    ((0, 4), r"^num_steps=0 must be >= 1$"),
    ((5, -1), r"^fdo.every_steps=-1 must be >= 0$"),
    ((5, 4, True, -2), r"^fdo.first_after=-2 must be >= 0$"),
  ],
)
def test_bad_schedules_are_refused(args, message):
  with pytest.raises(ValueError, match=message):
    Schedule(*args)


def test_last_retune_is_the_latest_retune_point_at_or_before_a_batch():
  """The limits batch index k is preprocessed with: those of the retune after this batch."""
  schedule = Schedule(20, 4, fdo_first=2)
  last = schedule.retune_points.last_at_or_before
  assert [last(k) for k in range(10)] == [None, None, 2, 2, 4, 4, 4, 4, 8, 8]
  for k in range(1, 20):
    expected = max((b for b in range(1, k + 1) if schedule.retunes_after(b)), default=None)
    assert last(k) == expected, k
  assert Schedule(20, 0).retune_points.last_at_or_before(7) is None
  last = Schedule(20, 4, fdo_first=6).retune_points.last_at_or_before
  assert [last(k) for k in (3, 4, 7)] == [None, 4, 4]


def test_the_retune_points_the_workers_receive_refer_to_nothing_of_the_job():
  """The data workers unpickle the input's `last_retune`: as a method of Schedule it
  made every worker import the whole launcher (Orbax, the job) before its first batch."""
  last = Schedule(20, 4, fdo_first=2).retune_points.last_at_or_before
  data = pickle.dumps(last)
  assert b"sparsepipe.launch" not in data
  assert [pickle.loads(data)(k) for k in (1, 2, 5, 9)] == [None, 2, 4, 8]


def _after_resume(schedule, saved):
  """(the retune points whose limits the job publishes after resuming `saved`, those
  the input's workers wait for: the last retune point at or before each batch index
  from the restored input position on, if not before it)."""
  position, published = schedule.resume(saved), set()
  read = position.batches_read
  while position is not None:
    following = schedule.next_segment(position.at_step(position.steps))
    if following is not None and schedule.retunes_after(position.end):
      published.add(position.end)
    position = following
  points = schedule.retune_points
  waits = {points.last_at_or_before(k) for k in range(read, schedule.num_steps)}
  return published, {p for p in waits if p is not None and p >= read}


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_resumed_job_publishes_every_retune_its_input_waits_for(pipelined):
  """A job resumed mid-segment with other fdo.every_steps or first_after kept its
  segment's planned end while its input's workers waited for the limits of a retune
  point inside it (e.g. every_steps 20 -> 10: after batch 30): it hung for good. The
  position after every step of every segment of a 40-batch job, resumed with any of
  these."""
  fdo = [(0, 0), (4, 0), (6, 3), (10, 0), (10, 8), (20, 4), (30, 0), (22, 0)]
  for old_every, old_first in fdo:
    old = Schedule(40, old_every, pipelined, old_first)
    position = old.first()
    while position is not None:
      for step in range(1, position.steps + 1):  # a checkpoint is after a step
        saved = position.at_step(step)
        for every, first in fdo:
          new = Schedule(40, every, pipelined, first)
          published, waits = _after_resume(new, saved)
          assert waits <= published, (old_every, old_first, saved, every, first)
      position = old.next_segment(position.at_step(position.steps))


def test_changed_fdo_fields_cut_the_resumed_segment_at_their_first_retune_point_ahead():
  saved = Position(1, 20, 20, False, pipeline_step=5, carried_in=True, drains=False)
  # every_steps 20 -> 10 or 30: the segment (batches 21-40, 25 read) ends after 30.
  assert Schedule(60, 10).resume(saved) == dataclasses.replace(saved, length=10)
  assert Schedule(60, 30).resume(saved) == dataclasses.replace(saved, length=10)
  # A retune point among the batches read (after 22) cannot be: the next one, 44, is
  # past the planned end, which stays.
  assert Schedule(60, 22).resume(saved) == saved
  # first_after 8 while the job is past it changes nothing.
  assert Schedule(60, 20, True, 8).resume(saved) == saved

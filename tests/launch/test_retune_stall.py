"""RetuneStallHook measures from batches trained, not from steps dispatched (a fake clock)."""

import types

import pytest

from sparsepipe.launch.job import hooks


class _Device:
  """A fake clock and device: a step's output is ready at its own time; waiting for it
  moves the clock there (JAX dispatches a step long before it is done)."""

  def __init__(self):
    self.now = 0.0
    self.records: list[dict] = []

  def perf_counter(self) -> float:
    return self.now

  def block_until_ready(self, output):
    self.now = max(self.now, output["ready_at"])
    return output

  def record(self, record: dict) -> None:
    self.records.append(record)


def _result(index: int, ready_at: float):
  return types.SimpleNamespace(batch_index=index, output={"ready_at": ready_at})


@pytest.mark.parametrize("drains", [True, False], ids=["drained", "handed over"])
def test_the_stall_is_the_gap_between_trained_batches_less_the_segment_throughput(
  monkeypatch, drains
):
  """A segment of 6 batches retuned after: each step is dispatched 0.01 s after the hook's
  previous call, and the device trains a batch per second once the first two compiled
  (ready at 6 and 7). The steady batch time is 1 s, not the 0.01 s between dispatches; the
  first batch after the retune is dispatched once the new step compiled, 20 s after the
  last one before it was trained, and is ready 1 s later: gap 21 s, stall 20 s. A segment
  that hands its batches in flight over trains its last one in the next segment (index
  -1): there the gap runs from its last batch but one."""
  device = _Device()
  monkeypatch.setattr(hooks, "time", types.SimpleNamespace(perf_counter=device.perf_counter))
  monkeypatch.setattr(
    hooks, "jax", types.SimpleNamespace(block_until_ready=device.block_until_ready)
  )
  job = types.SimpleNamespace(
    position=types.SimpleNamespace(length=6, drains=drains, end=6),
    batch=6,
    schedule=types.SimpleNamespace(retunes_after=lambda batch: batch == 6),
    output=device,
    hooks={},
  )
  hook = hooks.RetuneStallHook(job)
  device.now = 5.0  # the segment's steps compiled
  trained = [6.0, 7.0, 8.0, 9.0, 10.0, 11.0][: 6 if drains else 5]
  for index, ready_at in enumerate(trained):
    device.now += 0.01
    assert hook(_result(index, ready_at)) is False
  assert device.now == trained[-1]  # the hook waited for the last batch
  hook.segment_end()
  assert device.records == []
  device.now += 20.0  # the retune: the new step compiles
  hook(_result(0 if drains else -1, device.now + 1.0))
  (record,) = device.records
  assert record == {
    "event": "phase",
    "phase": "retune_stall",
    "batch": 6,
    "seconds": 20.0,
    "gap_s": 21.0,
    "steady_batch_s": 1.0,
    "compiled_ahead": None,
  }
  hook(_result(1, 33.0))  # the next segment: no second record
  assert len(device.records) == 1

"""Training progress for people: a live line, and metrics as JSONL.

The JSONL file (<workdir>/metrics.jsonl) has one record per trained batch
({"batch": n, "loss"}) and one per event ({"event": "eval" | "checkpoint" |
"fdo" | "resume" | "preempted" | "done", "batch": n, ...}); `batch` is the
batch number the record belongs to (batch n: the n-th batch trained). On
resume after batch n it is rewritten without the records of later batches,
so the file of a resumed job equals that of an uninterrupted one, its
resume and preemption lines aside. A non-finite value (the AUC of an eval
over one label) is written as null: the file stays JSON. Only process 0
writes (job_output.py).
"""

from __future__ import annotations

import collections
import json
import math
import os
import time
from typing import Any, TextIO

from sparsepipe.core.status_line import StatusLine
from sparsepipe.core.write_errors import write_errors_named


def json_line(record: dict[str, Any]) -> str:
  """`record` as one line of strict JSON: a non-finite float is null (json's NaN,
  Infinity are no JSON; JavaScript's JSON.parse refuses them)."""
  return json.dumps(_finite_or_none(record), allow_nan=False) + "\n"


def _finite_or_none(value: Any) -> Any:
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, dict):
    return {k: _finite_or_none(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_finite_or_none(v) for v in value]
  return value


class MetricsLog:
  """Appends JSON lines to `path` (flushed per write; process 0 only)."""

  def __init__(self, path: str, *, enabled: bool = True):
    self._path = path
    self._enabled = enabled
    self._file: TextIO | None = None

  @property
  def path(self) -> str:
    return self._path

  def records(self) -> list[dict[str, Any]]:
    """Every record of the file (a line cut by a kill mid-write is skipped)."""
    if not os.path.exists(self._path):
      return []
    records = []
    with open(self._path) as f:
      for line in f:
        if not line.strip():
          continue
        try:
          records.append(json.loads(line))
        except json.JSONDecodeError:
          continue  # a line cut by a kill mid-write
    return records

  def truncate_after(self, batch: int) -> list[dict[str, Any]]:
    """Drops the records of batches after `batch` (atomic rewrite); returns those kept."""
    if not self._enabled:
      return []
    kept = [r for r in self.records() if r.get("batch", 0) <= batch]
    tmp = self._path + ".tmp"
    with write_errors_named("the job's metrics", self._path, tmp):
      with open(tmp, "w") as f:
        f.write("".join(json_line(record) for record in kept))
      os.replace(tmp, self._path)
    return kept

  def write(self, record: dict[str, Any]) -> None:
    if not self._enabled:
      return
    if self._file is None:
      self._file = open(self._path, "a")
    self._file.write(json_line(record))
    self._file.flush()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None


class ProgressLine:
  """The training line: batch, epoch, examples/s, loss, data-wait share, latest event.

  The rate and data wait are those of training alone over the last few
  intervals (SteadyRate.recent): steady, not swinging with each save or
  compilation.
  """

  def __init__(self, total_batches: int, *, stream: TextIO | None = None, enabled: bool = True):
    self._total = total_batches
    self._line = StatusLine(stream, enabled=enabled)
    self._event = ""

  def event(self, text: str) -> None:
    """The latest event, shown on every update until the next (e.g. 'ckpt @42')."""
    self._event = text

  def update(
    self,
    batch: int,
    examples_per_second: float | None,
    loss: float | None,
    data_wait: float | None,
    epoch: float | None = None,
  ) -> None:
    """One line; a None rate or data wait (none measured yet) shows as '-'."""
    parts = [f"batch {batch}/{self._total}"]
    if epoch is not None:
      parts.append(f"epoch {epoch:.2f}")
    parts += [
      ("-" if examples_per_second is None else f"{examples_per_second:,.0f}") + " ex/s",
      "loss " + ("-" if loss is None else f"{loss:.4f}"),
      "data wait " + ("-" if data_wait is None else f"{100 * data_wait:.0f}%"),
    ]
    if self._event:
      parts.append(self._event)
    self._line.show(" | ".join(parts), force=True)

  def message(self, text: str) -> None:
    """A line of its own (ends the live line first)."""
    self._line.message(text)


class IntervalMeter:
  """Examples, seconds and seconds waiting for data since the last `reset`."""

  def __init__(self):
    self.reset()

  def reset(self) -> None:
    self._start = time.perf_counter()
    self._wait = 0.0
    self._examples = 0

  @property
  def wait_seconds(self) -> float:
    return self._wait

  def add(self, examples: int, data_wait_seconds: float) -> None:
    self._examples += examples
    self._wait += data_wait_seconds

  @property
  def examples(self) -> int:
    return self._examples

  @property
  def seconds(self) -> float:
    return max(time.perf_counter() - self._start, 1e-9)


class SteadyRate:
  """Examples/s and data-wait share of the intervals of training alone.

  An interval in which the job also compiled, saved or evaluated is left
  out: its rate measures that work, not training (the demo's line swung from
  117 to 27,874 ex/s and back with them). `recent()` is over the last
  `window` such intervals (the progress line), `overall()` over all of them
  (the summary's steady-state rate).
  """

  def __init__(self, window: int = 10):
    self._recent: collections.deque[tuple[int, float, float]] = collections.deque(maxlen=window)
    self._examples = 0
    self._seconds = 0.0

  def add(self, examples: int, seconds: float, wait_seconds: float) -> None:
    self._recent.append((examples, seconds, wait_seconds))
    self._examples += examples
    self._seconds += seconds

  def recent(self) -> tuple[float | None, float | None]:
    """(examples/s, data-wait share) over the last `window` intervals; (None, None) before one."""
    if not self._recent:
      return None, None
    examples, seconds, wait = (sum(column) for column in zip(*self._recent))
    return examples / seconds, min(wait / seconds, 1.0)

  def overall(self) -> float | None:
    """Examples/s over every interval added (None before one)."""
    return self._examples / self._seconds if self._seconds > 0 else None

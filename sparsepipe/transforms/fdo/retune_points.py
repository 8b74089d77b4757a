"""The batches FDO retunes after: every multiple of `every`, and once early after `first`.

Retune points are absolute batch numbers (batch n is the n-th batch
trained), so a job stopped, resumed, resized or extended retunes after the
same batches as an uninterrupted one. The job's schedule plans its segments
by them, and the input's data workers switch limits at them
(input/limits_board.py). It lives here, beside the workers' other FDO
code, so that what the workers receive refers to nothing of the job above.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RetunePoints:
  """FDO's retune points.

  Attributes:
    every: it retunes after every multiple of this batch number (0: never).
    first: with `every` on, it also retunes after this batch when it is
      below `every` (0: no early pass).
  """

  every: int
  first: int = 0

  def after(self, batch: int) -> bool:
    """Whether FDO retunes after batch `batch`."""
    if batch < 1 or not self.every:
      return False
    return batch == self.first < self.every or batch % self.every == 0

  def next_after(self, batch: int) -> int | None:
    """The first batch after `batch` that FDO retunes after (None: no more)."""
    if not self.every:
      return None
    following = (batch // self.every + 1) * self.every
    return self.first if batch < self.first < self.every else following

  def last_at_or_before(self, batch: int) -> int | None:
    """The last batch at or before `batch` that FDO retunes after (None: none).

    Batch index `batch` (0-based: the batch after `batch` trained ones) is
    preprocessed with the limits of this retune, or the job's first limits.
    """
    if not self.every or batch < 1:
      return None
    latest = batch // self.every * self.every
    if latest:
      return latest
    return self.first if 1 <= self.first <= batch < self.every else None

"""The writers' progress line (on stderr) and the converters' summary line."""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from sparsepipe.core.status_line import StatusLine


class Progress:
  """Counts examples on one stderr line, at most every `interval_s` seconds.

  Example: `12,345/100,000 examples (12.3%)  45,678/s`. When the stream is
  not a terminal (logs, CI), lines are printed whole instead, at most every
  `log_interval_s` seconds.
  """

  def __init__(
    self,
    desc: str,
    total: int | None = None,
    *,
    unit: str = "examples",
    interval_s: float = 0.5,
    log_interval_s: float = 10.0,
    stream: TextIO | None = None,
  ):
    self.desc = desc
    self.total = total
    self.unit = unit
    self.count = 0
    self._line = StatusLine(
      sys.stderr if stream is None else stream,
      interval_s=interval_s,
      log_interval_s=log_interval_s,
    )
    self._start = time.monotonic()

  def update(self, n: int) -> None:
    self.count += n
    self._line.show(self._text())

  def close(self) -> float:
    """Shows the final count (in a log: unless already shown), ends the line; returns seconds."""
    text = self._text()
    shown_count = self._line.shown.split("  ")[0]
    if self._line.is_terminal or text.split("  ")[0] != shown_count:
      self._line.show(text, force=True)
    self._line.end()
    return time.monotonic() - self._start

  def _text(self) -> str:
    elapsed = max(time.monotonic() - self._start, 1e-9)
    text = f"{self.desc}: {self.count:,}"
    if self.total:
      text += f"/{self.total:,} {self.unit} ({100.0 * self.count / self.total:.1f}%)"
    else:
      text += f" {self.unit}"
    return text + f"  {self.count / elapsed:,.0f}/s"


def summarize(manifest, seconds: float) -> str:
  """The summary line the writer commands print (`manifest`: a data.Manifest)."""
  size = sum(os.path.getsize(p) for p in manifest.shard_paths())
  return (
    f"wrote {manifest.num_examples:,} examples in {manifest.num_records:,} records"
    f" ({manifest.examples_per_record} per record) to {len(manifest.shards)} shards,"
    f" {size / 2**20:.1f} MiB, in {seconds:.1f} s"
    f" ({manifest.num_examples / max(seconds, 1e-9):,.0f} examples/s): {manifest.directory}"
  )

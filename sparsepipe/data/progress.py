"""A one-line progress report on stderr (no dependency)."""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO


class Progress:
  """Rewrites one stderr line at most every `interval_s` seconds.

  Example: `12,345/100,000 examples (12.3%)  45,678/s`. When the stream is
  not a terminal (logs, CI), lines are printed whole instead, at most every
  `log_interval_s` seconds, so no carriage returns end up in the log.
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
    self._interval = interval_s
    self._stream = sys.stderr if stream is None else stream
    self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
    if not self._tty:
      self._interval = log_interval_s
    self._start = time.monotonic()
    self._last = self._start
    self._written = -1

  def update(self, n: int) -> None:
    self.count += n
    now = time.monotonic()
    if now - self._last >= self._interval:
      self._last = now
      self._write()

  def close(self) -> float:
    """Prints the final line and a newline; returns the elapsed seconds."""
    if self._tty or self._written != self.count:
      self._write()
    if self._tty:
      self._stream.write("\n")
      self._stream.flush()
    return time.monotonic() - self._start

  def _write(self) -> None:
    elapsed = max(time.monotonic() - self._start, 1e-9)
    text = f"{self.desc}: {self.count:,}"
    if self.total:
      text += f"/{self.total:,} {self.unit} ({100.0 * self.count / self.total:.1f}%)"
    else:
      text += f" {self.unit}"
    text += f"  {self.count / elapsed:,.0f}/s"
    self._stream.write("\r" + text if self._tty else text + "\n")
    self._written = self.count
    self._stream.flush()


def summarize(manifest, seconds: float) -> str:
  """The summary line the writer commands print (`manifest`: a data.Manifest)."""
  size = sum(os.path.getsize(p) for p in manifest.shard_paths())
  return (
      f"wrote {manifest.num_examples:,} examples in {manifest.num_records:,} records"
      f" ({manifest.examples_per_record} per record) to {len(manifest.shards)} shards,"
      f" {size / 2**20:.1f} MiB, in {seconds:.1f} s"
      f" ({manifest.num_examples / max(seconds, 1e-9):,.0f} examples/s): {manifest.directory}"
  )

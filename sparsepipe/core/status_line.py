"""One status line for people: redrawn in place on a terminal, whole lines in logs.

The converters' progress and the training progress both draw through it
(they differ only in what the line says): on a terminal the line is
rewritten with a carriage return at most every `interval_s`; otherwise (logs,
CI) whole lines are printed, at most every `log_interval_s`, so no carriage
returns end up in a log.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class StatusLine:
  """A live line on `stream` (default stdout) plus lines of their own."""

  def __init__(
    self,
    stream: TextIO | None = None,
    *,
    interval_s: float = 0.0,
    log_interval_s: float = 0.0,
    enabled: bool = True,
  ):
    self._stream = sys.stdout if stream is None else stream
    self._enabled = enabled
    self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
    self._interval = interval_s if self._tty else log_interval_s
    self._last_time = -float("inf")
    self._last_len = 0
    self.shown = ""

  @property
  def is_terminal(self) -> bool:
    return self._tty

  def show(self, text: str, *, force: bool = False) -> None:
    """Shows `text` as the live line (skipped if shown too recently, unless forced)."""
    now = time.monotonic()
    if not self._enabled or (not force and now - self._last_time < self._interval):
      return
    self._last_time = now
    self.shown = text
    if self._tty:
      pad = " " * max(0, self._last_len - len(text))
      self._stream.write("\r" + text + pad)
      self._last_len = len(text)
    else:
      self._stream.write(text + "\n")
    self._stream.flush()

  def end(self) -> None:
    """Ends a live line on a terminal (the next output starts a new line)."""
    if self._enabled and self._tty and self._last_len:
      self._stream.write("\n")
      self._stream.flush()
      self._last_len = 0

  def message(self, text: str) -> None:
    """A line of its own (ends the live line first)."""
    if not self._enabled:
      return
    self.end()
    self._stream.write(text + "\n")
    self._stream.flush()

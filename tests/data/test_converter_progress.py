"""The converters' progress line: live on a terminal, whole lines in logs."""

import io

from sparsepipe.data.progress import Progress


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def test_log_stream_gets_whole_lines_and_no_carriage_returns():
  # The final count was already printed by the last update: not repeated.
  stream = io.StringIO()
  progress = Progress("convert", 100, stream=stream, log_interval_s=0.0)
  progress.update(40)
  progress.update(60)
  progress.close()
  lines = stream.getvalue().splitlines()
  assert "\r" not in stream.getvalue()
  assert [line.split("  ")[0] for line in lines] == [
    "convert: 40/100 examples (40.0%)",
    "convert: 100/100 examples (100.0%)",
  ]


def test_terminal_line_is_redrawn_in_place_and_ended_once():
  stream = _Terminal()
  progress = Progress("convert", None, stream=stream, interval_s=0.0)
  progress.update(5)
  progress.close()
  text = stream.getvalue()
  # A shorter redraw is padded with spaces over the longer line it replaces.
  assert text.startswith("\rconvert: 5 examples") and text.endswith("\n")
  assert text.rstrip("\n").rstrip(" ").endswith("/s")
  assert text.count("\r") == 2 and text.count("\n") == 1

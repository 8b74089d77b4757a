"""What a writer killed outright leaves beside its output, removed or put back by the next.

A SIGTERM (its default action) or SIGKILL during `launch.export` left its
temporary folder for good, and one between the two renames of an
--overwrite left no export at all (the old one under a hidden name, which
nothing put back); the converters had the same window.
"""

import os
import socket
import subprocess

from sparsepipe.core.work_directories import clean_up_after_killed_writers
from sparsepipe.core.work_directories import move_into_place
from sparsepipe.core.work_directories import work_directory


def _gone_pid() -> int:
  proc = subprocess.Popen(["true"])
  proc.wait()
  return proc.pid


def _left(parent, kind, pid, host=None, text="x"):
  path = parent / f".E.{kind}-{host or socket.gethostname()}-{pid}"
  path.mkdir()
  (path / "export.json").write_text(text)
  return str(path)


def test_a_killed_writers_folders_go_and_an_output_it_moved_aside_comes_back(tmp_path):
  output = tmp_path / "E"
  gone, alive = _gone_pid(), os.getppid()
  tmp = _left(tmp_path, "tmp", gone)
  old = _left(tmp_path, "old", gone, text="the old export")
  kept = [_left(tmp_path, "tmp", alive), _left(tmp_path, "tmp", gone, host="elsewhere")]
  assert clean_up_after_killed_writers(str(output)) == [old, tmp]
  assert (output / "export.json").read_text() == "the old export"  # killed between renames
  assert sorted(os.listdir(tmp_path)) == sorted(["E", *map(os.path.basename, kept)])
  # With the new output in place, a killed writer's old one is only removed.
  old = _left(tmp_path, "old", gone)
  assert clean_up_after_killed_writers(str(output)) == [old]
  assert (output / "export.json").read_text() == "the old export"


def test_an_output_is_built_aside_and_replaces_the_old_one_whole(tmp_path):
  output = str(tmp_path / "E")
  for text in ("first", "second"):
    work = work_directory(output)
    assert os.path.basename(work) == f".E.tmp-{socket.gethostname()}-{os.getpid()}"
    with open(os.path.join(work, "export.json"), "w") as f:
      f.write(text)
    move_into_place(work, output)
    assert (tmp_path / "E" / "export.json").read_text() == text
    assert os.listdir(tmp_path) == ["E"]

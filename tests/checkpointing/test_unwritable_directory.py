"""A writable manager whose directory cannot be written is refused when it opens.

Orbax found out only at the first save, in its background thread: the job
trained to its first save, waited five minutes and printed 78 lines.
Tests run as root, which writes through any permission bits: the refusals
here hold for root too (a failing mkdir; sysfs, where root cannot create).
"""

import errno
import os

import pytest

from sparsepipe.checkpointing import TrainingCheckpointManager
from sparsepipe.checkpointing import UnwritableCheckpointDirectoryError
from sparsepipe.checkpointing.manager import check_writable

import checkpoint_toy as toy  # pylint: disable=g-bad-import-order
from test_manager import run_info  # pylint: disable=g-bad-import-order


def test_a_directory_without_write_permission_is_named(tmp_path, monkeypatch):
  directory = tmp_path / "checkpoints"
  directory.mkdir()
  real_mkdir = os.mkdir

  def mkdir(path, *args, **kwargs):  # what a user without write permission gets
    if os.path.dirname(os.fspath(path)) == str(directory):
      raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
    return real_mkdir(path, *args, **kwargs)

  monkeypatch.setattr(os, "mkdir", mkdir)
  with pytest.raises(UnwritableCheckpointDirectoryError) as raised:
    TrainingCheckpointManager(directory, run_info(toy.make_mesh()))
  assert str(raised.value) == (
    f"the checkpoint directory '{directory}' cannot be written (Permission denied): no"
    " checkpoint could be saved there; make it writable, or use another directory"
  )
  assert os.listdir(directory) == []


@pytest.mark.parametrize("where", ["sysfs", "under_a_file"])
def test_a_directory_even_root_cannot_write_is_named(tmp_path, where):
  if where == "sysfs":
    (tmp_path / "checkpoints").symlink_to("/sys")
    directory, reason = tmp_path / "checkpoints", os.strerror(errno.EPERM)
  else:
    (tmp_path / "a_file").write_text("")
    directory, reason = tmp_path / "a_file" / "checkpoints", os.strerror(errno.ENOTDIR)
  with pytest.raises(UnwritableCheckpointDirectoryError) as raised:
    check_writable(str(directory))
  assert str(raised.value).startswith(
    f"the checkpoint directory '{directory}' cannot be written ({reason}):"
  )


def test_a_read_only_manager_does_not_check(tmp_path):
  (tmp_path / "checkpoints").symlink_to("/sys")
  TrainingCheckpointManager(
    tmp_path / "checkpoints", run_info(toy.make_mesh()), read_only=True
  ).close()

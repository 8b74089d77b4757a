"""`launch.export --platforms` takes only platforms jax.export lowers for.

jax.export records any name it is given, so a typo'd platform used to be
written into the export as if the predict function ran there.
"""

import subprocess
import sys

import pytest

from sparsepipe.launch.export import export_checkpoint

import subprocess_harness as harness  # pylint: disable=g-bad-import-order

_MESSAGE = (
  "--platforms: unknown platform 'foo' (the predict function is lowered for any of"
  " cpu, cuda, rocm, tpu)"
)


def test_an_unknown_platform_is_refused_before_the_workdir_is_read(tmp_path):
  with pytest.raises(ValueError) as raised:
    export_checkpoint(
      str(tmp_path / "no_such_workdir"), str(tmp_path / "export"), platforms=("cuda", "foo")
    )
  assert str(raised.value) == _MESSAGE
  assert not (tmp_path / "export").exists()


def test_the_command_names_the_platform_in_one_line_and_exits_1(tmp_path):
  out = subprocess.run(
    [sys.executable, "-m", "sparsepipe.launch.export", f"--workdir={tmp_path / 'w'}"]
    + [f"--output={tmp_path / 'e'}", "--platforms=tpu,foo"],
    capture_output=True,
    text=True,
    env=harness.cpu_env(1),
    timeout=120,
  )
  assert (out.returncode, out.stderr) == (1, f"error: {_MESSAGE}\n")
  assert not (tmp_path / "e").exists()

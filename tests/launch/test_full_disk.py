"""Writes that fail for want of space are one line naming what was written, leave no
partial files, and lose nothing saved.

The tests cannot fill a disk without root, so they give the command a file-size
limit (RLIMIT_FSIZE, with SIGXFSZ ignored): a write past it fails with EFBIG as a
full disk's fails with ENOSPC, in the same calls. A full disk once gave a
checkpoint save some 500 lines of Orbax's and asyncio's tracebacks, a dataset a
Python traceback (ArrayRecord's RuntimeError) and its temporary folder left
behind, and an export numpy's "160000 requested and 104416 written".
"""

import errno
import functools
import os
import resource
import signal
import sys

import pytest

from sparsepipe.launch.job.metrics_log import MetricsLog
from sparsepipe.launch.workdir import lock

import launch_testing  # pylint: disable=g-bad-import-order
import subprocess_harness as harness  # pylint: disable=g-bad-import-order

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE semantics")

_LIMIT = 300_000  # bytes: above the tiny job's data shard and small files, below its arrays


def _run(command, limit=None):
  """`command` (python -m MODULE ARGS...) with at most `limit` bytes a file."""

  def limited():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

  return harness.run_module(
    *command[2:],
    env=harness.cpu_env(1, compilation_cache_dir=harness.SESSION_JAX_CACHE),
    preexec_fn=limited if limit else None,
  )


def _said(stderr):
  """stderr less absl's log lines (and the data generation's and conversion's progress)."""
  return [
    line
    for line in stderr.splitlines()
    if line and line[0] not in "IWE" and not line.startswith(("synthetic ", "csv: "))
  ]


def test_a_save_that_cannot_be_written_is_one_line_and_the_job_resumes_exactly(tmp_path):
  # Sequential: an extended pipelined job differs by float rounding (docs/guide/jobs.md).
  workdir, reference = str(tmp_path / "job"), str(tmp_path / "reference")
  job = functools.partial(launch_testing.launch_command, pipelining=False)
  assert _run(job(reference, num_steps=6)).returncode == 0
  assert _run(job(workdir, num_steps=3)).returncode == 0
  full = _run(job(workdir, num_steps=6), limit=_LIMIT)
  assert full.returncode == 1
  assert full.stderr.count("Traceback") == 0 and len(_said(full.stderr)) == 1, full.stderr
  (line,) = _said(full.stderr)
  assert line.startswith("error: ") and "File too large" in line, line
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints")))[0] == "3"
  assert _run(job(workdir, num_steps=6)).returncode == 0
  assert launch_testing.batch_losses(workdir) == launch_testing.batch_losses(reference)


def test_a_dataset_and_an_export_that_cannot_be_written_are_one_line_and_leave_nothing(
  tmp_path,
):
  rows = "".join(f"{i % 2},u{i * 7919 % 100003},{i % 97}\n" for i in range(40_000))
  (tmp_path / "in.csv").write_text("label,user,age\n" + rows)
  output = str(tmp_path / "data")
  convert = [sys.executable, "-m", "sparsepipe.data.csv", "--input", str(tmp_path / "in.csv")]
  convert += ["--output", output, "--label_column", "label", "--sparse_columns", "user"]
  convert += ["--dense_columns", "age"]
  out = _run(convert, limit=_LIMIT)
  assert out.returncode == 1 and len(_said(out.stderr)) == 1, out.stderr
  line = _said(out.stderr)[0]
  assert line.startswith(f"error: cannot write the dataset '{output}': write() failed: File too")
  assert sorted(os.listdir(tmp_path)) == ["in.csv"]  # no .data.tmp-* folder

  workdir = str(tmp_path / "job")
  assert _run(launch_testing.launch_command(workdir, num_steps=3)).returncode == 0
  export = str(tmp_path / "export")
  command = [sys.executable, "-m", "sparsepipe.launch.export", f"--workdir={workdir}"]
  out = _run([*command, f"--output={export}"], limit=_LIMIT)
  assert out.returncode == 1 and len(_said(out.stderr)) == 1, out.stderr
  assert _said(out.stderr)[0].startswith(f"error: cannot write the export '{export}': ")
  assert sorted(os.listdir(tmp_path)) == ["in.csv", "job"]


def _fail_with_enospc(*_):
  raise OSError(errno.ENOSPC, "No space left on device")


class _FullDiskFile:
  """A file whose text stays buffered: flush() and close() fail as on a full disk."""

  def __init__(self, real):
    self._real, self._pending = real, ""

  def __getattr__(self, name):
    return getattr(self._real, name)

  def write(self, text):
    self._pending += text
    return len(text)

  def flush(self):
    if self._pending:
      _fail_with_enospc()

  def close(self):
    self._real.close()
    self.flush()


def test_the_lock_file_a_launch_cannot_write_is_named_and_removed(tmp_path, monkeypatch):
  """Its flush failed with a bare "[Errno 28] No space left on device" (and closing the
  file raised it again), and the empty job.lock and the workdir made for it stayed."""
  monkeypatch.setattr(lock, "open", lambda *a, **k: _FullDiskFile(open(*a, **k)), raising=False)
  workdir = tmp_path / "jobs" / "w"
  with pytest.raises(OSError) as refused:
    with lock.exclusive_workdir(str(workdir)):
      pass
  path = workdir / lock.LOCK_FILENAME
  assert str(refused.value) == (
    f"cannot write the workdir's lock file '{path}': No space left on device"
  )
  assert os.listdir(tmp_path) == []


def test_metrics_that_cannot_be_rewritten_are_named_and_leave_no_temporary_file(
  tmp_path, monkeypatch
):
  """A resumed job rewrites metrics.jsonl without the batches it trains again; a full
  disk there said "[Errno 28] No space left on device" and left metrics.jsonl.tmp."""
  path = tmp_path / "metrics.jsonl"
  before = '{"batch": 1, "loss": 0.5}\n{"batch": 2, "loss": 0.4}\n'
  path.write_text(before)
  monkeypatch.setattr(os, "replace", _fail_with_enospc)
  with pytest.raises(OSError) as refused:
    MetricsLog(str(path)).truncate_after(1)
  assert str(refused.value) == f"cannot write the job's metrics '{path}': No space left on device"
  assert os.listdir(tmp_path) == ["metrics.jsonl"] and path.read_text() == before

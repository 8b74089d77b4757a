"""A failed save leaves only its error: Orbax's and asyncio's reports are held back."""

import asyncio
import gc
import logging

from sparsepipe import checkpointing

_WRITE_FAILED = (
  'OUT_OF_RANGE: Error writing "embeddings.t.slots.0/0.0" in OCDBT database at local file'
  ' "/w/checkpoints/6.orbax-checkpoint-tmp/arrays.orbax-checkpoint-tmp/ocdbt.process_0/":'
  " Failed to write 382710 bytes to file 9: File too large [os_error_code='27']"
)


def test_unretrieved_failures_of_a_failed_saves_writes_are_not_logged(caplog):
  # Regression (CI, a full disk): besides the save's one error line, asyncio logged
  # "Future exception was never retrieved" for a sibling TensorStore write, whose
  # repr names no Orbax code, only the step's temporary folder.
  checkpointing.quiet_failed_saves()
  write, other = ValueError(_WRITE_FAILED), ValueError("OUT_OF_RANGE: something else")
  loop = asyncio.new_event_loop()
  with caplog.at_level(logging.ERROR, logger="asyncio"):
    for error in (write, other):
      future = loop.create_future()
      future.set_exception(error)
      del future
      gc.collect()
  loop.close()
  assert [r.getMessage().splitlines()[0] for r in caplog.records] == [
    "Future exception was never retrieved"
  ]
  assert [r.exc_info[1] for r in caplog.records] == [other]


def test_orbax_tracebacks_are_dropped_and_everything_else_passes(caplog):
  checkpointing.quiet_failed_saves()
  checkpointing.quiet_failed_saves()  # once is enough: no second filter

  def record(pathname, exc_info, level=logging.ERROR):
    return logging.LogRecord("absl", level, pathname, 1, "failed", None, exc_info)

  error = (ValueError, ValueError(_WRITE_FAILED), None)
  orbax_code = "/site-packages/orbax/checkpoint/_src/futures/future.py"
  absl = logging.getLogger("absl")
  assert [type(f).__name__ for f in absl.filters].count("OrbaxWriteFailures") == 1
  assert not absl.filter(record(orbax_code, error))
  assert absl.filter(record(orbax_code, None))  # an Orbax error line without a traceback
  assert absl.filter(record("/site-packages/jax/_src/api.py", error))
  assert absl.filter(record(orbax_code, error, level=logging.WARNING))

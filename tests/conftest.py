"""Test set-up: 8 CPU devices and parsed absl flags, before jax is imported."""

import atexit
import os
import shutil
import tempfile

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Jobs keep compiled programs in $XDG_CACHE_HOME/sparsepipe by default
# (config.compilation_cache_dir): the tests' jobs use a cache of their own
# session, never the user's, and the jobs of one session share it, in every
# pytest-xdist worker (they inherit the variable from the process that made it).
_SESSION_CACHE_ENV = "SPARSEPIPE_TEST_SESSION_CACHE"
if _SESSION_CACHE_ENV not in os.environ:
  os.environ[_SESSION_CACHE_ENV] = tempfile.mkdtemp(prefix="sparsepipe-tests-cache-")
  atexit.register(shutil.rmtree, os.environ[_SESSION_CACHE_ENV], ignore_errors=True)
os.environ["XDG_CACHE_HOME"] = os.environ[_SESSION_CACHE_ENV]

from absl import flags  # pylint: disable=g-import-not-at-top

# grain's mp_prefetch reads absl flags; libraries and tests must mark them parsed.
if not flags.FLAGS.is_parsed():
  flags.FLAGS.mark_as_parsed()


def pytest_xdist_auto_num_workers(config) -> int:  # pylint: disable=unused-argument
  """`-n auto`: a worker per core this process may run on, at most 4.

  A test's jobs take up to 2 processes of 4-8 CPU devices and a few GB at
  their peak; more workers than cores only make each test slower.
  """
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return max(1, min(cores or 1, 4))

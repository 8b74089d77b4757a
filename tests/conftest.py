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
# session, never the user's, and the jobs of one session share it.
_CACHE_HOME = tempfile.mkdtemp(prefix="sparsepipe-tests-cache-")
os.environ["XDG_CACHE_HOME"] = _CACHE_HOME
atexit.register(shutil.rmtree, _CACHE_HOME, ignore_errors=True)

from absl import flags  # pylint: disable=g-import-not-at-top

# grain's mp_prefetch reads absl flags; libraries and tests must mark them parsed.
if not flags.FLAGS.is_parsed():
  flags.FLAGS.mark_as_parsed()

"""Test set-up: 8 CPU devices and parsed absl flags, before jax is imported."""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import flags  # pylint: disable=g-import-not-at-top

# grain's mp_prefetch reads absl flags; libraries and tests must mark them parsed.
if not flags.FLAGS.is_parsed():
  flags.FLAGS.mark_as_parsed()

"""Table and slot initializers: small frozen dataclasses.

Hashable, printable and JSON-describable, with the jax initializer signature
`(key, shape, dtype) -> array`, so they can sit in frozen specs.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class TruncatedNormalInitializer:
  """Truncated normal in [-2, 2] standard deviations, scaled by `stddev`."""

  stddev: float = 0.05

  def __call__(self, key, shape, dtype=np.float32):
    import jax  # pylint: disable=g-import-not-at-top

    return self.stddev * jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype)


@dataclasses.dataclass(frozen=True)
class UniformInitializer:
  """Uniform in [-scale, scale)."""

  scale: float = 0.05

  def __call__(self, key, shape, dtype=np.float32):
    import jax  # pylint: disable=g-import-not-at-top

    return jax.random.uniform(key, shape, dtype, -self.scale, self.scale)


@dataclasses.dataclass(frozen=True)
class ConstantInitializer:
  """Every element equal to `value` (optimizer slots, tests)."""

  value: float = 0.0

  def __call__(self, key, shape, dtype=np.float32):
    del key
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

    return jnp.full(shape, self.value, dtype)

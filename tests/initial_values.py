"""Comparing initial values that two different XLA programs drew from one key.

XLA:CPU of jax 0.12 on AVX-512 hosts rounds the truncated normal's erf and
erf_inv a last bit differently depending on how a program fuses, vectorises
and shards them: the same table drawn by its initializer's own program and by
the job's sharded init program differ in about 0.1% of values, by up to 3
ulp in these tests (erf_inv's slope, up to 6 within 2 standard deviations,
magnifies a last-bit difference of its argument), and agree bit for bit
with jax 0.10.2 or XLA_FLAGS=--xla_cpu_max_isa=AVX2. So such values are
compared to 4 ulp; where they sit (keys, rows, padding) stays exact, since a
value drawn for another place differs by far more.
"""

import numpy as np


def assert_same_draws(got, want) -> None:
  """`got` equals `want` to 4 ulp, with exactly the same zeros (padding)."""
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
  np.testing.assert_array_equal(got == 0, want == 0)
  np.testing.assert_array_max_ulp(got, want, maxulp=4)

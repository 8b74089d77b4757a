"""Integer rounding shared by the COO layout, the embedding layout and FDO."""

from __future__ import annotations


def is_power_of_two(n: int) -> bool:
  """Whether `n` is 1, 2, 4, 8, ... (the SparseCore counts the MOD layout takes)."""
  n = int(n)
  return n >= 1 and not n & (n - 1)


def round_up(value: int, multiple: int) -> int:
  """Smallest multiple of `multiple` (>= 1) that is >= value."""
  if int(multiple) < 1:
    raise ValueError(f"round_up: multiple={multiple} must be at least 1")
  return -(-int(value) // multiple) * multiple


def round_up_to_steps(value: int, steps_per_doubling: int) -> int:
  """`value` rounded up to one of `steps_per_doubling` evenly spaced values per doubling.

  Values up to steps_per_doubling stay as they are; above, a value in
  (S * 2**k, 2 * S * 2**k] (S = steps_per_doubling) goes up to a multiple of
  2**k: with S = 8, ..., 240, 256, 288, 320, ..., 480, 512, 576, ... So the
  result is less than 1/S above `value`, and values that differ by a few
  percent mostly share one. 0 leaves `value` as it is.
  """
  value, steps = int(value), int(steps_per_doubling)
  if steps < 0:
    raise ValueError(f"steps_per_doubling={steps} must be >= 0")
  if steps == 0 or value <= steps:
    return value
  unit = 1
  while 2 * steps * unit < value:
    unit *= 2
  return round_up(value, unit)

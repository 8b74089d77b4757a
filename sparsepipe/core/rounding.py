"""Integer rounding shared by the COO layout and the embedding layout."""

from __future__ import annotations


def round_up(value: int, multiple: int) -> int:
  """Smallest multiple of `multiple` that is >= value."""
  return -(-int(value) // multiple) * multiple

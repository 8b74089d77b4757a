"""Stable hashing of category strings into a table's vocabulary.

Python's `hash()` is salted per process, so converters use a fixed hash:

    h(s) = int.from_bytes(blake2b(s.encode("utf-8"), digest_size=8).digest(), "little")
    id   = num_reserved + h(s) % (vocab_size - num_reserved)

The same string maps to the same id on every machine, run and version of
Python. `num_reserved` low ids are kept out of the hash range (e.g. id 0 for
"empty category").
"""

from __future__ import annotations

import hashlib


def stable_hash64(value: str) -> int:
  """64-bit BLAKE2b of the UTF-8 bytes, read little-endian."""
  digest = hashlib.blake2b(value.encode("utf-8"), digest_size=8).digest()
  return int.from_bytes(digest, "little")


class CategoryHasher:
  """Maps category strings to ids in [num_reserved, vocab_size), with a cache.

  Real click logs repeat the same categories constantly, so a bounded
  dictionary in front of the hash saves most of the hashing time.
  """

  def __init__(self, vocab_size: int, *, num_reserved: int = 0, cache_size: int = 1 << 20):
    if not 0 <= num_reserved < vocab_size:
      raise ValueError(f"vocab_size={vocab_size} must exceed num_reserved={num_reserved}")
    self.vocab_size = vocab_size
    self.num_reserved = num_reserved
    self._modulus = vocab_size - num_reserved
    self._cache: dict[str, int] = {}
    self._cache_size = cache_size

  def __call__(self, value: str) -> int:
    cached = self._cache.get(value)
    if cached is not None:
      return cached
    result = self.num_reserved + stable_hash64(value) % self._modulus
    if len(self._cache) >= self._cache_size:
      self._cache.clear()
    self._cache[value] = result
    return result

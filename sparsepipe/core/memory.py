"""Data workers keep freed memory: a batch's temporaries reuse warm pages.

A worker allocates and frees the same few hundred arrays (tens of MB) for
every batch. glibc's malloc gives large freed blocks back to the kernel
(munmap, heap trimming), so the next batch's arrays start on fresh pages
that the kernel zeroes on first touch: about a fifth of a worker's CPU time
in benchmarks/loader.py. Fixing the thresholds (mallopt) keeps that memory
in the process for reuse; a worker's resident size stays at its peak.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# glibc <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_HEAP_BELOW = 32 << 20  # allocations under 32 MiB come from the heap (glibc's usual maximum)
_TRIM_ABOVE = 1 << 30  # the heap is trimmed only past 1 GiB free


def keep_freed_memory() -> bool:
  """Stops malloc returning freed memory to the kernel; False where the C
  library is not glibc (nothing changed)."""
  name = ctypes.util.find_library("c")
  if name is None:
    return False
  try:
    mallopt = ctypes.CDLL(name).mallopt
  except (OSError, AttributeError):
    return False
  mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
  return bool(mallopt(_M_MMAP_THRESHOLD, _HEAP_BELOW) and mallopt(_M_TRIM_THRESHOLD, _TRIM_ABOVE))

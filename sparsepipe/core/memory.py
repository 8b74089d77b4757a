"""glibc's malloc, tuned per process: data workers keep freed memory, the
trainer gives the compiler's back.

A worker allocates and frees the same few hundred arrays (tens of MB) for
every batch. glibc's malloc gives large freed blocks back to the kernel
(munmap, heap trimming), so the next batch's arrays start on fresh pages
that the kernel zeroes on first touch: about a fifth of a worker's CPU time
in benchmarks/loader.py. Fixing the thresholds (mallopt) keeps that memory
in the process for reuse; a worker's resident size stays at its peak.

The training process does the opposite once after compiling: XLA's
compiler frees some hundreds of MB of small blocks that glibc keeps in
its arenas (no single free block is large enough to be given back), and
the first steps' buffers land above them. `release_freed_heap`
(malloc_trim) returns those pages; in benchmarks/memory.py it lowered the
criteo job's peak by 0.2-0.3 GB.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# glibc <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_HEAP_BELOW = 32 << 20  # allocations under 32 MiB come from the heap (glibc's usual maximum)
_TRIM_ABOVE = 1 << 30  # the heap is trimmed only past 1 GiB free


def _glibc(function: str):
  """The C library's `function`, or None where there is none (not glibc)."""
  name = ctypes.util.find_library("c")
  if name is None:
    return None
  try:
    return getattr(ctypes.CDLL(name), function)
  except (OSError, AttributeError):
    return None


def keep_freed_memory() -> bool:
  """Stops malloc returning freed memory to the kernel; False where the C
  library is not glibc (nothing changed)."""
  mallopt = _glibc("mallopt")
  if mallopt is None:
    return False
  mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
  return bool(mallopt(_M_MMAP_THRESHOLD, _HEAP_BELOW) and mallopt(_M_TRIM_THRESHOLD, _TRIM_ABOVE))


def release_freed_heap() -> bool:
  """Gives the free pages of every malloc arena back to the kernel
  (malloc_trim(0)); False where the C library is not glibc."""
  trim = _glibc("malloc_trim")
  if trim is None:
    return False
  trim.argtypes = (ctypes.c_size_t,)
  trim(0)
  return True

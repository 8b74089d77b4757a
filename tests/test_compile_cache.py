"""numba's cache saves take turns: concurrent saves never pair an index entry with
another specialization's machine code.

Seen in CI: processes with a cold cache (data workers, jobs, test workers)
compiled different specializations of one COO pass at once, and later loads
ran code compiled for other types (garbage COO buffers, NaN losses).
"""

import threading

from numba.core import caching

from sparsepipe.core import compile_cache

_WAIT_S = 2.0


def _cache_file(directory):
  """numba's index-and-data cache file of one function, as one process has it."""
  return caching.IndexDataCacheFile(str(directory), "coo_pass-10.py312", ("stamp", 1))


def _instrument(cache_file, name, events):
  """Makes `cache_file` set events[name + step] after each step and wait where told."""
  load_index, save_index, save_data = (
    cache_file._load_index,
    cache_file._save_index,
    cache_file._save_data,
  )

  def loaded():
    index = load_index()
    events[f"{name} loaded"].set()
    if name == "a":
      events["b loaded"].wait(_WAIT_S)  # both have read the empty index
    else:
      events["a saved index"].wait(_WAIT_S)
    return index

  def saved_index(overloads):
    save_index(overloads)
    events[f"{name} saved index"].set()

  def saved_data(data_name, data):
    if name == "a":
      events["b done"].wait(_WAIT_S)  # b's data first, then a's over it
    save_data(data_name, data)

  cache_file._load_index, cache_file._save_index = loaded, saved_index
  cache_file._save_data = saved_data


def test_concurrent_saves_of_two_specializations_keep_each_ones_code(tmp_path):
  steps = ("a loaded", "b loaded", "a saved index", "b saved index", "b done")
  events = {step: threading.Event() for step in steps}
  files = {name: _cache_file(tmp_path) for name in ("a", "b")}
  for name, cache_file in files.items():
    _instrument(cache_file, name, events)
    compile_cache._save_under_a_lock(cache_file)  # pylint: disable=protected-access

  def save_b():
    files["b"].save(("int64",), "code for int64")
    events["b done"].set()

  threads = [
    threading.Thread(target=files["a"].save, args=(("int32",), "code for int32")),
    threading.Thread(target=save_b),
  ]
  threads[0].start()
  events["a loaded"].wait(_WAIT_S)
  threads[1].start()
  for thread in threads:
    thread.join()
  fresh = _cache_file(tmp_path)
  assert fresh.load(("int32",)) == "code for int32"
  # Without turns, b's index entry named the file a wrote over: "code for int32".
  assert fresh.load(("int64",)) == "code for int64"

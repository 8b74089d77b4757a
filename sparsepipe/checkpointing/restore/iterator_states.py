"""Restoring the data iterator from a checkpoint of another process count.

Grain's handler writes one file per process, `process_{i}-of-{N}.json`, and
restores only the file of the same index and count. On another process
count (or device count) every process reads all N saved states instead,
and transforms.resize_iterator_state makes its own from them.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Sequence

from sparsepipe import transforms
from sparsepipe.checkpointing.integrity import digests as integrity
from sparsepipe.checkpointing.checkpoint_errors import CorruptCheckpointError

# Grain's iterator state file of one process (grain.checkpoint.CheckpointHandler):
# the one place that knows its name.
_FILE = re.compile(r"process_(\d+)-of-(\d+)\.json")


def data_iter_filename(process_index: int, process_count: int) -> str:
  """The state file Grain's handler writes for one process."""
  return f"process_{process_index}-of-{process_count}.json"


def read_iterator_states(
  item_dir: str | os.PathLike[str],
  *,
  digests: Sequence[str] | None = None,
  where: str = "",
) -> list[dict[str, Any]]:
  """Every saved process's iterator state, in process order.

  Args:
    item_dir: the step's data_iter item directory (Grain's files).
    digests: the sha256 of each process's state saved in the checkpoint
      metadata (data_iter_sha256), checked if given.
    where: names the checkpoint step in errors.

  Raises:
    CorruptCheckpointError: a missing, unreadable or altered file, or files
      of several process counts.
  """
  where = where or str(item_dir)
  files = [m for m in map(_FILE.fullmatch, sorted(os.listdir(item_dir))) if m]
  counts = sorted({int(m[2]) for m in files})
  if len(counts) != 1:
    raise CorruptCheckpointError(
      f"{where}: item 'data_iter' has files of process counts {counts}, expected one"
    )
  count = counts[0]
  found = {int(m[1]): m[0] for m in files}
  missing = [i for i in range(count) if i not in found]
  if missing or len(found) != count:
    raise CorruptCheckpointError(
      f"{where}: item 'data_iter' lacks the files of processes {missing} of {count}"
    )
  if digests is not None and len(digests) != count:
    raise CorruptCheckpointError(
      f"{where}: {len(digests)} data_iter digests for {count} process files"
    )
  states = []
  for i in range(count):
    name = found[i]
    try:
      with open(os.path.join(item_dir, name), encoding="utf-8") as f:
        state = json.load(f)
    except (OSError, ValueError) as e:
      raise CorruptCheckpointError(
        f"{where}: item 'data_iter' file {name} is unreadable ({type(e).__name__}: {e})"
      ) from e
    if digests is not None:
      integrity.check_digest(state, digests[i], what=f"item 'data_iter' file {name}", where=where)
    states.append(state)
  return states


def restore_resized_iterator(
  iterator: transforms.InputIterator,
  item_dir: str | os.PathLike[str],
  *,
  summarize_stats_maxima: bool = False,
  digests: Sequence[str] | None = None,
  where: str = "",
) -> transforms.InputIterator:
  """Positions `iterator` after the saved global batches, from any process count.

  Reads every saved state (read_iterator_states), converts them for this
  iterator's process (transforms.resize_iterator_state; same global batch,
  see there what is refused) and sets it. summarize_stats_maxima: the global
  device count changed (the maxima are summarized per stack, for
  InputIterator.carry_stats_maxima).
  The iterator is one of transforms.make_host_input.
  """
  saved = read_iterator_states(item_dir, digests=digests, where=where)
  if not isinstance(iterator, transforms.InputIterator):
    raise transforms.IteratorStateMismatchError(
      f"a {type(iterator).__name__} cannot take the data iterator"
      f" states of {len(saved)} processes; only the iterators of"
      " transforms.make_host_input convert to another process count"
    )
  state = transforms.resize_iterator_state(
    saved, iterator.metadata, summarize_stats_maxima=summarize_stats_maxima
  )
  iterator.set_state(state)
  start = getattr(iterator, "start_prefetch", None)
  if start is not None:  # as Grain's handler does after set_state
    start()
  return iterator

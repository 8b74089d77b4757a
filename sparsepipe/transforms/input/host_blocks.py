"""This host's share of every global batch: a contiguous block per batch.

Slicing a shuffled record order with a stride (`ds[index::count]`) gives
every host a disjoint share, but the global batch then depends on the
process count: with 2 hosts it holds records 0, 2, 4, ... then 1, 3, 5, ....
Taking contiguous blocks instead, host h reads records
[g*B*P + h*B, g*B*P + (h+1)*B) for global batch g (B records per host
batch, P hosts), so global batch g is records [g*B*P, (g+1)*B*P) in the same
order on one host or many, and a job can move between host counts (or be
compared with a 1-process run) with identical batches.

Per epoch the last len % (B*P) records, less than one global batch, are
left out, on any number of hosts alike (a stride would spread them).
"""

from __future__ import annotations

from typing import Any, Sequence

import grain


class HostBlocksMapDataset(grain.MapDataset):
  """Elements of host `index` of `count`, in blocks of `block` per global batch."""

  def __init__(self, parent: grain.MapDataset, *, block: int, index: int, count: int):
    super().__init__(parent)
    if block < 1:
      raise ValueError(f"block={block} must be >= 1")
    if not 0 <= index < count:
      raise ValueError(f"process index {index} not in [0, {count})")
    self._block, self._index, self._count = int(block), int(index), int(count)
    self._parent_length = len(parent)
    global_batch = self._block * self._count
    self._length = (self._parent_length // global_batch) * self._block
    if self._length == 0:
      raise ValueError(
        f"{self._parent_length} elements are fewer than one global batch of"
        f" {global_batch} ({count} hosts x {block})"
      )

  def __len__(self) -> int:
    return self._length

  def _parent_index(self, index: int) -> int:
    epoch, offset = divmod(index, self._length)
    batch, j = divmod(offset, self._block)
    within = batch * self._block * self._count + self._index * self._block + j
    return epoch * self._parent_length + within

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    with self._stats.record_self_time():
      parent_index = self._parent_index(index)
    return self._parent[parent_index]

  def _getitems(self, indices: Sequence[int]) -> Any:
    with self._stats.record_self_time(num_elements=len(indices)):
      parent_indices = [self._parent_index(i) for i in indices]
    return self._parent._getitems(parent_indices)  # pylint: disable=protected-access

  def __str__(self) -> str:
    return f"HostBlocksMapDataset(block={self._block}, host={self._index}/{self._count})"

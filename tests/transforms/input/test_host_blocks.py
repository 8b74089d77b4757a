"""HostBlocksMapDataset: per-host blocks make global batches host-count free."""

import grain
import pytest

from sparsepipe.transforms.input.host_blocks import HostBlocksMapDataset


def _global_batches(num_records, per_host_block, hosts, num_batches):
  """Global batch g = concatenation of every host's g-th block, host order."""
  shares = [
    list(
      HostBlocksMapDataset(
        grain.MapDataset.range(num_records), block=per_host_block, index=h, count=hosts
      )
    )
    for h in range(hosts)
  ]
  return [
    [x for share in shares for x in share[g * per_host_block : (g + 1) * per_host_block]]
    for g in range(num_batches)
  ]


def test_blocks_are_contiguous_per_global_batch():
  ds = HostBlocksMapDataset(grain.MapDataset.range(20), block=3, index=1, count=2)
  # Global batches of 6: [0..5], [6..11], [12..17]; host 1 has the second half.
  assert list(ds) == [3, 4, 5, 9, 10, 11, 15, 16, 17]
  assert len(ds) == 9


def test_global_batches_are_the_same_for_any_host_count():
  one = _global_batches(100, 12, 1, 8)
  two = _global_batches(100, 6, 2, 8)
  four = _global_batches(100, 3, 4, 8)
  assert one == two == four == [list(range(12 * g, 12 * g + 12)) for g in range(8)]


def test_hosts_are_disjoint_and_cover_every_whole_global_batch():
  shares = [
    set(HostBlocksMapDataset(grain.MapDataset.range(50), block=4, index=h, count=3))
    for h in range(3)
  ]
  assert not (shares[0] & shares[1] or shares[0] & shares[2] or shares[1] & shares[2])
  # 50 // 12 = 4 global batches; the last 2 records of the epoch are left out.
  assert set().union(*shares) == set(range(48))


def test_indices_past_the_end_continue_in_the_next_parent_epoch():
  parent = grain.MapDataset.range(10).seed(3).shuffle()
  ds = HostBlocksMapDataset(parent, block=2, index=0, count=2)
  assert len(ds) == 4
  # As SliceMapDataset does: index len + i reads epoch 1 of the parent.
  assert [ds[4 + i] for i in range(4)] == [parent[10 + j] for j in (0, 1, 4, 5)]


def test_too_few_records_for_one_global_batch():
  with pytest.raises(
    ValueError, match=r"5 elements are fewer than one global batch of 6 \(2 hosts x 3\)"
  ):
    HostBlocksMapDataset(grain.MapDataset.range(5), block=3, index=0, count=2)

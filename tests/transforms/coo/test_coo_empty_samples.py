"""Samples without ids at the start, inside and at the end of a SparseCore's
samples, as exact arrays (hand-computed like docs/reference/coo_format.md's worked
example).

The key pass finds each id's sample from marks where samples start
(coo_pass.key_pass); an SC whose samples are all empty, or that ends in
empty samples, leaves marks past its last id that must not leak into the
next SC's sample ids. Every input form, both kinds of keys (by sample,
unweighted; by position, weighted) and both region layouts (exact regions,
which these uneven SCs take, and padded rows, forced) give the same buffers.
"""

import numpy as np
import pytest

from sparsepipe import core
from sparsepipe import transforms as T
from sparsepipe.data.ragged import RaggedBatch
from sparsepipe.transforms.coo import sort as coo_sort

I = 2**31 - 1
NAN = np.nan

# G = L = 1, S = 4: N = 4, R = 8, two samples per SC; M = U = 4, so
# C = round8(4) * S * N = 128 and seg = 32. p = id mod 4, e = id div 4.
ROWS = [[], [], [3, 1], [], [2], [2, 2], [], [5]]


def _specs():
  table = core.TableSpec(
    name="t",
    vocabulary_size=16,
    embedding_dim=8,
    combiner="mean",
    max_ids_per_partition=4,
    max_unique_ids_per_partition=4,
  )
  feature = core.FeatureSpec(name="f", table_spec=table, input_shape=(8, 2), output_shape=(8, 8))
  return T.prepare_feature_specs_for_training({"f": feature}, 1, 4)


def _segment(entries):
  """One SC's 32 slots: (offset, e, sid, gain) entries, the rest fill."""
  emb, sid, gain = np.full(32, I), np.full(32, I), np.full(32, NAN, np.float32)
  for offset, e, s, g in entries:
    emb[offset], sid[offset], gain[offset] = e, s, g
  return emb, sid, gain


# SC0: no ids. SC1: sample 0 has ids 3 (p3) and 1 (p1), gain 1/2 each;
# sample 1 is empty. SC2: sample 0 has id 2 (p2), sample 1 has it twice
# (merged: 1/2 + 1/2). SC3: sample 0 is empty, sample 1 has id 5 (p1, e1).
SEGMENTS = [
  _segment([]),
  _segment([(0, 0, 0, 0.5), (8, 0, 0, 0.5)]),
  _segment([(0, 0, 0, 1.0), (1, 0, 1, 1.0)]),
  _segment([(0, 1, 1, 1.0)]),
]
ROW_POINTERS = [
  [0, 0, 0, 0, 0, 0, 0, 0],
  [0, 1, 8, 9, 16, 16, 16, 16],
  [0, 0, 2, 8, 8, 8, 8, 8],
  [0, 1, 8, 8, 8, 8, 8, 8],
]


def _form(name):
  lengths = np.array([len(r) for r in ROWS], np.int64)
  flat = np.array([i for r in ROWS for i in r], np.int32)
  if name == "ragged":
    rows = np.empty(len(ROWS), object)
    rows[:] = [np.array(r, np.int32) for r in ROWS]
    weights = np.empty(len(ROWS), object)
    weights[:] = [np.ones(len(r), np.float32) for r in ROWS]
    return rows, weights
  return RaggedBatch(flat, lengths), np.ones(flat.shape[0], np.float32)


@pytest.mark.parametrize("padded", [False, True], ids=["regions", "rows"])
@pytest.mark.parametrize("weighted", [False, True], ids=["by_sample", "by_position"])
@pytest.mark.parametrize("form", ["ragged", "columnar"])
def test_empty_samples_exact_arrays(form, weighted, padded, monkeypatch):
  if padded:  # 4 rows of 3 keys for 6 keys: padded only under a looser limit
    monkeypatch.setattr(coo_sort, "_PAD_LIMIT", 2.0)
  ids, weights = _form(form)
  out, stats = T.preprocess_sparse_dense_matmul_input(
    {"f": ids}, {"f": weights} if weighted else None, _specs(), 1, 1, num_sc_per_device=4
  )
  m = out.sparse_dense_matmul_input
  np.testing.assert_array_equal(m.lhs_row_pointers["t"], np.concatenate(ROW_POINTERS))
  for field, k in (("lhs_embedding_ids", 0), ("lhs_sample_ids", 1)):
    np.testing.assert_array_equal(getattr(m, field)["t"], np.concatenate([s[k] for s in SEGMENTS]))
  want_gains = np.concatenate([s[2] for s in SEGMENTS])
  np.testing.assert_array_equal(m.lhs_gains["t"].view(np.uint32), want_gains.view(np.uint32))
  np.testing.assert_array_equal(stats.max_ids_per_partition["t"], [0, 1, 2, 1])
  np.testing.assert_array_equal(stats.max_unique_ids_per_partition["t"], [0, 1, 1, 1])
  np.testing.assert_array_equal(stats.required_buffer_size_per_sc["t"], [0, 16, 8, 8])
  assert stats.id_drop_counters["t"] == 0

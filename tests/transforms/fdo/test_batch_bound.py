"""COO buffers no larger than one batch can fill (transforms.bound_coo_buffers_by_the_batch)."""

import numpy as np
import pytest

from sparsepipe import core
from sparsepipe import transforms as T


def _specs(max_ids=64, suggested=None, batch=64, devices=2, sc=2, **more):
  """Stack "t" of features a (3 ids) and b (2 ids); optional more tables of one feature."""

  def table(name, m, q):
    return core.TableSpec(
      name=name, vocabulary_size=64, embedding_dim=8, combiner="sum",
      max_ids_per_partition=m, max_unique_ids_per_partition=m,
      suggested_coo_buffer_size_per_device=q,
    )  # fmt: skip

  t = table("t", max_ids, suggested)
  specs = {
    "a": core.FeatureSpec("a", t, (batch, 3), (batch, 8)),
    "b": core.FeatureSpec("b", t, (batch, 2), (batch, 8)),
  }
  for name, (m, q) in more.items():
    specs[name] = core.FeatureSpec(name, table(name, m, q), (batch, 1), (batch, 8))
  return T.prepare_feature_specs_for_training(specs, devices, sc)


def _suggested(specs):
  return {
    s: v["suggested_coo_buffer_size_per_device"] for s, v in T.get_stack_limits(specs).items()
  }


def test_the_bound_is_a_scs_samples_ids_plus_a_partial_group_per_partition():
  # N = 2 devices x 2 SCs = 4; one SC: 64 / 4 = 16 samples of 3 + 2 ids = 80
  # ids, + 7 x 4 padding = 108 -> 112 per SC, x 2 SCs = 224 per device.
  specs = _specs(u=(8, None), v=(64, 300), w=(64, 40))
  # u, v, w: 16 samples of 1 id + 28 = 44 -> 48 per SC, 96 per device.
  assert T.most_coo_entries_per_device(specs, 2, 2) == {"t": 224, "u": 96, "v": 96, "w": 96}
  # T = round8(M) x S x N: 512 for t, so the bound is taken; u's T (8 x 2 x
  # 4 = 64) is below it; v's suggestion 300 is lowered, w's 40 kept.
  bounded = T.bound_coo_buffers_by_the_batch(specs, 2, 2)
  assert _suggested(specs) == {"t": None, "u": None, "v": 300, "w": 40}
  assert _suggested(bounded) == {"t": 224, "u": None, "v": 96, "w": 40}
  assert T.get_stack_limits(bounded)["t"]["max_ids_per_partition"] == 64
  assert T.compute_coo_buffer_sizes(T.get_stacked_table_specs(bounded), 2, 2)["t"] == 224


def _tight_batch():
  """1 device x 4 SCs (N = 4), 8 samples of up to 6 ids: SC 0's 2 samples
  put 9 ids in partition 0 (ids = 0 mod 4) and 1 in each other one, so it
  needs 16 + 8 + 8 + 8 = 40 entries: 12 ids + 7 x 4 padding, rounded to 8."""
  rows = [[0, 4, 8, 12, 16, 20], [24, 28, 32, 1, 2, 3]] + [[5]] * 6
  ragged = np.empty(len(rows), object)
  ragged[:] = [np.asarray(r, np.int32) for r in rows]
  table = core.TableSpec(
    name="t", vocabulary_size=64, embedding_dim=8, combiner="sum",
    max_ids_per_partition=16, max_unique_ids_per_partition=16,
  )  # fmt: skip
  specs = T.prepare_feature_specs_for_training(
    {"f": core.FeatureSpec("f", table, (8, 6), (8, 8))}, 1, 4
  )
  return {"f": ragged}, specs


def test_a_batch_can_fill_the_bound_exactly_and_never_more():
  features, specs = _tight_batch()
  bounded = T.bound_coo_buffers_by_the_batch(specs, 4, 1)
  assert _suggested(bounded) == {"t": 160}  # 40 per SC; T = 16 x 4 x 4 = 256
  out, stats = T.preprocess_sparse_dense_matmul_input(
    features, None, bounded, 1, 1, num_sc_per_device=4
  )
  np.testing.assert_array_equal(stats.required_buffer_size_per_sc["t"], [40, 8, 8, 8])
  full, _ = T.preprocess_sparse_dense_matmul_input(features, None, specs, 1, 1, num_sc_per_device=4)
  # The same entries, each SC's segment cut from 64 to 40.
  ids = out.sparse_dense_matmul_input.lhs_embedding_ids["t"].reshape(4, 40)
  full_ids = full.sparse_dense_matmul_input.lhs_embedding_ids["t"].reshape(4, 64)
  np.testing.assert_array_equal(ids, full_ids[:, :40])
  assert (full_ids[:, 40:] == 2**31 - 1).all()
  smaller = T.apply_stack_limits(
    specs,
    {"t": {**T.get_stack_limits(specs)["t"], "suggested_coo_buffer_size_per_device": 128}},
  )
  with pytest.raises(T.LimitExceededError, match="device 0 SC 0 needs 40 COO entries"):
    T.preprocess_sparse_dense_matmul_input(features, None, smaller, 1, 1, num_sc_per_device=4)


def _limits(specs):
  return {
    s: (v["max_ids_per_partition"], v["max_unique_ids_per_partition"])
    for s, v in T.get_stack_limits(specs).items()
  }


def test_limits_above_what_a_scs_samples_hold_are_lowered_to_it():
  # N = 4: one SC holds 16 samples; t's features 3 + 2 ids -> 80 ids, u's 1 id -> 16.
  specs = _specs(max_ids=200, u=(8, None), v=(64, None))
  assert _limits(specs) == {"t": (200, 200), "u": (8, 8), "v": (64, 64)}
  bounded = T.bound_coo_buffers_by_the_batch(specs, 2, 2)
  assert _limits(bounded) == {"t": (80, 80), "u": (8, 8), "v": (16, 16)}


def test_a_batch_that_fills_a_partition_to_the_lowered_limit_loses_no_id():
  # SC 0's 2 samples of 6 ids: a partition holds at most 12; the batch puts 9 in one.
  features, specs = _tight_batch()
  bounded = T.bound_coo_buffers_by_the_batch(specs, 4, 1)
  assert _limits(bounded) == {"t": (12, 12)}
  out, stats = T.preprocess_sparse_dense_matmul_input(
    features, None, bounded, 1, 1, num_sc_per_device=4
  )
  assert stats.id_drop_counters == {"t": 0}
  np.testing.assert_array_equal(stats.max_ids_per_partition["t"].max(), 9)

"""Randomized comparison with jax-tpu-embedding 0.1.0 (skipped without it).

Every case draws devices (L, G, S), tables, features (several per table),
stacking (none / explicit with rotation / auto), combiner, input forms,
weights, limits with id dropping and FDO-updated limits, then compares our
buffers and statistics with the reference bitwise where it writes, and our
stacked specs with the reference's field by field. The wide-key golden
configurations are compared with fresh draws too.
"""

import paths
import sys

import numpy as np
import pytest

jte = pytest.importorskip("jax_tpu_embedding")

from jax_tpu_embedding.sparsecore.lib.nn import embedding  # pylint: disable=g-import-not-at-top,wrong-import-position

from sparsepipe import transforms as T  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, paths.GOLDEN)
import coo_cases  # pylint: disable=g-import-not-at-top,wrong-import-position
import make_golden  # pylint: disable=g-import-not-at-top,wrong-import-position

_SEEDS = range(150)


@pytest.mark.parametrize("seed", _SEEDS)
def test_random_case_matches_reference(seed):
  case = coo_cases.random_case(np.random.default_rng(seed))
  raw = coo_cases.draw_raw(case)
  ours, ours_w, ref, ref_w = coo_cases.as_inputs(case, raw)
  expected = coo_cases.run_reference(case, ref, ref_w)
  actual = coo_cases.run_case(case, ours, ours_w)
  coo_cases.compare(case, expected, actual)


# Random cases rarely widen the sort key past 32 bits; these golden
# configurations pin each key-width path of coo_sort (make_golden.py), here
# with fresh draws.
_WIDE_PATHS = {
  "wide_uint32_boundary": "sample_uint32",
  "wide_narrow": "sample_uint32",
  "wide_uint64_single": "sample_uint64",
  "wide_uint64_stacked": "sample_uint64",
  "wide_uint64_weighted_dropping": "position_uint64",
}


@pytest.mark.parametrize("name", sorted(_WIDE_PATHS))
@pytest.mark.parametrize("seed", range(4))
def test_wide_key_case_matches_reference(name, seed):
  case = dict(make_golden.CASES[name], seed=1000 + seed)
  raw = coo_cases.draw_raw(case)
  ours, ours_w, ref, ref_w = coo_cases.as_inputs(case, raw)
  expected = coo_cases.run_reference(case, ref, ref_w)
  with coo_cases.record_sort_paths() as sort_paths:
    actual = coo_cases.run_case(case, ours, ours_w)
  # The region layout (rows or regions) depends on the draw.
  assert [p.rsplit("_", 1)[0] for p in sort_paths] == [_WIDE_PATHS[name]]
  coo_cases.compare(case, expected, actual)


# Seeds 37 and 58 stack tables of different dims.
@pytest.mark.parametrize("seed", [*range(0, 70, 7), 37, 58])
def test_stacked_specs_match_reference(seed):
  case = coo_cases.random_case(np.random.default_rng(seed))
  ours = coo_cases.build_specs(case)
  ref = coo_cases.reference_specs(case)
  assert sorted(ours) == sorted(ref)
  for name, f in ours.items():
    r = ref[name]
    assert f.id_transformation.row_offset == r.id_transformation.row_offset
    assert f.id_transformation.col_offset == r.id_transformation.col_offset
    assert f.id_transformation.col_shift == r.id_transformation.col_shift
    s, rs = f.table_spec.setting_in_stack, r.table_spec.setting_in_stack
    for field in (
      "stack_name",
      "padded_vocab_size",
      "padded_embedding_dim",
      "row_offset_in_shard",
      "shard_rotation",
    ):
      assert getattr(s, field) == getattr(rs, field), (name, field)
    st, rst = f.table_spec.stacked_table_spec, r.table_spec.stacked_table_spec
    for field in (
      "stack_name",
      "stack_vocab_size",
      "stack_embedding_dim",
      "combiner",
      "total_sample_count",
      "max_ids_per_partition",
      "max_unique_ids_per_partition",
      "suggested_coo_buffer_size_per_device",
    ):
      assert getattr(st, field) == getattr(rst, field), (name, field)


@pytest.mark.parametrize("seed", range(8))
def test_sparse_tensor_input_matches_reference(seed):
  rng = np.random.default_rng(100 + seed)
  case = coo_cases.random_case(rng)
  case["weighted"] = False
  raw = coo_cases.draw_raw(case)
  specs_ours = coo_cases.build_specs(case)
  specs_ref = coo_cases.reference_specs(case)
  indices, values, shapes = {}, {}, {}
  for f in case["features"]:
    ids, lengths, _ = raw[f["name"]]
    rows = np.repeat(np.arange(lengths.size), lengths)
    cols = np.arange(ids.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    indices[f["name"]] = np.stack([rows, cols], axis=1).astype(np.int64)
    values[f["name"]] = ids
    shapes[f["name"]] = np.array([lengths.size, max(f["valency"], 1)], np.int64)
  kwargs = dict(
    num_sc_per_device=case["sc_per_device"], allow_id_dropping=case["allow_id_dropping"]
  )
  l, g = case["local_devices"], case["global_devices"]
  out, stats = embedding.preprocess_sparse_dense_matmul_input_from_sparse_tensor(
    indices, values, shapes, specs_ref, l, g, **kwargs
  )
  expected = coo_cases.flatten_result(out, stats)
  actual = coo_cases.flatten_result(
    *T.preprocess_sparse_dense_matmul_input_from_sparse_tensor(
      indices, values, shapes, specs_ours, l, g, **kwargs
    )
  )
  coo_cases.compare(case, expected, actual)

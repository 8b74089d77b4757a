"""Golden fixtures made by jax-tpu-embedding 0.1.0 (tests/golden/make_golden.py).

Each fixture holds a case (JSON), its raw inputs and the reference's COO
buffers and statistics (unwritten tails set to our fill). Our stacking and
preprocessing must reproduce every array bitwise, without the reference.
Each fixture also pins the coo_sort path it takes (keys by sample or by
position, uint32 or uint64, padded rows or exact regions), so that every
path stays covered when the key packing changes.
"""

import paths
import glob
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, paths.GOLDEN)
import coo_cases  # pylint: disable=g-import-not-at-top,wrong-import-position

_FILES = sorted(glob.glob(os.path.join(paths.GOLDEN, "coo_*.npz")))


def _load(path):
  with np.load(path, allow_pickle=False) as data:
    case = json.loads(str(data["case"]))
    raw = {}
    for f in case["features"]:
      name = f["name"]
      raw[name] = tuple(data[f"raw/{name}/{k}"] for k in ("ids", "lengths", "weights"))
    expected = {
      key[len("expected/") :]: data[key] for key in data.files if key.startswith("expected/")
    }
  return case, raw, expected


# The coo_sort paths each fixture takes (coo_cases.SORT_PATHS), one per
# stack preprocessing call in order (FDO cases run twice). The wide_* cases
# exist to pin the key-width paths; see their comments in make_golden.py.
_SORT_PATHS = {
  "auto_stack_fdo": ["sample_uint32_regions", "sample_uint32_rows"] * 2,
  "dropping_mean": ["position_uint32_regions"],
  "dropping_stacked_sqrtn": ["position_uint32_rows"],
  "feature_stacking_sum": ["sample_uint32_regions"],
  "mean_single": ["sample_uint32_rows"],
  "mixed_dims": ["position_uint32_rows"],
  "sqrtn_dense_weighted": ["position_uint32_rows"],
  "stack_rotation_multihost": ["position_uint32_rows"],
  "wide_narrow": ["sample_uint32_regions"],
  "wide_uint32_boundary": ["sample_uint32_rows"],
  "wide_uint64_single": ["sample_uint64_rows"],
  "wide_uint64_stacked": ["sample_uint64_rows"],
  "wide_uint64_weighted_dropping": ["position_uint64_regions"],
}


def _name(path):
  return os.path.basename(path)[len("coo_") : -len(".npz")]


def test_fixtures_present():
  assert sorted(_name(p) for p in _FILES) == sorted(_SORT_PATHS)


def test_every_sort_path_is_pinned():
  """Key width and region layout are independent code paths: each of them
  is pinned for both kinds of keys (by sample, by position)."""
  pinned = {p for paths in _SORT_PATHS.values() for p in paths}
  assert pinned <= set(coo_cases.SORT_PATHS)
  for kind in ("sample", "position"):
    assert {p.split("_")[1] for p in pinned if p.startswith(kind)} == {"uint32", "uint64"}
    assert {p.split("_")[2] for p in pinned if p.startswith(kind)} == {"rows", "regions"}


@pytest.mark.parametrize("path", _FILES, ids=[_name(p) for p in _FILES])
def test_matches_reference_bitwise(path):
  case, raw, expected = _load(path)
  ours, ours_w, _, _ = coo_cases.as_inputs(case, raw)
  with coo_cases.record_sort_paths() as sort_paths:
    actual = coo_cases.run_case(case, ours, ours_w)
  assert sort_paths == _SORT_PATHS[_name(path)]
  assert sorted(actual) == sorted(expected)
  for key, want in expected.items():
    got = actual[key]
    assert got.dtype == want.dtype and got.shape == want.shape, key
    bits = np.uint32 if got.dtype == np.float32 else got.dtype
    np.testing.assert_array_equal(
      got.reshape(-1).view(bits), want.reshape(-1).view(bits), err_msg=key
    )

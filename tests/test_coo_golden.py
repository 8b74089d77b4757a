"""Golden fixtures made by jax-tpu-embedding 0.1.0 (tests/golden/make_golden.py).

Each fixture holds a case (JSON), its raw inputs and the reference's COO
buffers and statistics (unwritten tails set to our fill). Our stacking and
preprocessing must reproduce every array bitwise, without the reference.
"""

import glob
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "golden"))
import coo_cases  # pylint: disable=g-import-not-at-top,wrong-import-position

_FILES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "golden", "coo_*.npz")))


def _load(path):
  with np.load(path, allow_pickle=False) as data:
    case = json.loads(str(data["case"]))
    raw = {}
    for f in case["features"]:
      name = f["name"]
      raw[name] = tuple(data[f"raw/{name}/{k}"] for k in ("ids", "lengths", "weights"))
    expected = {
        key[len("expected/"):]: data[key]
        for key in data.files if key.startswith("expected/")
    }
  return case, raw, expected


def test_fixtures_present():
  assert len(_FILES) == 7


@pytest.mark.parametrize("path", _FILES, ids=[os.path.basename(p)[4:-4] for p in _FILES])
def test_matches_reference_bitwise(path):
  case, raw, expected = _load(path)
  ours, ours_w, _, _ = coo_cases.as_inputs(case, raw)
  actual = coo_cases.run_case(case, ours, ours_w)
  assert sorted(actual) == sorted(expected)
  for key, want in expected.items():
    got = actual[key]
    assert got.dtype == want.dtype and got.shape == want.shape, key
    bits = np.uint32 if got.dtype == np.float32 else got.dtype
    np.testing.assert_array_equal(
        got.reshape(-1).view(bits), want.reshape(-1).view(bits), err_msg=key)

"""Regenerates the golden COO fixtures with the reference implementation.

Run from the repository root, with jax-tpu-embedding 0.1.0 installed
(`pip install -e ".[oracle]"`):

    PYTHONPATH=. python tests/golden/make_golden.py [CASE_NAME ...]

For every case in CASES (or only the named ones) it draws the inputs,
stacks and preprocesses them with jax-tpu-embedding and writes
tests/golden/coo_<name>.npz holding the
case (JSON), the raw inputs and the reference's buffers and statistics.
The reference leaves the tail of every COO segment unwritten (whatever was
in memory); before saving, that tail is set to our deterministic
(INT_MAX, INT_MAX, NaN) fill, so the fixtures are reproducible and the test
compares whole buffers bitwise. Files contain no pickle. It prints each
fixture's size, drop counters and coo_sort paths (coo_cases.SORT_PATHS).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import coo_cases  # pylint: disable=g-import-not-at-top,wrong-import-position


def _table(name, vocab, combiner, max_ids=256, max_unique=256, dim=8, suggested=None):
  t = {
    "name": name,
    "vocab": vocab,
    "dim": dim,
    "combiner": combiner,
    "max_ids": max_ids,
    "max_unique": max_unique,
  }
  if suggested is not None:
    t["suggested"] = suggested
  return t


def _feature(name, table, batch, valency, form):
  return {"name": name, "table": table, "batch": batch, "valency": valency, "form": form}


def _case(
  g,
  l,
  s,
  tables,
  features,
  mode="none",
  groups=(),
  rotation=None,
  limits=(256, 256),
  weighted=False,
  drop=False,
  fdo=False,
  skew=1.0,
  seed=0,
):
  return {
    "global_devices": g,
    "local_devices": l,
    "sc_per_device": s,
    "tables": tables,
    "features": features,
    "stacking": {
      "mode": mode,
      "groups": [list(x) for x in groups],
      "rotation": rotation,
      "limits": list(limits),
    },
    "weighted": weighted,
    "allow_id_dropping": drop,
    "fdo": fdo,
    "skew": skew,
    "seed": seed,
  }


CASES = {
  # One table, mean, unweighted ragged int32; N = 2 < 8 row pointer slots.
  "mean_single": _case(
    1, 1, 2, [_table("t", 40, "mean")], [_feature("f", "t", 16, 6, "ragged")], skew=3.0, seed=1
  ),
  # sqrtn with float64 weights on dense input, two local devices.
  "sqrtn_dense_weighted": _case(
    2,
    2,
    2,
    [_table("t", 100, "sqrtn")],
    [_feature("f", "t", 16, 5, "dense")],
    weighted=True,
    skew=3.0,
    seed=2,
  ),
  # Three tables stacked with rotation 3 on 2 of 4 devices (G > L), two
  # features on one table, weighted sum, columnar + list + int64 input.
  "stack_rotation_multihost": _case(
    4,
    2,
    2,
    [_table("a", 50, "sum"), _table("b", 70, "sum"), _table("c", 9, "sum")],
    [
      _feature("fa", "a", 16, 4, "columnar"),
      _feature("fb", "b", 8, 3, "list"),
      _feature("fc", "c", 24, 5, "ragged64"),
      _feature("fa2", "a", 8, 2, "ragged"),
    ],
    mode="explicit",
    groups=[["b", "a", "c"]],
    rotation=3,
    weighted=True,
    skew=3.0,
    seed=3,
  ),
  # Auto stacking of 8x4 SCs, FDO-tuned limits (suggested COO size set).
  "auto_stack_fdo": _case(
    8,
    8,
    4,
    [_table("u", 3000, "mean"), _table("v", 500, "mean"), _table("w", 64, "mean", dim=16)],
    [
      _feature("fu", "u", 64, 8, "ragged"),
      _feature("fv", "v", 32, 3, "columnar"),
      _feature("fw", "w", 32, 4, "dense"),
    ],
    mode="auto",
    fdo=True,
    skew=3.0,
    seed=4,
  ),
  # Small limits with id dropping, weighted mean, heavy duplicates.
  "dropping_mean": _case(
    2,
    1,
    4,
    [_table("t", 30, "mean", max_ids=3, max_unique=2)],
    [_feature("f", "t", 32, 8, "ragged")],
    weighted=True,
    drop=True,
    skew=3.0,
    seed=5,
  ),
  # Dropping in a stack (limits from the stacking callables), sqrtn.
  "dropping_stacked_sqrtn": _case(
    2,
    2,
    2,
    [_table("p", 20, "sqrtn"), _table("q", 12, "sqrtn")],
    [_feature("fp", "p", 16, 6, "ragged"), _feature("fq", "q", 16, 6, "ragged")],
    mode="explicit",
    groups=[["p", "q"]],
    limits=(4, 3),
    weighted=True,
    drop=True,
    skew=2.0,
    seed=6,
  ),
  # Feature stacking only (two features on one table, ordered by name).
  "feature_stacking_sum": _case(
    2,
    2,
    4,
    [_table("t", 1000, "sum")],
    [_feature("z", "t", 16, 3, "ragged"), _feature("b", "t", 32, 7, "ragged")],
    skew=3.0,
    seed=7,
  ),
  # Three tables of embedding dims 8, 24 and 12 stacked (padded to 24),
  # two features on the widest, weighted sum.
  "mixed_dims": _case(
    2,
    1,
    2,
    [_table("n", 40, "sum"), _table("w", 70, "sum", dim=24), _table("m", 30, "sum", dim=12)],
    [
      _feature("fn", "n", 8, 3, "ragged"),
      _feature("fw", "w", 8, 4, "dense"),
      _feature("fm", "m", 16, 2, "list"),
      _feature("fw2", "w", 8, 2, "ragged"),
    ],
    mode="explicit",
    groups=[["w", "n", "m"]],
    rotation=1,
    weighted=True,
    skew=2.0,
    seed=21,
  ),
  # The sort-key width paths of coo_sort (key = p | e | low per SC, see its
  # docstring). Vocabulary 2**30 with skew 8 spreads ids over all 30 bits
  # (the largest drawn id is >= 2**29, so e fills every bit of its field)
  # and still repeats id 0 inside samples (merged duplicates). Each
  # case's path is asserted by tests/test_coo_golden.py (_SORT_PATHS),
  # observed with coo_cases.record_sort_paths().
  # Path (1): one unweighted feature, N=8, L*S=2, 2 samples per SC:
  # e 27 + sid 1 + p 3 = 31 bits, uint32 keys (valency 24: more ids per SC).
  "wide_uint32_boundary": _case(
    4,
    1,
    2,
    [_table("t", 2**30, "sqrtn")],
    [_feature("f", "t", 16, 24, "ragged")],
    skew=8.0,
    seed=13,
  ),
  # Path (2), at its limit: N=4, L*S=4, 4 samples per SC: e 28 + sid 2 +
  # p 2 = exactly 32 bits, so uint32 keys with every bit used.
  "wide_narrow": _case(
    2,
    2,
    2,
    [_table("t", 2**30, "mean")],
    [_feature("f", "t", 16, 8, "columnar")],
    skew=8.0,
    seed=18,
  ),
  # Path (3): N=8, L*S=4, 5 samples per SC: e 27 + sid 3 + p 3 = 33 bits,
  # uint64 keys; unweighted sum (gains from merge counts), int64 ragged input.
  "wide_uint64_single": _case(
    4, 2, 2, [_table("t", 2**30, "sum")], [_feature("f", "t", 40, 8, "ragged64")], skew=8.0, seed=13
  ),
  # Multi-feature stack with uint64 keys: two large tables stacked with
  # rotation 5 (stack vocabulary 7 * 2**27), three features, 7 samples per
  # SC: e 27 + sid 3 + p 3 = 33 bits.
  "wide_uint64_stacked": _case(
    2,
    1,
    4,
    [_table("a", 2**29, "mean"), _table("b", 3 * 2**27, "mean")],
    [
      _feature("fa", "a", 24, 6, "ragged"),
      _feature("fb", "b", 16, 5, "list"),
      _feature("fa2", "a", 16, 4, "columnar"),
    ],
    mode="explicit",
    groups=[["a", "b"]],
    rotation=5,
    skew=8.0,
    seed=14,
  ),
  # Weighted (position keys) with uint64 keys: e 28 + position 7 + p 2 =
  # 37 bits; sqrtn with id dropping under small limits.
  "wide_uint64_weighted_dropping": _case(
    2,
    2,
    2,
    [_table("t", 2**30, "sqrtn", max_ids=4, max_unique=3)],
    [_feature("f", "t", 16, 8, "ragged")],
    weighted=True,
    drop=True,
    skew=8.0,
    seed=15,
  ),
}


def main(names: list[str]) -> None:
  """Writes the fixtures of `names` (all cases when empty)."""
  unknown = sorted(set(names) - set(CASES))
  if unknown:
    raise SystemExit(f"unknown cases {unknown}; known: {sorted(CASES)}")
  out_dir = os.path.dirname(os.path.abspath(__file__))
  for name, case in CASES.items():
    if names and name not in names:
      continue
    raw = coo_cases.draw_raw(case)
    ours, ours_w, ref, ref_w = coo_cases.as_inputs(case, raw)
    expected = coo_cases.sanitize(case, coo_cases.run_reference(case, ref, ref_w))
    with coo_cases.record_sort_paths() as paths:
      coo_cases.run_case(case, ours, ours_w)
    arrays = {"case": np.array(json.dumps(case, sort_keys=True))}
    for feature, (ids, lengths, weights) in raw.items():
      arrays[f"raw/{feature}/ids"] = ids
      arrays[f"raw/{feature}/lengths"] = lengths
      arrays[f"raw/{feature}/weights"] = weights
    for key, value in expected.items():
      arrays[f"expected/{key}"] = value
    path = os.path.join(out_dir, f"coo_{name}.npz")
    np.savez_compressed(path, **arrays)
    drops = {k: int(v) for k, v in expected.items() if k.startswith("id_drop")}
    print(
      f"wrote {path} ({os.path.getsize(path)} bytes), drops {drops},"
      f" sort paths {sorted(set(paths))}"
    )


if __name__ == "__main__":
  main(sys.argv[1:])

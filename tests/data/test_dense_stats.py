"""Dense columns: statistics in the manifest, the `auto` transform, scale warnings, and
rows to score transformed as the training data was."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest

import paths
from sparsepipe.data import DenseStats
from sparsepipe.data import concat_batches
from sparsepipe.data import convert_criteo
from sparsepipe.data import convert_csv
from sparsepipe.data import convert_parquet
from sparsepipe.data import decode_batch
from sparsepipe.data import manifest_source
from sparsepipe.data import scale_warnings
from sparsepipe.data.convert.raw_rows import examples_from_rows

ENV = {**os.environ, "PYTHONPATH": paths.REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}

# ts: raw timestamps (>= 0, about 1e9); age: small, one missing; neg: large with negatives.
CSV = """y,ts,age,neg,item
1,968035345,25,-500,a
0,976203603,,200,b
1,966536874,18,-300,a
0,957782527,50,100,c
"""
COLUMNS = dict(label_column="y", dense_columns=["ts", "age", "neg"], sparse_columns=["item"])
TS = [968035345, 976203603, 966536874, 957782527]
F32_LOG1P_TS = [float(np.float32(math.log1p(t))) for t in TS]
NEG_WARNING = (
  "dense column 'neg' is stored with values up to 500 in magnitude (mean -125, std 286.1,"
  " transform none): inputs past 100 swamp the model; scale the column to about [-10, 10]"
  " before converting (log1p would clamp its negative values to 0)"
)


def _read_all(manifest):
  source = manifest_source(manifest)
  return concat_batches([decode_batch(source[i], manifest.schema) for i in range(len(source))])


def _csv(tmp_path):
  path = tmp_path / "t.csv"
  path.write_text(CSV)
  return str(path)


def test_auto_takes_log1p_of_large_non_negative_columns_only(tmp_path):
  m = convert_csv([_csv(tmp_path)], str(tmp_path / "out"), **COLUMNS)
  assert m.info["dense_transform"] == {"ts": "log1p", "age": "none", "neg": "none"}
  ex = _read_all(m)
  np.testing.assert_array_equal(ex.dense[:, 0], np.float32(F32_LOG1P_TS))
  np.testing.assert_array_equal(ex.dense[:, 1], [25, 0, 18, 50])
  np.testing.assert_array_equal(ex.dense[:, 2], [-500, 200, -300, 100])


def test_the_manifest_records_each_dense_columns_statistics_exactly(tmp_path):
  m = convert_csv([_csv(tmp_path)], str(tmp_path / "out"), **COLUMNS)
  stats = m.info["dense_stats"]
  assert stats["age"] == {
    "transform": "none",
    "count": 4,
    "missing": 1,
    "min": 0.0,
    "max": 50.0,
    "mean": 23.25,
    "std": pytest.approx(math.sqrt(321.6875), rel=1e-15),
  }
  assert stats["neg"] == {
    "transform": "none",
    "count": 4,
    "missing": 0,
    "min": -500.0,
    "max": 200.0,
    "mean": -125.0,
    "std": pytest.approx(math.sqrt(81875.0), rel=1e-15),
  }
  ts = stats["ts"]
  assert (ts["transform"], ts["count"], ts["missing"]) == ("log1p", 4, 0)
  assert (ts["min"], ts["max"]) == (min(F32_LOG1P_TS), max(F32_LOG1P_TS))
  assert ts["mean"] == pytest.approx(np.mean(F32_LOG1P_TS), rel=1e-15)
  assert ts["std"] == pytest.approx(np.std(F32_LOG1P_TS), rel=1e-9)


def test_batches_merge_to_the_statistics_of_all_values():
  rng = np.random.default_rng(0)
  x = rng.normal(1e6, 3.0, size=(1000, 2))
  stats = DenseStats(["a", "b"])
  for start in range(0, 1000, 7):
    stats.add(x[start : start + 7], [1, 0])
  for j in range(2):
    s = stats.column(j)
    assert (s["count"], s["min"], s["max"]) == (1000, x[:, j].min(), x[:, j].max())
    assert s["mean"] == pytest.approx(x[:, j].mean(), rel=1e-15)
    assert s["std"] == pytest.approx(x[:, j].std(), rel=1e-9)
  assert stats.missing.tolist() == [143, 0]


def test_scale_warnings_name_the_column_and_the_flag(tmp_path):
  auto = convert_csv([_csv(tmp_path)], str(tmp_path / "auto"), **COLUMNS)
  assert scale_warnings(auto.info) == [NEG_WARNING]
  raw = convert_csv([_csv(tmp_path)], str(tmp_path / "raw"), **COLUMNS, dense_transform="none")
  assert scale_warnings(raw.info) == [
    "dense column 'ts' is stored with values up to 9.762e+08 in magnitude (mean 9.671e+08, std"
    " 6.536e+06, transform none): inputs past 100 swamp the model; convert with"
    " --dense_transform log1p (or auto) to store log(1 + x)",
    NEG_WARNING,
  ]
  # Datasets of 0.3 record no statistics: no warning, no error.
  assert scale_warnings({"dense_transform": "none"}) == []
  # A column past 100 after log1p (raw values past e^100, e.g. a 1e60 sentinel) was
  # told to convert with log1p, the transform it had.
  logged = {"transform": "log1p", "min": 0.6931, "max": 138.2, "mean": 69.42, "std": 68.73}
  assert scale_warnings({"dense_stats": {"a": logged}}) == [
    "dense column 'a' is stored with values up to 138.2 in magnitude (mean 69.42, std 68.73,"
    " transform log1p): inputs past 100 swamp the model; log1p is applied already, so its raw"
    " values reach e^138.2: clip or drop such values before converting"
  ]


def test_the_command_warns_on_stderr(tmp_path):
  out = subprocess.run(
    [sys.executable, "-m", "sparsepipe.data.csv", "--input", _csv(tmp_path)]
    + ["--output", str(tmp_path / "out"), "--label_column", "y"]
    + ["--dense_columns", "ts,age,neg", "--sparse_columns", "item"],
    capture_output=True,
    text=True,
    env=ENV,
    check=False,
    timeout=120,
  )
  assert out.returncode == 0, out.stderr
  assert out.stderr.splitlines()[-1] == f"warning: {NEG_WARNING}"


def test_rows_to_score_get_the_transform_of_each_column(tmp_path):
  m = convert_csv([_csv(tmp_path)], str(tmp_path / "out"), **COLUMNS)
  rows = [{"ts": "968035345", "age": "25", "neg": "-500", "item": "a"}]
  batch = examples_from_rows(m.info, m.schema, rows)
  np.testing.assert_array_equal(batch.dense, np.float32([[F32_LOG1P_TS[0], 25, -500]]))
  np.testing.assert_array_equal(batch.sparse["item"].values, _read_all(m).sparse["item"].values[:1])


def test_a_dataset_of_0_3_scores_rows_as_before(tmp_path):
  # A 0.3 manifest's info: one transform for all columns and a list of sizes.
  m = convert_csv([_csv(tmp_path)], str(tmp_path / "out"), **COLUMNS, dense_transform="none")
  info = {**m.info, "dense_transform": "none", "vocab_sizes": ["1000000"]}
  del info["dense_stats"], info["vocab_sizing"]
  rows = [{"ts": "968035345", "age": "", "neg": "-500", "item": "a"}]
  batch = examples_from_rows(info, m.schema, rows)
  np.testing.assert_array_equal(batch.dense, np.float32([[968035345, 0, -500]]))
  info["dense_transform"] = "log1p"
  batch = examples_from_rows(info, m.schema, rows)
  np.testing.assert_array_equal(batch.dense, np.float32([[math.log1p(968035345), 0, 0]]))


def test_parquet_records_the_same_statistics(tmp_path):
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  table = pa.table(
    {
      "y": [1, 0, 1, 0],
      "ts": TS,
      "age": pa.array([25.0, None, 18.0, 50.0]),
      "neg": [-500, 200, -300, 100],
      "item": list("abac"),
    }
  )
  path = str(tmp_path / "t.parquet")
  pq.write_table(table, path)
  m = convert_parquet([path], str(tmp_path / "out"), **COLUMNS)
  c = convert_csv([_csv(tmp_path)], str(tmp_path / "csv"), **COLUMNS)
  assert m.info["dense_transform"] == c.info["dense_transform"]
  assert m.info["dense_stats"] == c.info["dense_stats"]


def test_criteo_records_its_log1p_columns_statistics(tmp_path):
  lines = [["0", "", "-1", *["3"] * 11, *["ab"] * 26], ["1", "7", "5", *["3"] * 11, *["cd"] * 26]]
  path = tmp_path / "day_0.tsv"
  path.write_text("".join("\t".join(f) + "\n" for f in lines))
  m = convert_criteo([str(path)], str(tmp_path / "out"), vocab_sizes=100)
  i1, i2 = m.info["dense_stats"]["I1"], m.info["dense_stats"]["I2"]
  log8 = float(np.float32(math.log1p(7)))
  assert i1 == {
    "transform": "log1p",
    "count": 2,
    "missing": 1,
    "min": 0.0,
    "max": log8,
    "mean": log8 / 2,
    "std": log8 / 2,
  }
  assert (i2["missing"], i2["min"], i2["max"]) == (0, 0.0, float(np.float32(math.log1p(5))))

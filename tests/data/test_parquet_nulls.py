"""Parquet columns null in every row: a warning per file, an error over all inputs.

Null dense values become 0.0 and null sparse values no id, so such a
column used to convert silently into a constant or an empty feature.
"""

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparsepipe.data import convert_parquet
from sparsepipe.data import manifest_source

import paths  # pylint: disable=g-bad-import-order

_NULLS = pa.array([None] * 4, pa.float64())


def _write(path, **columns):
  pq.write_table(pa.table(columns), path)
  return str(path)


def test_a_column_null_in_one_file_is_a_warning_naming_column_and_file(tmp_path, capsys):
  a = _write(tmp_path / "a.parquet", y=[0, 1, 0, 1], d=_NULLS, c=["x", None, "z", "w"])
  b = _write(tmp_path / "b.parquet", y=[1, 1], d=[2.0, 3.0], c=pa.array([None, None], pa.string()))
  m = convert_parquet(
    [a, b], str(tmp_path / "out"), label_column="y", dense_columns=["d"], sparse_columns=["c"]
  )
  assert m.num_examples == 6 and len(manifest_source(m)) > 0
  assert capsys.readouterr().err.splitlines() == [
    f"warning: dense column 'd' is null in all 4 rows of '{a}' (converted as the constant"
    " 0.0 there)",
    f"warning: sparse column 'c' is null in all 2 rows of '{b}' (converted as a feature"
    " with no id in any example there)",
  ]


@pytest.mark.parametrize("role", ["dense", "sparse"])
def test_a_column_null_in_every_file_is_refused_and_nothing_is_written(tmp_path, role):
  nulls = _NULLS if role == "dense" else pa.array([None] * 4, pa.string())
  a = _write(tmp_path / "a.parquet", y=[0, 1, 0, 1], n=nulls)
  b = _write(tmp_path / "b.parquet", y=[0, 1, 0, 1], n=nulls)
  becomes = "the constant 0.0" if role == "dense" else "a feature with no id in any example"
  with pytest.raises(ValueError) as raised:
    convert_parquet([a, b], str(tmp_path / "out"), label_column="y", **{f"{role}_columns": ["n"]})
  assert str(raised.value) == (
    f"{role} column 'n' is null in all 8 rows of the 2 input file(s) ('{a}', '{b}'): it"
    f" would be {becomes}; check the input, or leave the column out of {role}_columns"
    f" (--{role}_columns)"
  )
  assert sorted(os.listdir(tmp_path)) == ["a.parquet", "b.parquet"]


def test_the_command_refuses_an_all_null_column_in_one_line(tmp_path):
  a = _write(tmp_path / "a.parquet", y=np.array([0, 1, 0, 1]), d=_NULLS)
  out = subprocess.run(
    [sys.executable, "-m", "sparsepipe.data.parquet", f"--input={a}"]
    + [f"--output={tmp_path / 'out'}", "--label_column=y", "--dense_columns=d"],
    capture_output=True,
    text=True,
    env={**os.environ, "PYTHONPATH": paths.REPO_ROOT},
    timeout=120,
  )
  lines = out.stderr.splitlines()
  assert (out.returncode, lines[-1]) == (
    1,
    f"error: dense column 'd' is null in all 4 rows of the 1 input file(s) ('{a}'): it would"
    " be the constant 0.0; check the input, or leave the column out of dense_columns"
    " (--dense_columns)",
  )
  assert [x for x in lines[:-1] if not x.startswith("parquet: ")] == []  # progress lines
  assert not (tmp_path / "out").exists()

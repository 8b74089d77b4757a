"""Vocabularies sized from the data by default: exact sizes, ids, manifest and output."""

import hashlib
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import paths
from sparsepipe.data import concat_batches
from sparsepipe.data import convert_criteo
from sparsepipe.data import convert_csv
from sparsepipe.data import convert_parquet
from sparsepipe.data import decode_batch
from sparsepipe.data import manifest_source
from sparsepipe.data.convert.vocab_sizing import DistinctCounter
from sparsepipe.data.convert.vocab_sizing import data_vocab_size
from sparsepipe.data.convert.vocab_sizing import integer_vocab_size

ENV = {**os.environ, "PYTHONPATH": paths.REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}

# user: integer ids up to 6040; item: 5 distinct strings; tags: 4 distinct pieces.
CSV = """y,user,item,tags
1,6040,a,x|y
0,3,b,y|z
1,17,c,
0,3,d,w
1,99,e,x
0,5,a,
"""
COLUMNS = dict(
  label_column="y",
  sparse_columns=["user", "item", "tags"],
  multivalent_columns=["tags"],
  integer_id_columns=["user"],
)
SIZING = {
  "user": {"vocab_size": 8192, "from": "ids", "largest_id": 6040},
  "item": {"vocab_size": 32, "from": "data", "distinct": 5},
  "tags": {"vocab_size": 16, "from": "data", "distinct": 4},
}


def _h(text, vocab, reserved=0):
  digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
  return reserved + int.from_bytes(digest, "little") % (vocab - reserved)


def _read_all(manifest):
  source = manifest_source(manifest)
  return concat_batches([decode_batch(source[i], manifest.schema) for i in range(len(source))])


def _sizes(manifest):
  return {f.name: f.vocab_size for f in manifest.schema.sparse}


@pytest.mark.parametrize(
  "distinct, reserved, size",
  [(0, 0, 8), (1, 0, 8), (2, 0, 8), (3, 0, 16), (5, 0, 32), (3706, 0, 16384), (2, 1, 16)]
  + [(262_144, 0, 1 << 20), (262_145, 0, 1 << 20), (10**7, 0, 1 << 20)],
)
def test_data_vocab_size_is_4x_the_distinct_values_a_power_of_two_capped(distinct, reserved, size):
  assert data_vocab_size(distinct, reserved=reserved) == size


def test_integer_id_columns_hold_their_largest_id_uncapped():
  assert [integer_vocab_size("u", n) for n in (0, 7, 8, 6040, 1 << 20, 3_000_000)] == [
    8,
    8,
    16,
    8192,
    1 << 21,
    1 << 22,
  ]
  with pytest.raises(ValueError, match=r"^integer id column 'u': its largest id 2147483647"):
    integer_vocab_size("u", 2**31 - 1)


def test_distinct_counter_is_exact_and_stops_past_its_limit():
  counter = DistinctCounter(limit=100_000)
  for start in range(0, 90_000, 30_000):  # three chunks of 30k, overlapping by 10k
    counter.add(str(i) for i in range(start, start + 40_000))
  assert (counter.count, counter.saturated) == (100_000, False)
  small = DistinctCounter(limit=3)
  small.add(["a", "b", "a", "c", "d", "e"])
  assert (small.count, small.saturated) == (4, True)


def test_csv_vocabularies_come_from_the_data_and_the_ids_follow(tmp_path):
  path = tmp_path / "t.csv"
  path.write_text(CSV)
  m = convert_csv([str(path)], str(tmp_path / "out"), **COLUMNS)
  assert _sizes(m) == {"user": 8192, "item": 32, "tags": 16}
  assert m.info["vocab_sizing"] == SIZING
  assert m.info["vocab_sizes"] == {"user": 8192, "item": 32, "tags": 16}
  ex = _read_all(m)
  np.testing.assert_array_equal(ex.sparse["user"].values, [6040, 3, 17, 3, 99, 5])
  np.testing.assert_array_equal(ex.sparse["item"].values, [_h(v, 32) for v in "abcdea"])
  tags = ["x", "y", "y", "z", "w", "x"]
  np.testing.assert_array_equal(ex.sparse["tags"].values, [_h(v, 16) for v in tags])
  # Entries given keep their size; the others still come from the data.
  m = convert_csv(
    [str(path)], str(tmp_path / "o2"), **COLUMNS, vocab_sizes=["item=1000"], overwrite=True
  )
  assert _sizes(m) == {"user": 8192, "item": 1000, "tags": 16}
  assert m.info["vocab_sizing"]["item"] == {"vocab_size": 1000, "from": "flag"}
  m = convert_csv([str(path)], str(tmp_path / "o3"), **COLUMNS, vocab_sizes=["1000000"])
  assert _sizes(m) == {"user": 1_000_000, "item": 1_000_000, "tags": 1_000_000}


def test_parquet_sizes_its_vocabularies_as_csv_does(tmp_path):
  table = {
    "y": pa.array([1, 0, 1, 0, 1, 0]),
    "user": pa.array([6040, 3, 17, 3, 99, 5]),
    "item": pa.array(list("abcdea")).dictionary_encode(),
    "tags": pa.array([["x", "y"], ["y", "z"], None, ["w"], ["x"], []]),
  }
  path = str(tmp_path / "t.parquet")
  pq.write_table(pa.table(table), path)
  columns = {k: v for k, v in COLUMNS.items() if k != "multivalent_columns"}
  m = convert_parquet([path], str(tmp_path / "out"), **columns)
  assert m.info["vocab_sizing"] == SIZING
  ex = _read_all(m)
  np.testing.assert_array_equal(ex.sparse["item"].values, [_h(v, 32) for v in "abcdea"])


CRITEO_LINES = [
  ["0", *[""] * 13, "05db9164", "08d6d899", *[""] * 24],
  ["1", *["1"] * 13, "68fd1e64", "08d6d899", *[""] * 24],
  ["0", *[""] * 13, "05db9164", "", *[""] * 24],
]


@pytest.mark.parametrize("empty_category, c1_vocab, reserved", [("drop", 8, 0), ("reserve", 16, 1)])
def test_criteo_vocabularies_come_from_the_data(tmp_path, empty_category, c1_vocab, reserved):
  path = tmp_path / "day_0.tsv"
  path.write_text("".join("\t".join(f) + "\n" for f in CRITEO_LINES))
  m = convert_criteo([str(path)], str(tmp_path / "out"), empty_category=empty_category)
  sizes = _sizes(m)
  # C1 has 2 distinct values, C2 1, C3..C26 none (the reserved id 0 counts as one more).
  assert (sizes["C1"], sizes["C2"], sizes["C3"]) == (c1_vocab, 8, 8)
  assert m.info["vocab_sizing"]["C1"] == {"vocab_size": c1_vocab, "from": "data", "distinct": 2}
  ex = _read_all(m)
  want = [_h(v, c1_vocab, reserved) for v in ("05db9164", "68fd1e64", "05db9164")]
  np.testing.assert_array_equal(ex.sparse["C1"].values, want)


def test_the_command_says_which_vocabularies_it_sized(tmp_path):
  path = tmp_path / "t.csv"
  path.write_text(CSV)
  out = subprocess.run(
    [sys.executable, "-m", "sparsepipe.data.csv", "--input", str(path)]
    + ["--output", str(tmp_path / "out"), "--label_column", "y"]
    + ["--sparse_columns", "user,item,tags", "--multivalent_columns", "tags"]
    + ["--integer_id_columns", "user", "--vocab_sizes", "item=1000"],
    capture_output=True,
    text=True,
    env=ENV,
    check=False,
    timeout=120,
  )
  assert out.returncode == 0, out.stderr
  assert out.stdout.splitlines()[1:] == [
    "vocabulary sizes from the data (4x the distinct values, rounded up to a power of two, at"
    " most 1,048,576; --vocab_sizes to choose them):",
    "  feature 'user': integer ids up to 6,040 -> vocab 8,192",
    "  feature 'item': vocab 1,000 (--vocab_sizes)",
    "  feature 'tags': 4 distinct values -> vocab 16",
  ]

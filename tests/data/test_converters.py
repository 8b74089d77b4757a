"""Criteo and CSV converters on a few embedded lines of the real formats."""

import paths
import gzip
import hashlib
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from sparsepipe.data import InputFormatError
from sparsepipe.data import concat_batches
from sparsepipe.data import convert_criteo
from sparsepipe.data import convert_csv
from sparsepipe.data import decode_batch
from sparsepipe.data import manifest_source
from sparsepipe.data import stable_hash64

# Three lines of the Criteo click logs (tab-separated, empty fields kept).
CRITEO_FIELDS = [
  "0,,3,260.0,,17668.0,,,33.0,,,,0.0,,05db9164,08d6d899,9143c832,f56b7dd5,25c83c98,7e0ccccf,df5c2d18,0b153874,a73ee510,8f48ce11,a7b606c4,ae1bb660,eae197fd,b28479f6,bfef54b3,bad5ee18,e5ba7672,87c6f83c,,,0429f84b,,3a171ecb,c0d61a5c,,",
  "1,,-1,19.0,35.0,30251.0,247.0,1.0,35.0,160.0,,1.0,,35.0,68fd1e64,04e09220,95e13fd4,a1e6a194,25c83c98,fe6b92e5,f819e175,062b5529,a73ee510,ab9456b4,6153cf57,8882c6cd,769a1844,b28479f6,69f825dd,23056e4f,d4bb7bd8,6fc84bfb,,,5155d8a3,,be7c41b4,ded4aac9,,",
  "0,0.0,0,2.0,12.0,2013.0,164.0,6.0,35.0,523.0,0.0,3.0,,18.0,05db9164,38a947a1,3f55fb72,5de245c7,30903e74,7e0ccccf,b72ec13d,1f89b562,a73ee510,acce978c,3547565f,a5b0521a,12880350,b28479f6,c12fc269,95a8919c,e5ba7672,675c9258,,,2e01979f,,bcdee96c,6d5d1302,,",
]
CRITEO_TSV = "".join(line.replace(",", "\t") + "\n" for line in CRITEO_FIELDS)
CRITEO_CSV_WITH_HEADER = (
  "label,"
  + ",".join(f"I{i}" for i in range(1, 14))
  + ","
  + ",".join(f"C{i}" for i in range(1, 27))
  + "\n"
  + "".join(line + "\n" for line in CRITEO_FIELDS)
)

MOVIELENS = """user_id,movie_id,rating,timestamp,title,genres,gender,age,occupation,zip
3299,235,4,968035345,Ed Wood (1994),Comedy|Drama,F,25,4,19119
517,105,4,976203603,"Bridges of Madison County, The (1995)",Drama|Romance,F,25,14,55408
3630,3256,3,966536874,Patriot Games (1992),Action|Thriller,M,18,4,77005
5848,909,5,957782527,"Apartment, The (1960)",,M,50,20,20009
"""

AVAZU = """id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,app_category,device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21
1000009418151094273,0,14102100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,07d7df22,a99f214a,ddd2926e,44956a24,1,2,15706,320,50,1722,0,35,-1,79
10000169349117863715,1,14102100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,07d7df22,a99f214a,96809ac8,711ee120,1,0,15704,320,50,1722,0,35,100084,79
"""


def _h(text, vocab, reserved=0):
  digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
  return reserved + int.from_bytes(digest, "little") % (vocab - reserved)


def _read_all(manifest):
  source = manifest_source(manifest)
  return concat_batches([decode_batch(source[i], manifest.schema) for i in range(len(source))])


def test_stable_hash_is_pinned():
  # Literal values: a change of hash function would silently remap every id.
  assert stable_hash64("05db9164") == 4582638078171527438
  assert stable_hash64("Comedy") == 8315559345618375674


@pytest.mark.parametrize("empty_category", ["drop", "reserve"])
def test_criteo_tsv_exact_values(tmp_path, empty_category):
  path = tmp_path / "day_0.tsv"
  path.write_text(CRITEO_TSV)
  m = convert_criteo(
    [str(path)],
    str(tmp_path / "out"),
    vocab_sizes=1000,
    empty_category=empty_category,
    examples_per_record=2,
  )
  assert m.num_examples == 3 and m.num_records == 2
  assert m.schema.dense_names[0] == "I1" and m.schema.feature_names[-1] == "C26"
  ex = _read_all(m)
  np.testing.assert_array_equal(ex.labels, np.float32([0, 1, 0]))
  f = np.float32
  np.testing.assert_array_equal(
    ex.dense[0],
    [
      0,
      f(math.log1p(3)),
      f(math.log1p(260)),
      0,
      f(math.log1p(17668)),
      0,
      0,
      f(math.log1p(33)),
      0,
      0,
      0,
      0,
      0,
    ],
  )
  assert ex.dense[1][1] == 0.0  # I2 = -1 -> log(1 + max(-1, 0)) = 0
  reserved = 1 if empty_category == "reserve" else 0
  c1 = ex.sparse["C1"]
  np.testing.assert_array_equal(
    c1.values,
    [
      _h("05db9164", 1000, reserved),
      _h("68fd1e64", 1000, reserved),
      _h("05db9164", 1000, reserved),
    ],
  )
  if empty_category == "drop":
    assert c1.values[0] == 438  # pinned
  np.testing.assert_array_equal(c1.row_lengths, [1, 1, 1])
  c19 = ex.sparse["C19"]  # empty in every line
  if empty_category == "drop":
    np.testing.assert_array_equal(c19.row_lengths, [0, 0, 0])
    assert c19.values.size == 0
  else:
    np.testing.assert_array_equal(c19.row_lengths, [1, 1, 1])
    np.testing.assert_array_equal(c19.values, [0, 0, 0])
  np.testing.assert_array_equal(
    ex.sparse["C21"].values, [_h(v, 1000, reserved) for v in ("0429f84b", "5155d8a3", "2e01979f")]
  )


def test_criteo_comma_with_header_and_gzip_equals_tsv(tmp_path):
  (tmp_path / "a.tsv").write_text(CRITEO_TSV)
  with gzip.open(tmp_path / "b.csv.gz", "wt") as f:
    f.write(CRITEO_CSV_WITH_HEADER)
  a = _read_all(convert_criteo([str(tmp_path / "a.tsv")], str(tmp_path / "A"), vocab_sizes=77))
  b = _read_all(convert_criteo([str(tmp_path / "b.csv.gz")], str(tmp_path / "B"), vocab_sizes=77))
  np.testing.assert_array_equal(a.dense, b.dense)
  for name in a.sparse:
    np.testing.assert_array_equal(a.sparse[name].values, b.sparse[name].values)


@pytest.mark.parametrize(
  "line, message",
  [
    ("1\t2\t3", r"'.*bad.tsv' line 2: expected 40 fields, got 3"),
    (
      CRITEO_FIELDS[0].replace(",", "\t").replace("260.0", "abc"),
      r"line 2: column I3 value 'abc' is not a number",
    ),
    (
      "\t" + CRITEO_FIELDS[0].replace(",", "\t").split("\t", 1)[1],
      r"line 2: the label field is empty",
    ),
  ],
)
def test_criteo_bad_lines(tmp_path, line, message):
  path = tmp_path / "bad.tsv"
  path.write_text(CRITEO_TSV.splitlines()[0] + "\n" + line + "\n")
  with pytest.raises(InputFormatError, match=message):
    convert_criteo([str(path)], str(tmp_path / "out"))
  assert not os.path.exists(tmp_path / "out" / "manifest.json")


def test_csv_movielens_multivalent(tmp_path):
  path = tmp_path / "ratings.csv"
  path.write_text(MOVIELENS)
  m = convert_csv(
    [str(path)],
    str(tmp_path / "out"),
    label_column="rating",
    label_threshold=4.0,
    dense_columns=["age", "timestamp"],
    dense_transform="none",
    sparse_columns=["user_id", "movie_id", "genres", "gender", "title"],
    multivalent_columns=["genres"],
    separator="|",
    integer_id_columns=["user_id", "movie_id"],
    vocab_sizes=["1000", "user_id=6041", "movie_id=3953"],
    examples_per_record=3,
  )
  assert m.num_examples == 4 and m.num_records == 2
  assert m.schema.label_name == "rating" and m.schema.dense_names == ("age", "timestamp")
  assert [(f.name, f.vocab_size) for f in m.schema.sparse] == [
    ("user_id", 6041),
    ("movie_id", 3953),
    ("genres", 1000),
    ("gender", 1000),
    ("title", 1000),
  ]
  ex = _read_all(m)
  np.testing.assert_array_equal(ex.labels, np.float32([1, 1, 0, 1]))
  np.testing.assert_array_equal(
    ex.dense, np.float32([[25, 968035345], [25, 976203603], [18, 966536874], [50, 957782527]])
  )
  np.testing.assert_array_equal(ex.sparse["user_id"].values, [3299, 517, 3630, 5848])
  np.testing.assert_array_equal(ex.sparse["movie_id"].values, [235, 105, 3256, 909])
  genres = ex.sparse["genres"]
  np.testing.assert_array_equal(genres.row_lengths, [2, 2, 2, 0])  # empty field -> empty row
  np.testing.assert_array_equal(
    genres.values,
    [_h(g, 1000) for g in ("Comedy", "Drama", "Drama", "Romance", "Action", "Thriller")],
  )
  assert genres.values[0] == 674  # pinned
  np.testing.assert_array_equal(
    ex.sparse["gender"].values, [_h("F", 1000), _h("F", 1000), _h("M", 1000), _h("M", 1000)]
  )
  # A quoted title with a comma is one value.
  assert ex.sparse["title"].values[1] == _h("Bridges of Madison County, The (1995)", 1000)


def test_csv_avazu_all_categorical(tmp_path):
  path = tmp_path / "avazu.csv"
  path.write_text(AVAZU)
  cols = AVAZU.splitlines()[0].split(",")[2:]
  m = convert_csv(
    [str(path)],
    str(tmp_path / "out"),
    label_column="click",
    sparse_columns=cols,
    vocab_sizes=[100],
    dense_transform="log1p",
  )
  ex = _read_all(m)
  np.testing.assert_array_equal(ex.labels, [0, 1])
  assert ex.dense.shape == (2, 0) and len(ex.sparse) == 22
  np.testing.assert_array_equal(ex.sparse["C20"].values, [_h("-1", 100), _h("100084", 100)])
  np.testing.assert_array_equal(
    ex.sparse["device_ip"].values, [_h("ddd2926e", 100), _h("96809ac8", 100)]
  )


@pytest.mark.parametrize(
  "content, kwargs, error, message",
  [
    (
      MOVIELENS,
      dict(label_column="stars"),
      ValueError,
      r"^columns \['stars'\] are not in the header of '.*/in.csv' \['user_id', ",
    ),
    (
      MOVIELENS.replace("3299,235", "3299,99999"),
      dict(
        label_column="rating",
        label_threshold=4,
        sparse_columns=["movie_id"],
        integer_id_columns=["movie_id"],
        vocab_sizes=["movie_id=3953"],
      ),
      InputFormatError,
      r"line 2: column movie_id id 99999 out of range \[0, 3953\)",
    ),
    (
      MOVIELENS.replace(",F,25,4", ",F,x,4"),
      dict(label_column="rating", label_threshold=4, dense_columns=["age"]),
      InputFormatError,
      r"line 2: column age value 'x' is not a number",
    ),
    (
      MOVIELENS + "1,2,3\n",
      dict(label_column="rating", label_threshold=4),
      InputFormatError,
      r"line 6: expected 10 fields, got 3",
    ),
    (
      MOVIELENS,
      dict(
        label_column="rating", label_threshold=4, sparse_columns=["zip"], vocab_sizes=["title=5"]
      ),
      ValueError,
      r"vocab size given for 'title', which is not a sparse column",
    ),
    (  # Criteo's per-column list form: the last size once won for every column
      MOVIELENS,
      dict(
        label_column="rating",
        label_threshold=4,
        sparse_columns=["gender", "zip"],
        vocab_sizes=["8", "4096"],
      ),
      ValueError,
      r"^vocab_sizes \(--vocab_sizes\) gives two sizes for every column \(8 and '4096'\):"
      r" give one N, and column=N for the others$",
    ),
    (
      MOVIELENS,
      dict(
        label_column="rating",
        label_threshold=4,
        sparse_columns=["gender", "zip"],
        vocab_sizes=["100", "gender=8", "gender=64"],
      ),
      ValueError,
      r"^vocab_sizes \(--vocab_sizes\) gives 'gender' twice: 'gender=64'$",
    ),
  ],
)
def test_csv_errors(tmp_path, content, kwargs, error, message):
  path = tmp_path / "in.csv"
  path.write_text(content)
  with pytest.raises(error, match=message):
    convert_csv([str(path)], str(tmp_path / "out"), **kwargs)


def test_commands_run_with_summary(tmp_path):
  (tmp_path / "day.tsv").write_text(CRITEO_TSV)
  (tmp_path / "ml.csv").write_text(MOVIELENS)
  root = paths.REPO_ROOT
  env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
  runs = [
    [
      "sparsepipe.data.synthetic",
      "--output",
      str(tmp_path / "s"),
      "--num_examples",
      "50",
      "--num_sparse",
      "3",
      "--vocab_sizes",
      "10",
    ],
    [
      "sparsepipe.data.criteo",
      "--input",
      str(tmp_path / "day.tsv"),
      "--output",
      str(tmp_path / "c"),
      "--vocab_sizes",
      "100",
    ],
    [
      "sparsepipe.data.csv",
      "--input",
      str(tmp_path / "ml.csv"),
      "--output",
      str(tmp_path / "m"),
      "--label_column",
      "rating",
      "--label_threshold",
      "4",
      "--sparse_columns",
      "genres",
      "--multivalent_columns",
      "genres",
    ],
  ]
  for args in runs:
    out = subprocess.run(
      [sys.executable, "-m", *args],
      capture_output=True,
      text=True,
      env=env,
      check=False,
      timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("wrote "), out.stdout
    assert "examples/s" in out.stdout
    assert "RuntimeWarning" not in out.stderr

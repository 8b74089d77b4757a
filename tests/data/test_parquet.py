"""The Parquet converter: exact examples, equality with the CSV converter, every error."""

import paths
import csv
import hashlib
import math
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparsepipe.data import InputFormatError
from sparsepipe.data import concat_batches
from sparsepipe.data import convert_csv
from sparsepipe.data import convert_parquet
from sparsepipe.data import decode_batch
from sparsepipe.data import eval_mask
from sparsepipe.data import manifest_source
from sparsepipe.data import read_manifest
from sparsepipe.launch.config.from_manifest import check_manifests_agree
from sparsepipe.serving.dataset_check import dataset_differences

HINT = r"; map such values to 0/1 with --label_threshold T \(label_threshold=T: 1 if value >= T\)"
STRINGS = pa.list_(pa.string())


def _h(text, vocab):
  digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little") % vocab


def _write(tmp_path, columns, name="in.parquet", **kwargs):
  path = tmp_path / name
  table = columns if isinstance(columns, pa.Table) else pa.table(columns)
  pq.write_table(table, path, **kwargs)
  return str(path)


def _read_all(manifest):
  source = manifest_source(manifest)
  return concat_batches([decode_batch(source[i], manifest.schema) for i in range(len(source))])


def _assert_same(a, b):
  np.testing.assert_array_equal(a.labels, b.labels)
  np.testing.assert_array_equal(a.dense, b.dense)
  assert list(a.sparse) == list(b.sparse)
  for name in a.sparse:
    np.testing.assert_array_equal(a.sparse[name].values, b.sparse[name].values)
    np.testing.assert_array_equal(a.sparse[name].row_lengths, b.sparse[name].row_lengths)


def _ragged(batch, name):
  rb = batch.sparse[name]
  return rb.values.tolist(), rb.row_lengths.tolist()


def test_a_training_job_and_its_data_workers_do_not_import_pyarrow():
  """It cost each of them about 30 MB and 50-90 ms (sparsepipe.data imported
  convert_parquet); `from sparsepipe.data import convert_parquet` still works."""
  probe = (
    "import sys; from sparsepipe.launch.job import run; before = 'pyarrow' in sys.modules;"
    " from sparsepipe.data import convert_parquet; print(before, 'pyarrow' in sys.modules,"
    " convert_parquet.__module__)"
  )
  out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
  assert out.stdout == "False True sparsepipe.data.parquet.convert\n"


def test_scalar_and_list_columns_give_exact_examples(tmp_path):
  path = _write(
    tmp_path,
    {
      "rating": pa.array([5, 3, 4, 1]),
      "age": pa.array([25.0, None, 18.5, 50.0]),
      "uid": pa.array([3, 0, 7, None]),
      "item": pa.array([42, -3, 42, 7]),
      "gender": pa.array(["F", None, "", "M"]),
      "genres": pa.array([["Comedy", "Drama"], None, [], ["Action", None, "", "Drama"]], STRINGS),
      "tags": pa.array([[1, 2], [None, 3], None, []], pa.list_(pa.int64())),
    },
  )
  m = convert_parquet(
    [path],
    str(tmp_path / "out"),
    label_column="rating",
    label_threshold=4,
    dense_columns=["age"],
    sparse_columns=["uid", "item", "gender", "genres", "tags"],
    integer_id_columns=["uid", "tags"],
    vocab_sizes=["1000", "uid=8", "tags=10"],
    examples_per_record=3,
  )
  assert (m.num_examples, m.num_records) == (4, 2)
  assert m.info["converter"] == "sparsepipe.data.parquet" and m.info["inputs"] == [path]
  assert [(f.name, f.vocab_size, f.weighted) for f in m.schema.sparse] == [
    ("uid", 8, False),
    ("item", 1000, False),
    ("gender", 1000, False),
    ("genres", 1000, False),
    ("tags", 10, False),
  ]
  ex = _read_all(m)
  np.testing.assert_array_equal(ex.labels, np.float32([1, 0, 1, 0]))
  np.testing.assert_array_equal(ex.dense, np.float32([[25], [0], [18.5], [50]]))
  assert _ragged(ex, "uid") == ([3, 0, 7], [1, 1, 1, 0])  # null -> no id
  # Integers are hashed as their decimal text, as a CSV file spells them.
  assert _ragged(ex, "item") == ([_h(v, 1000) for v in ("42", "-3", "42", "7")], [1, 1, 1, 1])
  assert _ragged(ex, "gender") == ([_h("F", 1000), _h("M", 1000)], [1, 0, 0, 1])
  genres = [_h(g, 1000) for g in ("Comedy", "Drama", "Action", "Drama")]
  assert _ragged(ex, "genres") == (genres, [2, 0, 0, 2])  # null items and "" skipped
  assert _ragged(ex, "tags") == ([1, 2, 3], [2, 1, 0, 0])


def test_log1p_large_and_fixed_size_lists_and_dictionary_columns(tmp_path):
  genres = [["a", "b"], None, ["c"]]
  path = _write(
    tmp_path,
    {
      "y": pa.array([0.0, 1.0, 0.5], pa.float32()),
      "x": pa.array([-2.0, None, 1e39]),
      "n": pa.array([3, 0, None], pa.int8()),
      "g": pa.array(genres, pa.large_list(pa.large_string())),
      "d": pa.array(["b", None, "a"]).dictionary_encode(),
      "f": pa.array([[1, None], None, [3, 3]], pa.list_(pa.int16(), 2)),
    },
  )
  m = convert_parquet(
    [path],
    str(tmp_path / "out"),
    label_column="y",
    dense_columns=["x", "n"],
    dense_transform="log1p",
    sparse_columns=["g", "d", "f"],
    integer_id_columns=["f"],
    vocab_sizes=50,
    batch_rows=2,
  )
  ex = _read_all(m)
  np.testing.assert_array_equal(ex.labels, np.float32([0, 1, 0.5]))
  # 1e39 is no float32 but log(1 + 1e39) = 89.8 is: fine with log1p.
  f = np.float32
  np.testing.assert_array_equal(ex.dense, [[0, f(math.log1p(3))], [0, 0], [f(math.log1p(1e39)), 0]])
  assert _ragged(ex, "g") == ([_h(v, 50) for v in "abc"], [2, 0, 1])
  assert _ragged(ex, "d") == ([_h("b", 50), _h("a", 50)], [1, 0, 1])
  assert _ragged(ex, "f") == ([1, 3, 3], [1, 0, 2])


def test_weight_columns_follow_their_ids(tmp_path):
  path = _write(
    tmp_path,
    {
      "y": pa.array([1, 0, 1]),
      "g": pa.array([["a", None, "b"], None, ["c"]], STRINGS),
      "gw": pa.array([[0.5, None, 2.0], None, [-1.0]], pa.list_(pa.float32())),
      "u": pa.array([4, None, 6]),
      "uw": pa.array([3, 7, 1]),
    },
  )
  m = convert_parquet(
    [path],
    str(tmp_path / "out"),
    label_column="y",
    sparse_columns=["g", "u"],
    integer_id_columns=["u"],
    weight_columns=["g=gw", "u=uw"],
    vocab_sizes=10,
  )
  assert [f.weighted for f in m.schema.sparse] == [True, True]
  ex = _read_all(m)
  assert _ragged(ex, "g") == ([_h("a", 10), _h("b", 10), _h("c", 10)], [2, 0, 1])
  # The weight of a null item is dropped with it; a row without an id has no weight.
  np.testing.assert_array_equal(ex.sparse["g"].weights, np.float32([0.5, 2.0, -1.0]))
  assert _ragged(ex, "u") == ([4, 6], [1, 0, 1])
  np.testing.assert_array_equal(ex.sparse["u"].weights, np.float32([3, 1]))


def _csv_field(value):
  if value is None:
    return ""
  if isinstance(value, list):
    return "|".join("" if v is None else str(v) for v in value)
  return value  # the csv module writes floats by repr: they read back exactly


def _same_table_as_csv_and_parquet(tmp_path, n=300):
  rng = np.random.default_rng(7)
  words = ["Comedy", "Drama", "Film-Noir", "a, b", 'say "hi"', "", "Ünïcode"]
  table = pa.table(
    {
      "rating": pa.array(rng.integers(1, 6, n)),
      "age": pa.array(
        [None if r < 0.1 else float(x) for r, x in zip(rng.random(n), rng.normal(0, 1e4, n))]
      ),
      "count": pa.array(rng.integers(-5, 10**12, n)),
      "user": pa.array(rng.integers(0, 100, n)),
      "item": pa.array(
        [
          None if r < 0.1 else int(x)
          for r, x in zip(rng.random(n), rng.integers(-(10**15), 10**15, n))
        ]
      ),
      "title": pa.array(
        [
          None if r < 0.1 else words[i]
          for r, i in zip(rng.random(n), rng.integers(0, len(words), n))
        ]
      ),
      "genres": pa.array(
        [
          None
          if r < 0.1
          else [
            None if j == 5 and r < 0.5 else words[j]
            for j in rng.integers(0, len(words), int(r * 5))
          ]
          for r in rng.random(n)
        ],
        STRINGS,
      ),
      "tags": pa.array(
        [[int(t) for t in rng.integers(0, 50, int(r * 4))] for r in rng.random(n)],
        pa.list_(pa.int32()),
      ),
    }
  )
  parquet = _write(tmp_path, table, row_group_size=70)
  path = tmp_path / "in.csv"
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f)
    writer.writerow(table.column_names)
    for row in table.to_pylist():
      writer.writerow([_csv_field(v) for v in row.values()])
  return parquet, str(path)


@pytest.mark.parametrize("transform", ["none", "log1p"])
def test_the_same_table_gives_the_same_datasets_as_csv(tmp_path, transform):
  parquet, csv_path = _same_table_as_csv_and_parquet(tmp_path)
  columns = dict(
    label_column="rating",
    label_threshold=4,
    dense_columns=["age", "count"],
    dense_transform=transform,
    sparse_columns=["user", "item", "title", "genres", "tags"],
    integer_id_columns=["user", "tags"],
    vocab_sizes=["1000", "user=100", "tags=50"],
    eval_fraction=0.2,
    split_seed=3,
  )
  out, manifests = {}, {}
  for kind, convert, extra in [
    ("csv", convert_csv, dict(multivalent_columns=["genres", "tags"])),
    ("pq", convert_parquet, dict(batch_rows=32)),
  ]:
    train = convert(
      [parquet if kind == "pq" else csv_path],
      str(tmp_path / f"{kind}_train"),
      eval_output=str(tmp_path / f"{kind}_eval"),
      **columns,
      **extra,
    )
    manifests[kind] = (train, read_manifest(str(tmp_path / f"{kind}_eval")))
    out[kind] = tuple(_read_all(m) for m in manifests[kind])
  for part in (0, 1):
    _assert_same(out["pq"][part], out["csv"][part])
  # Their manifests say so: a job evaluates either's eval split beside the other's
  # train split, and serving scores either with an export trained on the other
  # (the Parquet manifest named no multivalent columns, and serving compared the
  # converters' names: each refused the pair).
  assert manifests["pq"][0].info["multivalent_columns"] == ["genres", "tags"]
  for train_kind, eval_kind in (("csv", "pq"), ("pq", "csv")):
    train, evaluation = manifests[train_kind][0], manifests[eval_kind][1]
    check_manifests_agree(train, evaluation)
    export = {"info": train.info, "schema": train.schema.to_dict()}
    assert dataset_differences(evaluation, export) == []
  # The split is by the example's index in the input, as sparsepipe.data.split defines.
  assert out["pq"][1].num_examples == int(eval_mask(0, 300, 0.2, 3).sum()) > 0
  assert out["pq"][0].sparse["genres"].values.size > 300


def test_a_directory_is_its_parquet_files_in_path_order(tmp_path):
  data = tmp_path / "data"
  (data / "b=1").mkdir(parents=True)
  _write(data, {"y": [1, 1]}, name="part-00001.parquet")
  _write(data, {"y": [0]}, name="part-00000.parquet")
  _write(data / "b=1", {"y": [0, 1, 0]}, name="part-00000.parquet")
  (data / "_SUCCESS").write_text("")
  (data / ".part-00000.parquet.crc").write_text("not parquet")
  (data / "_metadata.parquet").write_text("not data")
  m = convert_parquet([str(data)], str(tmp_path / "out"), label_column="y")
  np.testing.assert_array_equal(_read_all(m).labels, [0, 1, 0, 0, 1, 1])
  assert m.info["inputs"] == [
    str(data / "b=1" / "part-00000.parquet"),
    str(data / "part-00000.parquet"),
    str(data / "part-00001.parquet"),
  ]
  # A folder and a file in it: before, that file's rows were converted twice.
  with pytest.raises(ValueError) as refused:
    convert_parquet(
      [str(data), str(data / "part-00000.parquet")], str(tmp_path / "o"), label_column="y"
    )
  assert str(refused.value) == (
    f"input '{data / 'part-00000.parquet'}' is given twice: its rows would be converted twice;"
    " give each file once"
  )
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match=r"^'.*empty' holds no .parquet files$"):
    convert_parquet([str(tmp_path / "empty")], str(tmp_path / "out2"), label_column="y")
  with pytest.raises(
    FileNotFoundError, match=r"^\[Errno 2\] No such file or directory: '.*no.pq'$"
  ):
    convert_parquet([str(tmp_path / "no.pq")], str(tmp_path / "out2"), label_column="y")


BASE = {
  "y": pa.array([0, 1, 1]),
  "age": pa.array([1.0, 2.0, 3.0]),
  "title": pa.array(["a", "b", "c"]),
  "g": pa.array([["a"], ["b", "c"], []], STRINGS),
}


@pytest.mark.parametrize(
  "columns, kwargs, message",
  [
    (
      {},
      dict(label_column="stars"),
      r"^'{path}': columns \['stars'\] are not in the schema \['y', 'age', 'title', 'g'\]$",
    ),
    (
      {},
      dict(label_column="y", dense_columns=["age"], sparse_columns=["age"]),
      r"^column 'age' is named twice: as a dense column and as a sparse column"
      r" \(a column takes one role\)$",
    ),
    (
      {},
      dict(label_column="y", dense_columns=["y"]),
      r"^column 'y' is named twice: as the label and as a dense column"
      r" \(a column takes one role\)$",
    ),
    (
      {},
      dict(label_column="y", sparse_columns=["title", "title"]),
      r"^column 'title' is named twice as a sparse column: name it once$",
    ),
    (
      {"s": pa.array([{"a": 1}] * 3)},
      dict(label_column="y", sparse_columns=["s"]),
      r"^'{path}': sparse column 's' has Arrow type struct<a: int64>; it must hold integers or"
      r" strings, or lists of them$",
    ),
    (
      {"s": pa.array([[("k", 1)]] * 3, pa.map_(pa.string(), pa.int64()))},
      dict(label_column="y", sparse_columns=["s"]),
      r"^'{path}': sparse column 's' has Arrow type map<string, int64 \('s'\)>;"
      r" it must hold integers or strings, or lists of them$",
    ),
    (
      {},
      dict(label_column="y", dense_columns=["title"]),
      r"^'{path}': dense column 'title' has Arrow type string; it must hold numbers"
      r" \(integer, floating point or bool\)$",
    ),
    (
      {},
      dict(label_column="title"),
      r"^'{path}': the label column 'title' has Arrow type string; it must hold numbers",
    ),
    (
      {},
      dict(label_column="y", sparse_columns=["g"], integer_id_columns=["g"]),
      r"^'{path}': sparse column 'g' has Arrow type list<element: string>; it must hold integers or"
      r" lists of integers \(--integer_id_columns\)$",
    ),
    (
      {},
      dict(label_column="y", sparse_columns=["g"], weight_columns=["g=age"]),
      r"^'{path}': weight column 'age' has Arrow type double; it must hold lists of numbers"
      r" \(one per value of column g\)$",
    ),
    (
      {},
      dict(label_column="y", sparse_columns=["g"], weight_columns=["g"]),
      r"^weight_columns \(--weight_columns\) entry 'g' is not feature=weight_column$",
    ),
    (
      {},
      dict(label_column="y", sparse_columns=["g"], weight_columns={"title": "age"}),
      r"^weight columns given for \['title'\], which are not among the sparse columns \['g'\]$",
    ),
    (
      {},
      dict(label_column="y", sparse_columns=["title"], integer_id_columns=["g"]),
      r"^integer id columns \['g'\] are not among the sparse columns \['title'\]$",
    ),
  ],
)
def test_columns_that_cannot_be_used_are_named_with_their_type(tmp_path, columns, kwargs, message):
  path = _write(tmp_path, {**BASE, **columns})
  with pytest.raises(ValueError, match=message.replace("{path}", ".*in.parquet")):
    convert_parquet([path], str(tmp_path / "out"), **kwargs)
  assert not os.path.exists(tmp_path / "out")


def test_a_column_twice_in_the_file_schema(tmp_path):
  table = pa.Table.from_arrays([pa.array([1]), pa.array([2]), pa.array([3])], ["y", "i", "i"])
  path = _write(tmp_path, table)
  with pytest.raises(
    ValueError, match=r"^'.*in.parquet': the schema names column 'i' 2 times \(fields \[2, 3\]\)$"
  ):
    convert_parquet([path], str(tmp_path / "out"), label_column="y", sparse_columns=["i"])


@pytest.mark.parametrize(
  "column, values, message",
  [
    (
      "age",
      [1.0, 2.0, 3.0, 4.0, 5.0, 1e39],
      r"row 5: column age value 1e\+39 is not finite as float32"
      r" \(magnitude at most 3.4028235e\+38\)",
    ),
    ("age", [1.0, float("nan"), 3.0, 4.0, 5.0, 6.0], r"row 1: column age value nan is not finite"),
    ("y", [0, 1, 1, 0, 5, 1], r"row 4: label column y value 5 is outside \[0, 1\]" + HINT),
    (
      "y",
      [0.0, 1.0, -0.5, 0, 1, 1],
      r"row 2: label column y value -0.5 is outside \[0, 1\]" + HINT,
    ),
    ("y", [0, 1, 1, None, 1, 0], r"row 3: the label column 'y' is null"),
    ("u", [0, 1, 9, 2, 99, 1], r"row 4: column u id 99 out of range \[0, 10\)"),
    ("t", [[1], [2], [2, -1], [5], None, []], r"row 2: column t id -1 out of range \[0, 10\)"),
    (
      "w",
      [[1.0], [1.0, 2.0], [1.0, 2.0], [1.0], None, []],
      r"row 1: column t holds 1 values but weight column w holds 2 weights",
    ),
    (
      "w",
      [[1.0], [1.0], [1.0, None], [1.0], None, []],
      r"row 2: weight column w is null where column t has an id",
    ),
    (
      "w",
      [[1.0], [1.0], [1.0, 2.0], [float("inf")], None, []],
      r"row 3: column w value inf is not finite",
    ),
  ],
)
def test_bad_values_name_file_row_column_and_value(tmp_path, column, values, message):
  table = {
    "y": pa.array([0, 1, 1, 0, 1, 1]),
    "age": pa.array([1.0] * 6),
    "u": pa.array([1] * 6),
    "t": pa.array([[1], [2], [3, 4], [5], None, []], pa.list_(pa.int64())),
    "w": pa.array([[1.0], [1.0], [1.0, 2.0], [1.0], None, []], pa.list_(pa.float64())),
  }
  table[column] = pa.array(values, None if column in "yu" else table[column].type)
  path = _write(tmp_path, table, row_group_size=2)
  convert = lambda p: convert_parquet(
    [p],
    str(tmp_path / "out"),
    label_column="y",
    dense_columns=["age"],
    sparse_columns=["u", "t"],
    integer_id_columns=["u", "t"],
    weight_columns=["t=w"],
    vocab_sizes=10,
    dense_transform="none",  # stored as they are: 1e39 is no float32 (auto would log1p it)
    batch_rows=2,
  )
  # Two rows per row group and per batch: the rows named are rows of the file.
  with pytest.raises(InputFormatError, match=rf"^'.*in.parquet' {message}$"):
    convert(path)
  # The same values with the bad one replaced by a good one convert.
  table[column] = table[column].take([0, 0, 0, 0, 0, 0] if column != "w" else [0, 0, 0, 0, 4, 5])
  if column in ("t", "w"):
    table["t"], table["w"] = pa.array([[1]] * 4 + [None, []]), pa.array([[1.0]] * 4 + [None, []])
  assert convert(_write(tmp_path, table, name="good.parquet")).num_examples == 6


def test_files_with_different_schemas_are_named(tmp_path):
  a = _write(tmp_path, {"y": [0], "age": pa.array([1], pa.int64())}, name="a.parquet")
  b = _write(tmp_path, {"y": [0], "age": pa.array([1], pa.int32())}, name="b.parquet")
  c = _write(tmp_path, {"y": [0]}, name="c.parquet")
  args = dict(label_column="y", dense_columns=["age"])
  with pytest.raises(
    ValueError,
    match=r"^'.*b.parquet': column 'age' has Arrow type int32, but '.*a.parquet' has int64"
    r" \(every input must give a column the same type\)$",
  ):
    convert_parquet([a, b], str(tmp_path / "out"), **args)
  with pytest.raises(
    ValueError, match=r"^'.*c.parquet': columns \['age'\] are not in the schema \['y'\]$"
  ):
    convert_parquet([a, c], str(tmp_path / "out"), **args)
  # What writers vary and the conversion ignores may differ: dictionary encoding, list items'
  # nullability and names (pyarrow writes "element", older writers "item").
  required = pa.list_(pa.field("item", pa.string(), nullable=False))
  d = _write(
    tmp_path, {"y": [0], "g": pa.array([["x"]], required), "s": pa.array(["v"])}, name="d.parquet"
  )
  e = _write(
    tmp_path,
    {"y": [1], "g": pa.array([["x"]], STRINGS), "s": pa.array(["v"]).dictionary_encode()},
    name="e.parquet",
  )
  m = convert_parquet(
    [d, e], str(tmp_path / "o"), label_column="y", sparse_columns=["g", "s"], vocab_sizes=1_000_000
  )
  assert _ragged(_read_all(m), "g") == ([_h("x", 1_000_000)] * 2, [1, 1])


def _damaged(tmp_path, **kwargs):
  """A file of 3 row groups of 4 rows whose row group 1 is damaged; (path, first byte there)."""
  path = _write(tmp_path, {"y": pa.array([0, 1] * 6)}, row_group_size=4, **kwargs)
  chunk = pq.ParquetFile(path).metadata.row_group(1).column(0)
  return path, chunk.dictionary_page_offset or chunk.data_page_offset, chunk.total_compressed_size


def test_truncated_and_damaged_files_name_the_file_and_row_group(tmp_path):
  path, start, _ = _damaged(tmp_path)
  data = bytearray(open(path, "rb").read())
  with open(path, "wb") as f:
    f.write(data[: len(data) // 2])
  with pytest.raises(
    ValueError,
    match=r"^'.*in.parquet' is not a readable Parquet file \(truncated or damaged\?\):"
    r" Parquet magic bytes not found in footer",
  ):
    convert_parquet([path], str(tmp_path / "out"), label_column="y")
  data[start : start + 8] = b"\xff" * 8  # the page header of row group 1
  with open(path, "wb") as f:
    f.write(data)
  with pytest.raises(
    InputFormatError,
    match=r"^'.*in.parquet' row group 1: the data of rows 4 to 7 cannot be read \(the file is"
    r" damaged or truncated\): Couldn't deserialize thrift",
  ):
    convert_parquet([path], str(tmp_path / "out"), label_column="y")
  assert not os.path.exists(tmp_path / "out")


def test_a_page_checksum_catches_damaged_values(tmp_path):
  path, start, size = _damaged(
    tmp_path, write_page_checksum=True, compression="none", use_dictionary=False
  )
  data = bytearray(open(path, "rb").read())
  data[start + size - 1] ^= 0xFF  # a value byte: without the checksum it reads as another value
  with open(path, "wb") as f:
    f.write(data)
  with pytest.raises(
    InputFormatError,
    match=r"^'.*in.parquet' row group 1: the data of rows 4 to 7 cannot be read .*: could not"
    r" verify page integrity, CRC checksum verification failed",
  ):
    convert_parquet([path], str(tmp_path / "out"), label_column="y")


def test_overwrite_keeps_the_old_dataset_when_the_new_one_fails(tmp_path):
  good = _write(tmp_path, {"y": [0, 1, 1]}, name="good.parquet")
  bad = _write(tmp_path, {"y": [0, 1, 2]}, name="bad.parquet")
  old = convert_parquet([good], str(tmp_path / "out"), label_column="y")
  before = sorted(os.listdir(old.directory))
  with pytest.raises(InputFormatError, match=r"bad.parquet' row 2: label column y value 2"):
    convert_parquet([good, bad], old.directory, label_column="y", overwrite=True)
  assert sorted(os.listdir(old.directory)) == before
  assert read_manifest(old.directory, verify_shards=True).num_examples == 3
  assert sorted(os.listdir(tmp_path)) == ["bad.parquet", "good.parquet", "out"]


def _run(*args):
  env = {
    **os.environ,
    "PYTHONPATH": paths.REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
  }
  return subprocess.run(
    [sys.executable, "-m", "sparsepipe.data.parquet", *args],
    capture_output=True,
    text=True,
    env=env,
    check=False,
    timeout=120,
    cwd=paths.REPO_ROOT,
  )


def test_command_line_converts_with_an_eval_split_and_errors_are_one_line(tmp_path):
  path = _write(
    tmp_path,
    {"r": pa.array(np.arange(200) % 5 + 1), "g": pa.array([["x", "y"]] * 200, STRINGS)},
  )
  args = ["--input", path, "--label_column", "r", "--label_threshold", "4"]
  out = _run(
    *args,
    "--output",
    str(tmp_path / "t"),
    "--sparse_columns",
    "g",
    "--vocab_sizes",
    "7",
    "--eval_output",
    str(tmp_path / "e"),
    "--eval_fraction",
    "0.25",
  )
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  assert (
    len(lines) == 2 and lines[0].startswith("wrote ") and lines[1].endswith(str(tmp_path / "e"))
  )
  assert "parquet: 200/200 examples (100.0%)" in out.stderr
  train, held = read_manifest(str(tmp_path / "t")), read_manifest(str(tmp_path / "e"))
  assert (train.num_examples, held.num_examples) == (
    200 - eval_mask(0, 200, 0.25, 0).sum(),
    eval_mask(0, 200, 0.25, 0).sum(),
  )
  out = _run(*args, "--output", str(tmp_path / "o"), "--dense_columns", "g")
  assert (out.returncode, out.stdout) == (1, "")
  assert out.stderr == (
    f"error: '{path}': dense column 'g' has Arrow type list<element: string>; it must hold numbers"
    " (integer, floating point or bool)\n"
  )


@pytest.mark.parametrize("as_list", [False, True])
def test_text_that_is_not_utf8_names_file_row_column_and_byte(tmp_path, as_list):
  """Before: "error: 'utf-8' codec can't decode byte 0xff in position 0", nothing more."""
  values = [b"k0", b"k1", b"k2", b"\xff\xfebad", b"k0"]
  offsets = np.cumsum([0] + [len(v) for v in values]).astype(np.int32)
  buffers = [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(values))]
  text = pa.Array.from_buffers(pa.string(), len(values), buffers)
  if as_list:
    text = pa.ListArray.from_arrays(pa.array(range(6), pa.int32()), text)
  path = _write(tmp_path, {"y": pa.array([0, 1, 1, 0, 1]), "s": text}, row_group_size=2)
  for vocab in ({}, {"vocab_sizes": ["s=100"]}):  # with and without the first pass
    with pytest.raises(InputFormatError) as refused:
      convert_parquet(
        [path], str(tmp_path / "out"), label_column="y", sparse_columns=["s"], **vocab
      )
    assert str(refused.value) == (
      f"'{path}' row 3: column 's': byte 1 (b'\\xff') of b'\\xff\\xfebad' is not UTF-8 text"
    )

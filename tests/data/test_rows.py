"""examples_from_rows: Python values in raw rows convert as the converter reads their fields.

None is a missing value (an empty field), a list a multivalent column's
values (the field joined with its separator); a column the converter never
read, a list for a single-valued column and values that are not text or
numbers are errors naming the row and the column.
"""

import numpy as np
import pytest

from sparsepipe import data
from sparsepipe.data.convert.raw_rows import examples_from_rows
from sparsepipe.data.criteo import convert as criteo

CSV_INFO = {
  "converter": "sparsepipe.data.csv",
  "label_column": "rating",
  "label_threshold": 4.0,
  "dense_columns": ["age"],
  "sparse_columns": ["userId", "title", "genres"],
  "multivalent_columns": ["genres"],
  "integer_id_columns": ["userId"],
  "vocab_sizes": ["1000", "userId=50", "genres=16"],
}
CRITEO_INFO = {"converter": "sparsepipe.data.criteo", "empty_category": "reserve"}
CSV_COLUMNS = "['age', 'genres', 'rating', 'title', 'userId']"


def _examples(rows, info=CSV_INFO, **kwargs):
  schema = criteo.criteo_schema(100) if info is CRITEO_INFO else None
  return examples_from_rows(info, schema, rows, **kwargs)


def _assert_same(got, want):
  np.testing.assert_array_equal(got.labels, want.labels)
  np.testing.assert_array_equal(got.dense, want.dense)
  assert list(got.sparse) == list(want.sparse)
  for name, ragged in want.sparse.items():
    np.testing.assert_array_equal(got.sparse[name].values, ragged.values, err_msg=name)
    np.testing.assert_array_equal(got.sparse[name].row_lengths, ragged.row_lengths, err_msg=name)


def test_none_is_a_missing_value_in_sparse_dense_and_label_columns():
  full = {"userId": "3", "title": "Heat (1995)", "genres": "Action|Drama", "age": "30"}
  for column in full:
    absent = {k: v for k, v in full.items() if k != column}
    empty = {**full, column: ""}
    none = {**full, column: None}
    _assert_same(_examples([none]), _examples([absent]))
    _assert_same(_examples([none]), _examples([empty]))
  _assert_same(_examples([{**full, "rating": None}]), _examples([full]))
  missing = _examples([{"userId": None, "title": None, "genres": None, "age": None}])
  np.testing.assert_array_equal(missing.dense, np.zeros((1, 1), np.float32))
  assert [int(r.row_lengths[0]) for r in missing.sparse.values()] == [0, 0, 0]


def test_a_list_is_a_multivalent_columns_values_as_its_separator_splits_them():
  text = _examples([{"genres": "Action|Comedy|Drama"}, {"genres": "Drama||Action"}])
  for values in (["Action", "Comedy", "Drama"], ("Action", "Comedy", "Drama")):
    listed = _examples([{"genres": values}, {"genres": ["Drama", "", None, "Action"]}])
    _assert_same(listed, text)
  array = _examples([{"genres": np.array(["Action", "Comedy", "Drama"])}])
  _assert_same(array, _examples([{"genres": "Action|Comedy|Drama"}]))
  assert text.sparse["genres"].row_lengths.tolist() == [3, 2]
  _assert_same(_examples([{"genres": []}]), _examples([{"genres": ""}]))
  # Numbers are their text, as in a CSV file.
  _assert_same(_examples([{"userId": 7, "age": 30}]), _examples([{"userId": "7", "age": "30"}]))


@pytest.mark.parametrize(
  "row, reason",
  [
    (
      {"title": ["Heat (1995)", "Up (2009)"]},
      "column title takes one value, not a list (only multivalent columns take lists)",
    ),
    (
      {"age": (30,)},
      "column age takes one value, not a tuple (only multivalent columns take lists)",
    ),
    (
      {"genres": ["Action|Drama"]},
      "column genres item 'Action|Drama' holds the column's separator '|' (give each value as"
      " its own item)",
    ),
    (
      {"title": b"Heat"},
      "column title value b'Heat' is a bytes, not text, a number, None or (for a multivalent"
      " column) a list",
    ),
    (
      {"genres": [["Action"]]},
      "column genres value ['Action'] is a list, not text, a number, None or (for a multivalent"
      " column) a list",
    ),
    (
      {"genres": np.array([["Action"]])},
      "column genres is an array of shape (1, 1), not a list of values",
    ),
    (
      {"titel": "Heat (1995)"},
      f"column(s) ['titel'] are not among the training data's columns {CSV_COLUMNS} (correct"
      " the name, or pass ignore_columns= to leave a column out)",
    ),
  ],
)
def test_a_value_the_converter_could_not_have_read_names_the_row_and_column(row, reason):
  with pytest.raises(data.InputFormatError) as e:
    _examples([{"userId": "1"}, row])
  assert str(e.value) == f"'rows' line 2: {reason}"


def test_ignore_columns_leaves_the_named_columns_out():
  row = {"userId": "3", "title": "Heat (1995)", "request_id": "r-17"}
  _assert_same(
    _examples([row], ignore_columns=["request_id"]),
    _examples([{"userId": "3", "title": "Heat (1995)"}]),
  )
  with pytest.raises(data.InputFormatError, match=r"column\(s\) \['request_id'\] are not among"):
    _examples([row], ignore_columns=["requestid"])


def test_criteo_rows_take_none_as_an_empty_field_and_refuse_lists():
  line = "\t".join(["", "3", *[""] * 12, "68fd1e64", *[""] * 25])
  parser = criteo.CriteoParser(criteo.criteo_schema(100), empty_category="reserve")
  parser.add_line("0" + line, "\t", "rows", 1)
  want = parser.take()
  row = {"I1": "3", "C1": "68fd1e64", "I2": None, "C2": None}
  _assert_same(_examples([row], CRITEO_INFO), want)
  assert want.sparse["C2"].values.tolist() == [0]  # reserve: an empty field is id 0
  with pytest.raises(
    data.InputFormatError,
    match=r"^'rows' line 1: column C1 takes one value, not a list \(only multivalent columns",
  ):
    _examples([{"C1": ["a", "b"]}], CRITEO_INFO)
  with pytest.raises(
    data.InputFormatError, match=r"^'rows' line 1: column C1 value 'a\\tb' holds a tab or line"
  ):
    _examples([{"C1": "a\tb"}], CRITEO_INFO)
  with pytest.raises(data.InputFormatError, match=r"column\(s\) \['c1'\] are not among"):
    _examples([{"c1": "68fd1e64"}], CRITEO_INFO)

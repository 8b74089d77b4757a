"""Bad input to the converters: each case a clear error naming file, line, column or flag."""

import gzip
import json
import os

import pytest

from sparsepipe.data import InputFormatError
from sparsepipe.data import convert_criteo
from sparsepipe.data import convert_csv
from sparsepipe.data import convert_parquet
from sparsepipe.data import read_manifest
from sparsepipe.data.convert.text_input import parse_float

# A Criteo line: label, 13 integers, 26 categories.
CRITEO = "\t".join(["1", *[str(i) for i in range(13)], *[f"c{i:07x}" for i in range(26)]])
HEADER = "\t".join(["label", *[f"I{i}" for i in range(1, 14)], *[f"C{i}" for i in range(1, 27)]])
CSV = "user,item,rating,age\nu1,i1,1,30\nu2,i2,0,40\nu3,i3,1,50\n"
CSV_ARGS = dict(label_column="rating", dense_columns=["age"], sparse_columns=["user", "item"])


def _criteo(tmp_path, lines, name="in.tsv", **kwargs):
  path = tmp_path / name
  path.write_text("".join(line + "\n" for line in lines))
  return convert_criteo([str(path)], str(tmp_path / "out"), **{"vocab_sizes": 100, **kwargs})


def _csv(tmp_path, content, **kwargs):
  path = tmp_path / "in.csv"
  path.write_text(content)
  return convert_csv([str(path)], str(tmp_path / "out"), **{**CSV_ARGS, **kwargs})


@pytest.mark.parametrize("column, field", [("label", 0), ("I3", 3)])
def test_criteo_float32_overflow_is_refused_for_stored_values(tmp_path, column, field):
  fields = CRITEO.split("\t")
  fields[field] = "1e39"
  if column == "I3":  # log(1 + 1e39) = 89.8 is stored: fine
    m = _criteo(tmp_path, ["\t".join(fields)])
    assert m.num_examples == 1
  else:
    with pytest.raises(
      InputFormatError,
      match=(
        r"^'.*in.tsv' line 1: column label value '1e39' is not finite as float32"
        r" \(magnitude at most 3.4028235e\+38\)$"
      ),
    ):
      _criteo(tmp_path, ["\t".join(fields)])


def test_csv_float32_overflow_names_file_line_column_value(tmp_path):
  with pytest.raises(
    InputFormatError,
    match=r"^'.*in.csv' line 3: column age value '-1e39' is not"
    r" finite as float32",
  ):
    _csv(tmp_path, CSV.replace("u2,i2,0,40", "u2,i2,0,-1e39"))
  # The largest float32 and values that round to it are fine; half an ulp more is inf.
  assert parse_float("3.4028235e38", "f", 1, "x") == 3.4028235e38
  with pytest.raises(InputFormatError, match="not finite as float32"):
    parse_float(str(float.fromhex("0x1.ffffffp+127")), "f", 1, "x")
  assert parse_float(str(float.fromhex("0x1.fffffefp+127")), "f", 1, "x") > 3.4e38


def test_labels_outside_0_1_name_column_line_value_and_flag(tmp_path):
  with pytest.raises(
    InputFormatError,
    match=(
      r"^'.*in.csv' line 4: label column rating value '5' is outside \[0, 1\]; map such values"
      r" to 0/1 with --label_threshold T \(label_threshold=T: 1 if value >= T\)$"
    ),
  ):
    _csv(tmp_path, CSV.replace("u3,i3,1,50", "u3,i3,5,50"))
  m = _csv(tmp_path, CSV.replace("u3,i3,1,50", "u3,i3,5,50"), label_threshold=4, overwrite=True)
  assert m.num_examples == 3
  with pytest.raises(
    InputFormatError, match=r"line 2: label column label value '-1' is outside \[0, 1\]$"
  ):
    _criteo(tmp_path, [CRITEO, "-1" + CRITEO[1:]], overwrite=True)


@pytest.mark.parametrize(
  "label, reason",
  [
    ("x", "column label value 'x' is not a number"),
    ("", "the label field is empty"),
  ],
)
def test_criteo_bad_first_line_is_an_error_not_a_header(tmp_path, label, reason):
  lines = [label + CRITEO[1:]] + [CRITEO] * 9
  with pytest.raises(InputFormatError, match=rf"^'.*in.tsv' line 1: {reason}$"):
    _criteo(tmp_path, lines)
  assert _criteo(tmp_path, [HEADER] + [CRITEO] * 9, name="h.tsv", overwrite=True).num_examples == 9
  assert _criteo(tmp_path, [CRITEO] * 10, name="n.tsv", overwrite=True).num_examples == 10


def test_csv_header_naming_a_used_column_twice(tmp_path):
  with pytest.raises(
    InputFormatError,
    match=(r"^'.*in.csv' line 1: the header names column 'item' 2 times \(fields \[2, 4\]\)$"),
  ):
    _csv(tmp_path, "user,item,rating,item\nu1,i1,1,30\n", dense_columns=[])


def test_unterminated_quote_is_reported_at_its_line(tmp_path):
  lines = ["u,i,1,1"] * 4 + ['u,"i,1,1'] + ["u,i,1,1"] * 5
  with pytest.raises(
    InputFormatError,
    match=(
      r"^'.*in.csv' line 6: expected 4 fields, got 2 \(this row runs from line 6 to line 11:"
      r" is a quote left open on line 6\?\)$"
    ),
  ):
    _csv(tmp_path, "user,item,rating,age\n" + "\n".join(lines) + "\n")


def test_non_utf8_byte_names_its_line(tmp_path):
  path = tmp_path / "in.csv"
  path.write_bytes(CSV.encode() + b"u4,caf\xe9,1,20\n")
  with pytest.raises(
    InputFormatError,
    match=(r"^'.*in.csv' line 5: byte 7 \(b'\\xe9'\) is not UTF-8 text; convert the file to UTF-8"),
  ):
    convert_csv([str(path)], str(tmp_path / "out"), **CSV_ARGS)


def test_truncated_gzip_names_file_and_last_line(tmp_path):
  path = tmp_path / "day.tsv.gz"
  data = gzip.compress("".join(CRITEO + "\n" for _ in range(2000)).encode())
  path.write_bytes(data[: len(data) // 2])
  with pytest.raises(
    InputFormatError,
    match=(r"^'.*day.tsv.gz' line \d+: the gzip data is truncated or damaged after line \d+ \("),
  ):
    convert_criteo([str(path)], str(tmp_path / "out"), vocab_sizes=100)


def test_utf8_bom_is_not_part_of_the_first_column_name(tmp_path):
  path = tmp_path / "in.csv"
  path.write_bytes(b"\xef\xbb\xbf" + CSV.encode())
  assert convert_csv([str(path)], str(tmp_path / "out"), **CSV_ARGS).num_examples == 3


@pytest.mark.parametrize(
  "sizes, message",
  [
    (["1e6"], r"vocab_sizes \(--vocab_sizes\): '1e6' is not an integer \(write 1000000, not 1e6\)"),
    (
      ["user=1e6", "10"],
      r"vocab_sizes \(--vocab_sizes\) entry 'user=1e6': '1e6' is not an integer",
    ),
    (["0"], r"vocab_sizes \(--vocab_sizes\): 0 must be >= 1"),
  ],
)
def test_vocab_sizes_that_are_not_integers_name_the_flag(tmp_path, sizes, message):
  with pytest.raises(ValueError, match=message):
    _csv(tmp_path, CSV, vocab_sizes=sizes)
  if len(sizes) == 1:
    with pytest.raises(ValueError, match=message):
      _criteo(tmp_path, [CRITEO], vocab_sizes=sizes)


def test_overwrite_keeps_the_old_dataset_when_the_new_one_fails(tmp_path):
  old = _csv(tmp_path, CSV)
  before = sorted(os.listdir(old.directory))
  with pytest.raises(InputFormatError, match="line 3: column age value 'x' is not a number"):
    _csv(tmp_path, CSV.replace(",40", ",x"), overwrite=True)
  with pytest.raises(FileNotFoundError, match="missing.csv"):
    convert_csv([str(tmp_path / "missing.csv")], old.directory, overwrite=True, **CSV_ARGS)
  assert sorted(os.listdir(old.directory)) == before
  assert read_manifest(old.directory, verify_shards=True).num_examples == 3
  assert sorted(os.listdir(tmp_path)) == ["in.csv", "out"]  # no temporary directory left
  new = _csv(tmp_path, CSV + "u4,i4,0,60\n", overwrite=True)
  assert read_manifest(new.directory).num_examples == 4 and new.directory == old.directory
  assert sorted(os.listdir(tmp_path)) == ["in.csv", "out"]


def test_writer_refuses_to_replace_a_directory_holding_other_files(tmp_path):
  m = _csv(tmp_path, CSV)
  (tmp_path / "out" / "notes.txt").write_text("mine")
  with pytest.raises(
    FileExistsError,
    match=(
      r"holds a dataset and other files \['notes.txt'\]: overwriting replaces the whole"
      r" directory, so move those files or choose another output$"
    ),
  ):
    _csv(tmp_path, CSV, overwrite=True)
  assert read_manifest(m.directory).num_examples == 3


def test_dataset_written_into_a_directory_with_unrelated_files(tmp_path):
  out = tmp_path / "out"
  out.mkdir()
  (out / "notes.txt").write_text("mine")
  m = _csv(tmp_path, CSV)
  assert sorted(os.listdir(out)) == ["manifest.json", "notes.txt", "part-00000.arrayrecord"]
  assert json.loads((out / "manifest.json").read_text())["num_examples"] == m.num_examples == 3


def test_an_input_given_twice_is_refused(tmp_path):
  """Before: --input a.csv,a.csv (or a folder and a file in it) converted every row twice."""
  (tmp_path / "in.csv").write_text(CSV)
  os.symlink(tmp_path / "in.csv", tmp_path / "link.csv")
  with pytest.raises(ValueError) as refused:
    convert_csv(
      [str(tmp_path / "in.csv"), str(tmp_path / "link.csv")], str(tmp_path / "o"), **CSV_ARGS
    )
  assert str(refused.value) == (
    f"input '{tmp_path / 'link.csv'}' is given twice (as '{tmp_path / 'in.csv'}'): its rows"
    " would be converted twice; give each file once"
  )
  with pytest.raises(ValueError, match=r"^input '.*in.tsv' is given twice: its rows would be"):
    path = tmp_path / "in.tsv"
    path.write_text(CRITEO + "\n")
    convert_criteo([str(path), str(path)], str(tmp_path / "o"), vocab_sizes=100)
  assert not os.path.exists(tmp_path / "o")


@pytest.mark.parametrize("threshold", [float("nan"), float("-inf")])
def test_a_label_threshold_that_is_not_a_finite_number_is_refused(tmp_path, threshold):
  """Before: NaN made every label 0 (and -inf every label 1), and the manifest held NaN."""
  with pytest.raises(ValueError) as refused:
    _csv(tmp_path, CSV, label_threshold=threshold)
  assert str(refused.value) == f"label_threshold={threshold} must be a finite number"


def test_lines_ended_by_a_carriage_return_alone_are_named(tmp_path):
  """Before: a traceback from the csv module ("new-line character seen in unquoted field")."""
  with pytest.raises(InputFormatError) as refused:
    _csv(tmp_path, CSV.replace("\n", "\r"))
  assert str(refused.value) == (
    f"'{tmp_path / 'in.csv'}' line 1: lines end in a carriage return alone (\\r): convert them to"
    " \\n, e.g. with tr '\\r' '\\n'"
  )


def test_a_folder_or_an_unexpanded_pattern_given_to_a_text_converter_is_named(tmp_path):
  """Before: "[Errno 21] Is a directory: 'cli'" and "[Errno 2] No such file or directory"."""
  with pytest.raises(IsADirectoryError) as refused:
    convert_csv([str(tmp_path)], str(tmp_path / "o"), **CSV_ARGS)
  assert str(refused.value) == f"input '{tmp_path}' is a folder: give the files in it"
  with pytest.raises(FileNotFoundError) as refused:
    convert_criteo([f"{tmp_path}/*.tsv"], str(tmp_path / "o"), vocab_sizes=100)
  assert str(refused.value) == (
    f"input '{tmp_path}/*.tsv' does not exist (a pattern is not expanded here: leave it unquoted"
    " for the shell to expand)"
  )


def test_a_string_where_a_list_is_meant_is_named_not_read_letter_by_letter(tmp_path):
  """Before: sparse_columns="user,item" named columns ['u', 's', 'e', 'r', ...], an
  input path given alone was "input '.' is a folder", and vocab_sizes as a mapping
  (as CsvParser documents it) was "'user' is not an integer"."""
  path = tmp_path / "in.csv"
  path.write_text(CSV)
  with pytest.raises(TypeError) as refused:
    convert_csv([str(path)], str(tmp_path / "o"), **{**CSV_ARGS, "sparse_columns": "user,item"})
  assert str(refused.value) == (
    "sparse_columns must be a list, not the string 'user,item': e.g."
    " sparse_columns=['user', 'item']"
  )
  for convert in (convert_csv, convert_parquet):
    with pytest.raises(TypeError) as refused:
      convert(str(path), str(tmp_path / "o"), **CSV_ARGS)
    assert str(refused.value) == f"inputs must be a list, not the string {str(path)!r}: e.g." + (
      f" inputs=[{str(path)!r}]"
    )
  assert not os.path.exists(tmp_path / "o")
  manifest = convert_csv(
    [str(path)], str(tmp_path / "o"), **CSV_ARGS, vocab_sizes={"user": 10, "item": 20}
  )
  assert [(f.name, f.vocab_size) for f in manifest.schema.sparse] == [("user", 10), ("item", 20)]

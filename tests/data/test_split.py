"""Eval splits in the converters and the statistics the manifest records for a config."""

import errno
import os

import numpy as np
import pytest

from sparsepipe.data import ExampleBatch
from sparsepipe.data import RaggedBatch
from sparsepipe.data import concat_batches
from sparsepipe.data import convert_criteo
from sparsepipe.data import convert_csv
from sparsepipe.data import decode_batch
from sparsepipe.data import manifest_source
from sparsepipe.data import read_manifest
from sparsepipe.data import select_examples
from sparsepipe.data import stable_hash64
from sparsepipe.data import writer
from sparsepipe.data.split import eval_mask

N = 200
CSV_ARGS = dict(
  label_column="click",
  dense_columns=["x"],
  sparse_columns=["user", "tags"],
  multivalent_columns=["tags"],
  vocab_sizes=["1000"],
  # x = the row's index, stored as it is (auto would store log1p: x reaches 199).
  dense_transform="none",
)


def _rows(n, start=0):
  """Example i: user u<i % 17>, i % 4 tags, dense x = i (so examples are recognisable)."""
  out = []
  for i in range(start, start + n):
    tags = "|".join(f"t{(i + k) % 9}" for k in range(i % 4))
    out.append(f"{i % 2},{i},u{i % 17},{tags}\n")
  return "click,x,user,tags\n" + "".join(out)


def _read(directory):
  manifest = read_manifest(directory)
  source = manifest_source(manifest)
  return concat_batches([decode_batch(source[i], manifest.schema) for i in range(len(source))])


def test_eval_mask_is_a_fixed_function_of_index_and_seed():
  a = eval_mask(0, 1000, 0.25, 7)
  np.testing.assert_array_equal(a[300:400], eval_mask(300, 100, 0.25, 7))
  assert 200 < a.sum() < 300
  assert (a & ~eval_mask(0, 1000, 0.5, 7)).sum() == 0  # a larger fraction only adds examples
  assert (a != eval_mask(0, 1000, 0.25, 8)).any()
  # Pinned values: a change of the rule would silently move examples between splits.
  # (checked against the formula in the module docstring, in Python integers).
  assert np.flatnonzero(eval_mask(0, 20, 0.25, 0)).tolist() == [3, 10, 18]
  assert np.flatnonzero(eval_mask(0, 20, 0.25, 5)).tolist() == [7, 9, 16, 17]


def test_csv_eval_split_is_deterministic_disjoint_and_complete(tmp_path):
  path = tmp_path / "in.csv"
  path.write_text(_rows(N))
  m = convert_csv(
    [str(path)],
    str(tmp_path / "train"),
    eval_output=str(tmp_path / "eval"),
    eval_fraction=0.25,
    split_seed=3,
    examples_per_record=8,
    **CSV_ARGS,
  )
  train, evals = _read(tmp_path / "train"), _read(tmp_path / "eval")
  expected = eval_mask(0, N, 0.25, 3)
  np.testing.assert_array_equal(evals.dense[:, 0], np.flatnonzero(expected))
  np.testing.assert_array_equal(train.dense[:, 0], np.flatnonzero(~expected))
  assert m.num_examples == N - expected.sum()
  e = read_manifest(str(tmp_path / "eval"))
  assert e.schema == m.schema
  assert e.info["split"] == {
    "part": "eval",
    "eval_fraction": 0.25,
    "seed": 3,
    "rule": "eval if splitmix64(index + seed * 0x9E3779B97F4A7C15) >> 11 < fraction * 2^53",
  }
  assert m.info["split"]["part"] == "train"
  # Ids are hashed alike in both splits: user u<k> -> the same id.
  for batch in (train, evals):
    users = batch.dense[:, 0].astype(int) % 17
    expect = [stable_hash64(f"u{u}") % 1000 for u in users]
    np.testing.assert_array_equal(batch.sparse["user"].values, expect)


def test_held_out_file_converted_alone_gets_the_same_ids(tmp_path):
  (tmp_path / "day0.csv").write_text(_rows(100))
  (tmp_path / "day1.csv").write_text(_rows(50, start=100))
  both = _read(
    convert_csv(
      [str(tmp_path / "day0.csv"), str(tmp_path / "day1.csv")], str(tmp_path / "both"), **CSV_ARGS
    ).directory
  )
  convert_csv(
    [str(tmp_path / "day0.csv")],
    str(tmp_path / "t"),
    eval_output=str(tmp_path / "e"),
    eval_fraction=0.1,
    **CSV_ARGS,
  )
  held_out = _read(
    convert_csv([str(tmp_path / "day1.csv")], str(tmp_path / "day1"), **CSV_ARGS).directory
  )
  for name in ("user", "tags"):
    lo = int(both.sparse[name].row_lengths[:100].sum())
    np.testing.assert_array_equal(held_out.sparse[name].values, both.sparse[name].values[lo:])


def test_criteo_eval_split(tmp_path):
  line = "\t".join(["{label}", "{i}", *["1"] * 12, "c{c}", *["aa"] * 25])
  (tmp_path / "d.tsv").write_text(
    "".join(line.format(label=i % 2, i=i, c=i % 5) + "\n" for i in range(N))
  )
  convert_criteo(
    [str(tmp_path / "d.tsv")],
    str(tmp_path / "t"),
    vocab_sizes=50,
    eval_output=str(tmp_path / "e"),
    eval_fraction=0.5,
  )
  evals = _read(tmp_path / "e")
  expected = np.flatnonzero(eval_mask(0, N, 0.5, 0))
  np.testing.assert_allclose(evals.dense[:, 0], np.log1p(expected), rtol=1e-6)
  np.testing.assert_array_equal(evals.labels, expected % 2)


@pytest.mark.parametrize(
  "kwargs, message",
  [
    (dict(eval_fraction=0.0), r"eval_fraction=0.0 must lie in \(0, 1\) with an eval output"),
    (dict(eval_fraction=1.0), r"eval_fraction=1.0 must lie in \(0, 1\) with an eval output"),
    (
      dict(eval_fraction=0.001),
      r"the eval split got none of the 200 examples \(eval_fraction=0.001\)",
    ),
  ],
)
def test_eval_split_errors(tmp_path, kwargs, message):
  path = tmp_path / "in.csv"
  path.write_text(_rows(N))
  with pytest.raises(ValueError, match=message):
    convert_csv(
      [str(path)], str(tmp_path / "t"), eval_output=str(tmp_path / "e"), **kwargs, **CSV_ARGS
    )
  assert not (tmp_path / "t").exists() and not (tmp_path / "e").exists()


def test_manifest_records_ids_per_example(tmp_path):
  path = tmp_path / "in.csv"
  path.write_text(_rows(N))
  m = convert_csv([str(path)], str(tmp_path / "out"), **CSV_ARGS)
  tags = [i % 4 for i in range(N)]
  assert read_manifest(m.directory).info["ids_per_example"] == {
    "user": {"max": 1, "mean": 1.0},
    "tags": {"max": 3, "mean": sum(tags) / N},
  }


def test_select_examples_keeps_ids_and_weights_of_the_chosen_rows():
  rb = RaggedBatch(
    np.array([1, 2, 3, 4, 5], np.int32),
    np.array([2, 0, 3], np.int32),
    np.array([0.1, 0.2, 0.3, 0.4, 0.5], np.float32),
  )
  dense = np.arange(6, dtype=np.float32).reshape(3, 2)
  batch = ExampleBatch(np.array([0, 1, 0], np.float32), dense, {"a": rb})
  out = select_examples(batch, np.array([True, False, True]))
  np.testing.assert_array_equal(out.labels, [0, 0])
  np.testing.assert_array_equal(out.dense, [[0, 1], [4, 5]])
  np.testing.assert_array_equal(out.sparse["a"].values, [1, 2, 3, 4, 5])
  np.testing.assert_array_equal(out.sparse["a"].row_lengths, [2, 3])
  out = select_examples(batch, np.array([False, True, True]))
  np.testing.assert_array_equal(out.sparse["a"].values, [3, 4, 5])
  np.testing.assert_array_equal(out.sparse["a"].weights, np.float32([0.3, 0.4, 0.5]))


def test_a_failed_split_leaves_both_old_splits_as_they_were(tmp_path, monkeypatch):
  """--overwrite of a train/eval pair: the eval split used to be moved into place
  before the train split's manifest was written, so a failure there (a full disk)
  left a new eval split beside the old train split."""
  path = tmp_path / "in.csv"
  path.write_text(_rows(N))
  args = dict(eval_output=str(tmp_path / "eval"), eval_fraction=0.25, examples_per_record=8)
  convert_csv([str(path)], str(tmp_path / "train"), **args, **CSV_ARGS)
  old = {part: _read(tmp_path / part) for part in ("train", "eval")}
  files = {part: sorted(p.name for p in (tmp_path / part).iterdir()) for part in old}
  write_manifest = writer.write_manifest

  def disk_full_at_the_train_manifest(manifest):
    if os.path.basename(manifest.directory).startswith(".train.tmp-"):
      raise OSError(errno.ENOSPC, "No space left on device")
    write_manifest(manifest)

  monkeypatch.setattr(writer, "write_manifest", disk_full_at_the_train_manifest)
  path.write_text(_rows(N, start=N))
  with pytest.raises(OSError, match="No space left on device"):
    convert_csv([str(path)], str(tmp_path / "train"), overwrite=True, **args, **CSV_ARGS)
  assert sorted(os.listdir(tmp_path)) == ["eval", "in.csv", "train"]
  for part, batch in old.items():
    assert sorted(p.name for p in (tmp_path / part).iterdir()) == files[part]
    np.testing.assert_array_equal(_read(tmp_path / part).dense, batch.dense)

"""Sharded ArrayRecord writer, manifest, reader-side source, synthetic generator."""

import json
import os

from array_record.python import array_record_module
import numpy as np
import pytest

from sparsepipe.data import Example
from sparsepipe.data import ExampleBatch
from sparsepipe.data import Manifest
from sparsepipe.data import ManifestError
from sparsepipe.data import RaggedBatch
from sparsepipe.data import RecordCodec
from sparsepipe.data import ShardedRecordWriter
from sparsepipe.data import SyntheticFeature
from sparsepipe.data import concat_batches
from sparsepipe.data import criteo_like_features
from sparsepipe.data import decode_batch
from sparsepipe.data import make_schema
from sparsepipe.data import manifest_source
from sparsepipe.data import read_manifest
from sparsepipe.data import slice_batch
from sparsepipe.data import synthetic_schema
from sparsepipe.data import write_synthetic
from sparsepipe.data import writer as writer_lib
from sparsepipe.data.synthetic.generate import generate_batches
from sparsepipe.data.synthetic.generate import zipf_ids

FEATURES = (
  SyntheticFeature("u", 50, 1, 3),
  SyntheticFeature("v", 7, 0, 4, weighted=True, zipf_exponent=1.0),
)


def _all_examples(manifest):
  source = manifest_source(manifest)
  return concat_batches([decode_batch(source[i], manifest.schema) for i in range(len(source))])


def _assert_same(x, y):
  np.testing.assert_array_equal(x.labels, y.labels)
  np.testing.assert_array_equal(x.dense, y.dense)
  for name in x.sparse:
    for a, b in zip(x.sparse[name], y.sparse[name]):
      np.testing.assert_array_equal(a, b)


def test_writer_packs_records_and_shards(tmp_path):
  manifest = write_synthetic(
    str(tmp_path / "ds"),
    FEATURES,
    num_examples=103,
    num_dense=3,
    seed=5,
    examples_per_record=4,
    max_records_per_shard=7,
  )
  # 103 examples -> 25 full records + 1 of 3; shards of at most 7 records.
  assert manifest.num_examples == 103 and manifest.num_records == 26
  assert [(s.path, s.num_records, s.num_examples) for s in manifest.shards] == [
    ("part-00000.arrayrecord", 7, 28),
    ("part-00001.arrayrecord", 7, 28),
    ("part-00002.arrayrecord", 7, 28),
    ("part-00003.arrayrecord", 5, 19),
  ]
  assert sorted(os.listdir(tmp_path / "ds")) == [
    "manifest.json",
    "part-00000.arrayrecord",
    "part-00001.arrayrecord",
    "part-00002.arrayrecord",
    "part-00003.arrayrecord",
  ]
  with open(tmp_path / "ds" / "manifest.json") as f:
    raw = json.load(f)
  assert raw["format"] == "sparsepipe.arrayrecord" and raw["format_version"] == 1
  assert raw["num_records"] == 26 and raw["num_examples"] == 103 and raw["examples_per_record"] == 4
  assert raw["schema"]["sparse"][1] == {"name": "v", "vocab_size": 7, "weighted": True}
  reader = array_record_module.ArrayRecordReader(str(tmp_path / "ds" / "part-00003.arrayrecord"))
  assert "group_size:1," in reader.writer_options_string()
  reader.close()
  again = read_manifest(str(tmp_path / "ds"), verify_shards=True)
  assert again == manifest and again.schema == manifest.schema
  assert manifest.locate(0) == (str(tmp_path / "ds" / "part-00000.arrayrecord"), 0)
  assert manifest.locate(25) == (str(tmp_path / "ds" / "part-00003.arrayrecord"), 4)
  source = manifest_source(str(tmp_path / "ds"))
  assert len(source) == 26
  assert decode_batch(source[25], manifest.schema).num_examples == 3
  # The stored stream equals the generator's stream, in order.
  expected = concat_batches(list(generate_batches(FEATURES, 3, 103, seed=5)))
  _assert_same(_all_examples(manifest), expected)


def test_a_manifest_from_its_json_elsewhere_equals_the_one_read(tmp_path):
  manifest = write_synthetic(str(tmp_path / "ds"), FEATURES, num_examples=9, num_dense=3, seed=1)
  copy = Manifest.from_dict(manifest.to_dict(), manifest.directory, where="the copy")
  assert copy == manifest and copy.info == manifest.info
  short = manifest.to_dict()
  short["num_examples"] = 8
  with pytest.raises(
    ManifestError, match="^the copy: shards add up to num_examples=9, manifest says 8$"
  ):
    Manifest.from_dict(short, manifest.directory, where="the copy")
  with pytest.raises(ManifestError, match="^the copy: a manifest is a JSON object, not list$"):
    Manifest.from_dict([], manifest.directory, where="the copy")


def _compression(path):
  reader = array_record_module.ArrayRecordReader(str(path))
  options = reader.writer_options_string().split(",")
  reader.close()
  return [o for o in options if o.split(":")[0] in ("snappy", "zstd", "brotli", "uncompressed")]


@pytest.mark.parametrize(
  "per_record, compression", [(1, ["snappy"]), (8, ["snappy"]), (9, ["zstd:3"]), (128, ["zstd:3"])]
)
def test_small_records_are_snappy_chunks_and_read_like_zstd_ones(tmp_path, per_record, compression):
  manifest = write_synthetic(
    str(tmp_path / "ds"), FEATURES, num_examples=40, num_dense=2, seed=3,
    examples_per_record=per_record,
  )  # fmt: skip
  assert {tuple(_compression(p)) for p in manifest.shard_paths()} == {tuple(compression)}
  # The same records rewritten as zstd chunks (how 0.2 wrote every dataset) read the same.
  source = manifest_source(manifest)
  records = [source[i] for i in range(len(source))]
  old = tmp_path / "old"
  old.mkdir()
  (old / "manifest.json").write_bytes((tmp_path / "ds" / "manifest.json").read_bytes())
  writer = array_record_module.ArrayRecordWriter(
    str(old / "part-00000.arrayrecord"), "group_size:1"
  )
  for record in records:
    writer.write(record)
  writer.close()
  assert _compression(old / "part-00000.arrayrecord") == ["zstd:3"]
  again = manifest_source(str(old))
  assert [again[i] for i in range(len(again))] == records
  _assert_same(_all_examples(read_manifest(str(old))), _all_examples(manifest))


def test_synthetic_is_deterministic_per_seed_and_independent_of_packing(tmp_path):
  a = write_synthetic(
    str(tmp_path / "a"), FEATURES, num_examples=40, num_dense=2, seed=1, examples_per_record=3
  )
  b = write_synthetic(
    str(tmp_path / "b"),
    FEATURES,
    num_examples=40,
    num_dense=2,
    seed=1,
    examples_per_record=16,
    max_records_per_shard=1,
  )
  c = write_synthetic(str(tmp_path / "c"), FEATURES, num_examples=40, num_dense=2, seed=2)
  _assert_same(_all_examples(a), _all_examples(b))
  assert not np.array_equal(
    _all_examples(a).sparse["u"].values, _all_examples(c).sparse["u"].values
  )
  ex = _all_examples(a)
  lengths = ex.sparse["u"].row_lengths
  assert lengths.min() >= 1 and lengths.max() <= 3
  assert ex.sparse["v"].weights.shape == ex.sparse["v"].values.shape
  assert ex.sparse["u"].weights is None
  assert set(np.unique(ex.labels)) <= {0.0, 1.0}


def test_zipf_ids_are_skewed_and_in_range():
  rng = np.random.default_rng(0)
  ids = zipf_ids(rng, 200_000, 1000, 1.1)
  assert ids.min() >= 0 and ids.max() < 1000
  counts = np.sort(np.bincount(ids, minlength=1000))[::-1]
  # A Zipf law: the most frequent id is far more common than the median one.
  assert counts[0] > 50 * max(counts[500], 1)
  assert len(np.unique(zipf_ids(rng, 50_000, 3, 1.1))) == 3


def test_criteo_like_features():
  feats = criteo_like_features(26, 1000, min_ids=1, max_ids=20)
  assert [f.name for f in feats[:3]] == ["C1", "C2", "C3"] and len(feats) == 26
  with pytest.raises(ValueError, match=r"vocab_sizes has 2 entries, expected 1 or 26"):
    criteo_like_features(26, [1, 2])
  with pytest.raises(
    ValueError, match=r"feature 'x': need 0 <= min_ids <= max_ids, got min_ids=3 max_ids=2"
  ):
    SyntheticFeature("x", 10, 3, 2)


def test_writer_refuses_existing_dataset_and_overwrites(tmp_path):
  write_synthetic(str(tmp_path), FEATURES, num_examples=10, seed=0)
  with pytest.raises(
    FileExistsError,
    match=r"already holds a dataset \(manifest.json or 1 shard files\); pass overwrite=True",
  ):
    write_synthetic(str(tmp_path), FEATURES, num_examples=10, seed=0)
  m = write_synthetic(
    str(tmp_path),
    FEATURES,
    num_examples=300,
    seed=0,
    examples_per_record=1,
    max_records_per_shard=100,
    overwrite=True,
  )
  assert len(m.shards) == 3 and read_manifest(str(tmp_path)).num_examples == 300


def test_failed_write_leaves_no_manifest(tmp_path):
  schema = make_schema(0, {"a": 5})
  with pytest.raises(ValueError, match=r"feature 'a': id 9 out of range \[0, 5\)"):
    with ShardedRecordWriter(str(tmp_path), schema, examples_per_record=1) as writer:
      writer.write(Example(0.0, np.zeros(0, np.float32), {"a": np.array([1])}))
      bad = ExampleBatch(
        np.zeros(1, np.float32),
        np.zeros((1, 0), np.float32),
        {"a": RaggedBatch(np.array([9], np.int32), np.array([1], np.int32))},
      )
      writer.write_batch(bad)
  assert not os.path.exists(tmp_path / "manifest.json")
  with pytest.raises(ManifestError, match=r"no manifest.json in .* \(not a finished dataset\)"):
    read_manifest(str(tmp_path))


def test_manifest_consistency_checks(tmp_path):
  m = write_synthetic(
    str(tmp_path), FEATURES, num_examples=20, seed=0, examples_per_record=2, max_records_per_shard=5
  )
  path = tmp_path / "manifest.json"
  raw = json.loads(path.read_text())
  raw["num_records"] = 11
  path.write_text(json.dumps(raw))
  with pytest.raises(ManifestError, match=r"shards add up to num_records=10, manifest says 11"):
    read_manifest(str(tmp_path))
  raw["num_records"] = 10
  raw["shards"][1]["num_records"] = 6
  raw["shards"][0]["num_records"] = 4
  path.write_text(json.dumps(raw))
  with pytest.raises(
    ManifestError, match=r"part-00000.arrayrecord' holds 5 records, manifest says 4"
  ):
    read_manifest(str(tmp_path), verify_shards=True)
  raw["format_version"] = 9
  path.write_text(json.dumps(raw))
  with pytest.raises(ManifestError, match=r"format_version 9 is not supported \(expected 1\)"):
    read_manifest(str(tmp_path))
  del m


@pytest.mark.parametrize(
  "per_record, shards",
  [(1, [(4, 4), (4, 4), (4, 4), (4, 4), (4, 4), (3, 3)]), (3, [(4, 12), (4, 11)])],
)
def test_writer_records_are_each_record_encoded_alone(tmp_path, monkeypatch, per_record, shards):
  # Encode at most 5 examples at a time, so the batches below cross encoding slices too.
  monkeypatch.setattr(writer_lib, "_ENCODE_EXAMPLES", 5)
  schema = synthetic_schema(FEATURES, 2)
  stream = concat_batches(list(generate_batches(FEATURES, 2, 23, seed=4)))
  assert (stream.sparse["v"].row_lengths == 0).any()  # empty id lists are written too
  with ShardedRecordWriter(
    str(tmp_path / "ds"), schema, examples_per_record=per_record, max_records_per_shard=4
  ) as writer:
    start = 0
    for size in (4, 0, 1, 9, 9):
      writer.write_batch(slice_batch(stream, start, start + size))
      start += size
  manifest = writer.manifest
  assert [(s.num_records, s.num_examples) for s in manifest.shards] == shards
  source = manifest_source(manifest)
  codec = RecordCodec(schema)
  expected = [
    codec.encode_batch(slice_batch(stream, s, min(s + per_record, 23)))
    for s in range(0, 23, per_record)
  ]
  assert [source[i] for i in range(len(source))] == expected


def test_source_reads_keys_in_any_order_across_shards(tmp_path):
  manifest = write_synthetic(
    str(tmp_path), FEATURES, num_examples=30, seed=0, examples_per_record=1, max_records_per_shard=7
  )
  source = manifest_source(manifest)
  one_by_one = [source[i] for i in range(30)]
  keys = [29, 0, 7, 6, 7, 13, 28, 1, 0]
  assert source.__getitems__(keys) == [one_by_one[k] for k in keys]
  assert source.__getitems__(np.array(keys)) == [one_by_one[k] for k in keys]
  assert source.__getitems__([]) == []
  with pytest.raises(ValueError, match=r"^record key 30 is outside \[0, 30\)$"):
    source.__getitems__([3, 30])
  with pytest.raises(ValueError, match=r"^record key -1 is outside \[0, 30\)$"):
    source.__getitems__([-1, 3])


def _one_example_writer(directory, **options):
  writer = ShardedRecordWriter(str(directory), make_schema(0, {"a": 5}), **options)
  writer.write(Example(1.0, np.zeros(0, np.float32), {"a": np.array([1, 2])}))
  return writer


def _finish_elsewhere(tmp_path, out):
  """A dataset of 10 examples moved to `out`, as another process's writer does."""
  write_synthetic(str(tmp_path / "elsewhere"), FEATURES, num_examples=10, seed=0)
  os.rename(tmp_path / "elsewhere", out)


def _entries(root):
  return sorted(os.path.relpath(os.path.join(d, n), root) for d, _, ns in os.walk(root) for n in ns)


def test_a_dataset_that_appears_while_writing_is_kept_and_the_new_one_dropped(tmp_path):
  """Before: a second converter to the same new output replaced the dataset the
  first one had finished meanwhile, without --overwrite, both saying "wrote"."""
  out = tmp_path / "out"
  late = _one_example_writer(out)
  _finish_elsewhere(tmp_path, out)  # another converter's, finished first
  before = _entries(tmp_path)
  with pytest.raises(
    FileExistsError,
    match=r"^'.*/out' already holds a dataset \(manifest.json or 1 shard files\) \(it changed"
    r" while the dataset was written\); pass overwrite=True \(--overwrite\) to replace it$",
  ):
    late.close()
  assert _entries(tmp_path) == before  # no temporary directory left either
  assert read_manifest(str(out)).num_examples == 10


def test_saved_work_that_appears_while_writing_is_never_written_into(tmp_path):
  """Before: the shards and manifest were moved into a workdir made meanwhile."""
  out = tmp_path / "out"
  late = _one_example_writer(out, overwrite=True)
  (out / "checkpoints" / "4").mkdir(parents=True)
  (out / "job.json").write_text("{}")
  with pytest.raises(
    FileExistsError,
    match=r"^'.*/out' is a workdir \(it has job.json\) \(it changed while the dataset was"
    r" written\): a dataset never replaces or writes into one; choose another output$",
  ):
    late.close()
  assert _entries(tmp_path) == ["out/job.json"]


def test_splits_written_together_move_neither_when_one_output_changed(tmp_path):
  schema = make_schema(0, {"a": 5})
  example = Example(1.0, np.zeros(0, np.float32), {"a": np.array([3])})
  with pytest.raises(FileExistsError, match=r"'.*/eval' already holds a dataset .* \(it changed"):
    with writer_lib.written_together(
      {str(tmp_path / "train"): None, str(tmp_path / "eval"): None}, schema
    ) as writers:
      for w in writers:
        w.write(example)
      _finish_elsewhere(tmp_path, tmp_path / "eval")
  assert not os.path.exists(tmp_path / "train")
  assert read_manifest(str(tmp_path / "eval")).num_examples == 10
  assert sorted(os.listdir(tmp_path)) == ["eval"]

"""Damaged or truncated ArrayRecord shards: errors name shard and record, or are skipped."""

import numpy as np
import pytest

from sparsepipe.data import CorruptRecordError
from sparsepipe.data import ManifestError
from sparsepipe.data import ShardedRecordWriter
from sparsepipe.data import batch_from_examples
from sparsepipe.data import decode_batch
from sparsepipe.data import decode_records
from sparsepipe.data import make_schema
from sparsepipe.data import manifest_source
from sparsepipe.data import read_manifest
from sparsepipe.data.codec import RecordCodec
from sparsepipe.data.codec import UnreadableRecord
from sparsepipe.data.example import Example
from sparsepipe import transforms

SCHEMA = make_schema(1, {"a": 50})
PER_RECORD = 4
RECORDS = 600  # 2 shards of 400 and 200 records


@pytest.fixture()
def dataset(tmp_path):
  """2400 examples whose dense value is the example number; group_size 1 (a chunk per record)."""
  examples = [
    Example(float(i % 2), np.array([i], np.float32), {"a": np.array([i % 50, 7])})
    for i in range(RECORDS * PER_RECORD)
  ]
  with ShardedRecordWriter(
    str(tmp_path / "ds"), SCHEMA, examples_per_record=PER_RECORD, max_records_per_shard=400
  ) as writer:
    writer.write_batch(batch_from_examples(examples, SCHEMA))
  return writer.manifest


def _damage(path, start, stop):
  raw = bytearray(open(path, "rb").read())
  raw[start:stop] = bytes(b ^ 0xFF for b in raw[start:stop])
  open(path, "wb").write(raw)


def _unreadable(source, keys):
  return [k for k, r in zip(keys, source.__getitems__(keys)) if isinstance(r, UnreadableRecord)]


def _read_all(manifest, skip_corrupt):
  """Every example of the dataset in file order, as the input reads them."""
  order = transforms.ExampleOrder(manifest, shuffle=False)
  reader = transforms.ExampleReader(manifest, skip_corrupt=skip_corrupt)
  return reader.read(order.locate(0, manifest.num_examples))


def test_damaged_chunk_names_shard_and_record_or_is_skipped_and_counted(dataset):
  shard = dataset.shard_paths()[0]
  _damage(shard, 5000, 5100)
  bad = _unreadable(manifest_source(dataset), list(range(RECORDS)))
  assert bad and len(bad) < 5 and max(bad) < 400
  with pytest.raises(
    CorruptRecordError,
    match=(
      rf"^corrupt record {bad[0]} in '{shard}': ArrayRecord cannot read it: Corrupted"
      r" Riegeli/records file"
    ),
  ):
    _read_all(dataset, skip_corrupt=False)
  read = _read_all(dataset, skip_corrupt=True)
  assert read.num_corrupt_records == len(bad)
  lost = {PER_RECORD * r + k for r in bad for k in range(PER_RECORD)}
  expected = [i for i in range(RECORDS * PER_RECORD) if i not in lost]
  np.testing.assert_array_equal(read.examples.dense[:, 0], expected)


@pytest.mark.parametrize("keep", [0.5, 0.01])
def test_truncated_shard_names_the_shard(dataset, keep):
  shard = dataset.shard_paths()[1]
  raw = open(shard, "rb").read()
  open(shard, "wb").write(raw[: int(len(raw) * keep)])
  with pytest.raises(ManifestError, match=rf"^shard '{shard}' holds 0 records, manifest says 200$"):
    read_manifest(dataset.directory, verify_shards=True)
  source = manifest_source(dataset)
  record = source[450]
  assert isinstance(record, UnreadableRecord) and (record.path, record.index) == (shard, 50)
  with pytest.raises(
    CorruptRecordError,
    match=(
      rf"^corrupt record 50 in '{shard}': ArrayRecord cannot read it: the shard holds 0 readable"
      r" records, the manifest lists 200 \(truncated\?\)$"
    ),
  ):
    decode_batch(record, SCHEMA)
  assert _unreadable(source, list(range(RECORDS))) == list(range(400, RECORDS))
  decoded = decode_records(
    RecordCodec(SCHEMA), source.__getitems__(list(range(395, 405))), skip_corrupt=True
  )
  assert decoded.examples_per_record.tolist() == [4] * 5 + [0] * 5
  assert [str(e) for e in decoded.errors][0].startswith(
    f"corrupt record 0 in '{shard}': ArrayRecord cannot read it: "
  )


def test_unreadable_record_survives_pickling():
  import pickle  # pylint: disable=g-import-not-at-top  (Grain moves records between processes)

  record = pickle.loads(pickle.dumps(UnreadableRecord("why", "f", 3)))
  assert (bytes(record), record.reason, record.path, record.index) == (b"", "why", "f", 3)

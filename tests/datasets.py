"""Datasets the tests write: small ArrayRecord fixtures with known contents."""

import os

import numpy as np
from array_record.python import array_record_module

from sparsepipe import data


def write_with_corrupt_records(path, bad):
  """A one-shard dataset of 6 single-example records; records in `bad` are cut short."""
  schema = data.make_schema(1, {"a": 10})
  codec = data.RecordCodec(schema)
  os.makedirs(path)
  shard = os.path.join(path, "part-00000.arrayrecord")
  writer = array_record_module.ArrayRecordWriter(shard, "group_size:1")
  for i in range(6):
    record = codec.encode_example(data.Example(float(i), np.float32([i]), {"a": np.array([i])}))
    writer.write(record[:-4] if i in bad else record)
  writer.close()
  data.write_manifest(
    data.Manifest(path, schema, (data.ShardInfo("part-00000.arrayrecord", 6, 6),), 1)
  )
  return shard

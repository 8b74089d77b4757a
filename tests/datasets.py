"""Datasets the tests write: small ArrayRecord fixtures with known contents."""

import os

import numpy as np
from array_record.python import array_record_module

from sparsepipe import core
from sparsepipe import data
from sparsepipe import transforms


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


def write_numbered(
  path, features, num_examples, examples_per_record, max_records_per_shard, *, first=0
):
  """Synthetic examples whose dense[:, 0] is `first` + the example number (rest as generated)."""
  schema = data.synthetic_schema(features, 2)
  examples = data.concat_batches(list(data.generate_batches(features, 2, num_examples, 3)))
  examples.dense[:, 0] = np.arange(first, first + num_examples)
  with data.ShardedRecordWriter(
    path,
    schema,
    examples_per_record=examples_per_record,
    max_records_per_shard=max_records_per_shard,
  ) as writer:
    writer.write_batch(examples)
  return examples


def feature_specs(features, global_batch, global_devices, num_sc, *, limit=64, combiners=None):
  """Prepared specs: one dim-8 table per synthetic feature, the given limits and combiners."""
  specs = {}
  for i, f in enumerate(features):
    table = core.TableSpec(
      f"t_{f.name}",
      f.vocab_size,
      8,
      combiner=combiners[i] if combiners else "sum",
      max_ids_per_partition=limit,
      max_unique_ids_per_partition=limit,
    )
    specs[f.name] = core.FeatureSpec(f.name, table, (global_batch, 4), (global_batch, 8))
  return transforms.prepare_feature_specs_for_training(specs, global_devices, num_sc)

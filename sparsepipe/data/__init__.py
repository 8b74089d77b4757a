"""Examples on disk: schema, record codec, ArrayRecord writers and converters.

`convert_parquet` loads on first use (PEP 562): it needs pyarrow, whose import
(about 30 MB and 50-90 ms) every training process and data worker paid.
"""

from typing import TYPE_CHECKING, Any

from sparsepipe.data.ragged import RaggedBatch
from sparsepipe.data.schema import ExampleSchema
from sparsepipe.data.schema import SparseFeatureSchema
from sparsepipe.data.schema import make_schema
from sparsepipe.data.example import Example
from sparsepipe.data.example import ExampleBatch
from sparsepipe.data.example import ExampleBatchBuilder
from sparsepipe.data.example import batch_from_examples
from sparsepipe.data.example import concat_batches
from sparsepipe.data.example import example_at
from sparsepipe.data.example import select_examples
from sparsepipe.data.example import slice_batch
from sparsepipe.data.codec import CorruptRecordError
from sparsepipe.data.codec import FORMAT_VERSION
from sparsepipe.data.codec import RecordCodec
from sparsepipe.data.codec import RecordColumns
from sparsepipe.data.codec import UnreadableRecord
from sparsepipe.data.codec import decode_batch
from sparsepipe.data.codec import decode_example
from sparsepipe.data.codec import encode_batch
from sparsepipe.data.codec import encode_example
from sparsepipe.data.bulk_encode import encode_records
from sparsepipe.data.bulk_decode import DecodedRecords
from sparsepipe.data.bulk_decode import decode_records
from sparsepipe.data.manifest import MANIFEST_NAME
from sparsepipe.data.manifest import Manifest
from sparsepipe.data.manifest import ManifestError
from sparsepipe.data.manifest import RecordLocator
from sparsepipe.data.manifest import ShardInfo
from sparsepipe.data.manifest import read_manifest
from sparsepipe.data.manifest import write_manifest
from sparsepipe.data.writer import array_record_options
from sparsepipe.data.writer import ShardedRecordWriter
from sparsepipe.data.split import eval_mask
from sparsepipe.data.writer import write_batches
from sparsepipe.data.source import ShardSource
from sparsepipe.data.source import manifest_source
from sparsepipe.data.hashing import CategoryHasher
from sparsepipe.data.hashing import stable_hash64
from sparsepipe.data.convert.text_input import InputFormatError
from sparsepipe.data.convert.dense_stats import DenseStats
from sparsepipe.data.convert.dense_stats import SWAMP_MAGNITUDE
from sparsepipe.data.convert.dense_stats import scale_warnings
from sparsepipe.data.convert.vocab_sizing import VOCAB_CAP
from sparsepipe.data.convert.vocab_sizing import data_vocab_size
from sparsepipe.data.synthetic.generate import SyntheticFeature
from sparsepipe.data.synthetic.generate import criteo_like_features
from sparsepipe.data.synthetic.generate import generate_batches
from sparsepipe.data.synthetic.generate import synthetic_schema
from sparsepipe.data.synthetic.generate import write_synthetic
from sparsepipe.data.synthetic.click_model import synthetic_click_probabilities
from sparsepipe.data.criteo.convert import convert_criteo
from sparsepipe.data.criteo.convert import criteo_schema
from sparsepipe.data.csv.convert import convert_csv

if TYPE_CHECKING:
  from sparsepipe.data.parquet.convert import convert_parquet


def __getattr__(name: str) -> Any:
  """`convert_parquet`, imported with pyarrow on first use."""
  if name != "convert_parquet":
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  from sparsepipe.data.parquet.convert import convert_parquet  # pylint: disable=g-import-not-at-top

  globals()[name] = convert_parquet
  return convert_parquet

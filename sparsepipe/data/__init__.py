"""Examples on disk: schema, record codec, ArrayRecord writers and converters."""

from sparsepipe.data.ragged import RaggedBatch

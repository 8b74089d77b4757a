"""Parquet files -> a sharded ArrayRecord dataset (`python -m sparsepipe.data.parquet`)."""

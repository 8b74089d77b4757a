"""sparsepipe: a JAX training pipeline for large-embedding models."""

__version__ = "0.3.0"

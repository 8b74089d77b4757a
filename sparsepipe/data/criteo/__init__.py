"""Criteo click logs (TSV) -> a sharded ArrayRecord dataset (`python -m sparsepipe.data.criteo`)."""

"""The ZeRO-sharded dense optimizer (see sparsepipe.pipeline)."""

"""Sharded embedding tables: MOD layout, lookup/update kernels, optimizers (see sparsepipe.pipeline)."""

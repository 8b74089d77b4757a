"""Sharded embedding tables: layout, lookup/update kernels, optimizers (see sparsepipe.pipeline)."""

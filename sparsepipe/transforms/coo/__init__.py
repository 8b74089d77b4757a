"""COO preprocessing: ids -> SparseCore buffers and statistics (see sparsepipe.transforms)."""

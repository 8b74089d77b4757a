"""The host input: Grain stages from records to preprocessed batches (see sparsepipe.transforms)."""

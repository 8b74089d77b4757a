"""The device input: host batches placed on the mesh (see sparsepipe.pipeline)."""

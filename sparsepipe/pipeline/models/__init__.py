"""Reference dense (TC) stages: the DLRM model (see sparsepipe.pipeline)."""

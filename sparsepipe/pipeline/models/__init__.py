"""Models: their math only, `init` and `apply` (see sparsepipe.pipeline and model_protocol.py)."""

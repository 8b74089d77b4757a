"""Models: their math only, `init` and `apply` (see sparsepipe.pipeline and base.py)."""

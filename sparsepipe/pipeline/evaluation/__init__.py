"""Forward-only evaluation: eval step, eval pass and metrics (see sparsepipe.pipeline)."""

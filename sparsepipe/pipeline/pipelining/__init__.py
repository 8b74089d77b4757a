"""The pipelined step: PipelineState, step, default SC stages (see sparsepipe.pipeline)."""

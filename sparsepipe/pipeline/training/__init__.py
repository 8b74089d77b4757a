"""TrainState, the jitted trainer, the training loop, device placement (see sparsepipe.pipeline)."""

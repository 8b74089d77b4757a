"""The job: train_and_evaluate and its parts (model, checkpoints, eval, hooks, schedule)."""

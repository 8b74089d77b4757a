"""The job: train_and_evaluate and its parts (model, checkpoints, eval, hooks, schedule)."""

from sparsepipe.launch.job.run import JobResult
from sparsepipe.launch.job.run import MUTABLE_CONFIG_KEYS
from sparsepipe.launch.job.run import train_and_evaluate

"""The launcher: `python -m sparsepipe.launch` and the job it runs."""

from sparsepipe.launch.job.context import JobResult
from sparsepipe.launch.job.hooks import JobHook
from sparsepipe.launch.job.hooks import NonFiniteLossError
from sparsepipe.launch.job.run import MUTABLE_CONFIG_KEYS
from sparsepipe.launch.job.run import train_and_evaluate
from sparsepipe.launch.job.schedule import Position
from sparsepipe.launch.job.schedule import Schedule
from sparsepipe.launch.workdir.lock import LOCK_FILENAME
from sparsepipe.launch.workdir.lock import WorkdirInUseError
from sparsepipe.launch.workdir.lock import exclusive_workdir

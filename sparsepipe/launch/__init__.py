"""The launcher: `python -m sparsepipe.launch` and the job it runs."""

from sparsepipe.launch.job import JobResult
from sparsepipe.launch.job import MUTABLE_CONFIG_KEYS
from sparsepipe.launch.job import train_and_evaluate
from sparsepipe.launch.job.schedule import Position
from sparsepipe.launch.job.hooks import NonFiniteLossError
from sparsepipe.launch.job.schedule import SegmentSchedule
from sparsepipe.launch.job.workdir_lock import LOCK_FILENAME
from sparsepipe.launch.job.workdir_lock import WorkdirInUseError
from sparsepipe.launch.job.workdir_lock import exclusive_workdir

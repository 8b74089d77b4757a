"""The launcher: `python -m sparsepipe.launch` and the job it runs."""

from sparsepipe.launch.job import JobResult
from sparsepipe.launch.job import MUTABLE_CONFIG_KEYS
from sparsepipe.launch.job import train_and_evaluate
from sparsepipe.launch.schedule import Position
from sparsepipe.launch.step_hooks import NonFiniteLossError
from sparsepipe.launch.schedule import SegmentSchedule
from sparsepipe.launch.workdir_lock import LOCK_FILENAME
from sparsepipe.launch.workdir_lock import WorkdirInUseError
from sparsepipe.launch.workdir_lock import exclusive_workdir

"""The data workers: how a batch leaves a worker process; the workers start and stop together."""

from sparsepipe.transforms.input.workers.together import WorkersTogether
from sparsepipe.transforms.input.workers.transfer import PackArrays
from sparsepipe.transforms.input.workers.transfer import UnpackArrays

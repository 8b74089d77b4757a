"""Orbax checkpoints of the whole training state, exact resume, preemption."""

from sparsepipe.checkpointing.errors import CheckpointError
from sparsepipe.checkpointing.errors import CorruptCheckpointError
from sparsepipe.checkpointing.errors import IncompatibleCheckpointError
from sparsepipe.checkpointing.manager import DEFAULT_RELAYOUTS
from sparsepipe.checkpointing.manager import TrainingCheckpointManager
from sparsepipe.checkpointing.metadata import CheckpointMetadata
from sparsepipe.checkpointing.metadata import CHECKPOINT_FORMAT_VERSION
from sparsepipe.checkpointing.metadata import LoopPosition
from sparsepipe.checkpointing.metadata import RunInfo
from sparsepipe.checkpointing.preemption import PREEMPTED_EXIT_CODE
from sparsepipe.checkpointing.preemption import PreemptionWatcher
from sparsepipe.checkpointing.restore.relayout import Relayout
from sparsepipe.checkpointing.restore.relayout import RelayoutContext
from sparsepipe.checkpointing.restore.relayout import embedding_relayout
from sparsepipe.checkpointing.restore.relayout import pipeline_state_relayout
from sparsepipe.checkpointing.restore.relayout import resize_zero_padded
from sparsepipe.checkpointing.state import ARRAY_ITEMS
from sparsepipe.checkpointing.state import ITEM_NAMES
from sparsepipe.checkpointing.state import RestoredState
from sparsepipe.checkpointing.state import RestoreTargets
from sparsepipe.checkpointing.state import CheckpointItems
from sparsepipe.checkpointing.restore.targets import abstract_of
from sparsepipe.checkpointing.restore.targets import on_mesh
from sparsepipe.checkpointing.restore.iterator_states import read_iterator_states
from sparsepipe.checkpointing.restore.iterator_states import restore_resized_iterator

"""Shared basics below every other subpackage: specs, COO containers, batches, mesh."""

from sparsepipe.core.batch import EvalBatch
from sparsepipe.core.batch import TrainBatch
from sparsepipe.core.coo_types import PreprocessedInput
from sparsepipe.core.coo_types import SparseDenseMatmulInput
from sparsepipe.core.coo_types import SparseDenseMatmulInputStats
from sparsepipe.core.mesh import DATA_AXIS
from sparsepipe.core.mesh import data_sharding
from sparsepipe.core.mesh import make_mesh
from sparsepipe.core.mesh import replicated_sharding
from sparsepipe.core.rounding import round_up
from sparsepipe.core.signals import ignore_stop_signals_in_worker
from sparsepipe.core.initializers import ConstantInitializer
from sparsepipe.core.initializers import TruncatedNormalInitializer
from sparsepipe.core.initializers import UniformInitializer
from sparsepipe.core.optimizers import AdagradMomentumOptimizerSpec
from sparsepipe.core.optimizers import AdagradOptimizerSpec
from sparsepipe.core.optimizers import AdamOptimizerSpec
from sparsepipe.core.optimizers import FTRLOptimizerSpec
from sparsepipe.core.optimizers import LaPropOptimizerSpec
from sparsepipe.core.optimizers import OptimizerSpec
from sparsepipe.core.optimizers import SGDOptimizerSpec
from sparsepipe.core.specs import FeatureIdTransformation
from sparsepipe.core.specs import FeatureSpec
from sparsepipe.core.specs import StackedTableSpec
from sparsepipe.core.specs import TableSettingInStack
from sparsepipe.core.specs import TableSpec

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
from sparsepipe.core.specs import AdagradOptimizerSpec
from sparsepipe.core.specs import AdamOptimizerSpec
from sparsepipe.core.specs import ConstantInitializer
from sparsepipe.core.specs import FeatureIdTransformation
from sparsepipe.core.specs import FeatureSpec
from sparsepipe.core.specs import SGDOptimizerSpec
from sparsepipe.core.specs import StackedTableSpec
from sparsepipe.core.specs import TableSettingInStack
from sparsepipe.core.specs import TableSpec
from sparsepipe.core.specs import TruncatedNormalInitializer
from sparsepipe.core.specs import UniformInitializer

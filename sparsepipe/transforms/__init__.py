"""Per-host work on numpy: specs and stacking, COO preprocessing, FDO, Grain transforms."""

from sparsepipe.transforms.specs import AdagradOptimizerSpec
from sparsepipe.transforms.specs import AdamOptimizerSpec
from sparsepipe.transforms.specs import ConstantInitializer
from sparsepipe.transforms.specs import FeatureIdTransformation
from sparsepipe.transforms.specs import FeatureSpec
from sparsepipe.transforms.specs import SGDOptimizerSpec
from sparsepipe.transforms.specs import StackedTableSpec
from sparsepipe.transforms.specs import TableSettingInStack
from sparsepipe.transforms.specs import TableSpec
from sparsepipe.transforms.specs import TruncatedNormalInitializer
from sparsepipe.transforms.specs import UniformInitializer
from sparsepipe.transforms.batch import TrainBatch
from sparsepipe.transforms.coo_types import PreprocessedInput
from sparsepipe.transforms.coo_types import SparseDenseMatmulInput
from sparsepipe.transforms.coo_types import SparseDenseMatmulInputStats

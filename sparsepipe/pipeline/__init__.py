"""Everything that runs on devices: sharded embeddings, the pipelined step, ZeRO."""

from sparsepipe.pipeline.mesh import DATA_AXIS
from sparsepipe.pipeline.mesh import data_sharding
from sparsepipe.pipeline.mesh import make_mesh
from sparsepipe.pipeline.mesh import replicated_sharding

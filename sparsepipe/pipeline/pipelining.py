"""The pipelining API in one namespace (`from sparsepipe.pipeline import pipelining`).

Pipeline step i runs SC bwd(i-2) -> SC fwd(i) and, alongside, TC(i-1);
num_steps batches take num_steps + 2 pipeline steps. Typical use:

    state = pipelining.get_initial_state(batch0, tc_state, emb, fwd, tc,
                                         sharding=state_sharding)
    for i in range(pipelining.get_pipeline_train_steps(n)):
      inp = batches[i] if i < n else pipelining.get_dummy_input(state)
      out, _, tc_state, emb, state = jitted_step(
          inp, tc_state, emb, state,
          fake_tc_step=pipelining.is_fake_tc_step(i, n))
      if pipelining.is_output_valid(i, n):
        ...  # out belongs to batch i-1

where `jitted_step` wraps `pipelining.step` with `fake_tc_step` static,
donation and the shardings of `get_pipeline_state_sharding`. The training
loop in train_loop.py does exactly this for TrainBatch inputs.
"""

from sparsepipe.pipeline.pipeline_state import CurrentStepInput
from sparsepipe.pipeline.pipeline_state import LastStepInput
from sparsepipe.pipeline.pipeline_state import PipelineState
from sparsepipe.pipeline.pipeline_state import ScBwdStageFun
from sparsepipe.pipeline.pipeline_state import ScFwdStageFun
from sparsepipe.pipeline.pipeline_state import StepBeforeLastStepInput
from sparsepipe.pipeline.pipeline_state import TcStageFun
from sparsepipe.pipeline.pipeline_state import abstract_leaf
from sparsepipe.pipeline.pipeline_state import get_abstract_pipeline_state
from sparsepipe.pipeline.pipeline_state import get_dummy_input
from sparsepipe.pipeline.pipeline_state import get_initial_state
from sparsepipe.pipeline.pipeline_state import get_pipeline_state_sharding
from sparsepipe.pipeline.pipeline_state import get_pipeline_train_steps
from sparsepipe.pipeline.pipeline_state import is_fake_tc_step
from sparsepipe.pipeline.pipeline_state import is_output_valid
from sparsepipe.pipeline.pipeline_state import pipeline_input_sharding
from sparsepipe.pipeline.pipeline_state import zeros_from_abstract
from sparsepipe.pipeline.pipeline_step import step
from sparsepipe.pipeline.sc_stages import DefaultEmbeddingActivations
from sparsepipe.pipeline.sc_stages import DefaultEmbeddingGradients
from sparsepipe.pipeline.sc_stages import DefaultScBwdAux
from sparsepipe.pipeline.sc_stages import DefaultScFwdAux
from sparsepipe.pipeline.sc_stages import DefaultSparseInputs
from sparsepipe.pipeline.sc_stages import DefaultTcAux
from sparsepipe.pipeline.sc_stages import get_default_sc_bwd_function
from sparsepipe.pipeline.sc_stages import get_default_sc_fwd_function

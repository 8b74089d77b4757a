"""Everything that runs on devices, and the one public namespace for it.

embedding/   sharded tables: layout, lookup and update kernels, optimizers
pipelining/  PipelineState, the pipelined step, the default SC stages
zero/        the ZeRO-sharded dense optimizer
models/      models (their math only): the Model protocol, DLRM, DCN-v2, make_model
training/    TrainState, the TC stage of any model, the jitted trainer, the training loop
input/       host batches placed on the mesh: the train and eval input
evaluation/  the forward-only eval step, the eval pass, exact eval metrics
"""

from sparsepipe.pipeline.embedding.table_layout import EmbeddingLayoutError
from sparsepipe.pipeline.embedding.table_layout import StackLayout
from sparsepipe.pipeline.embedding.table_layout import logical_to_physical
from sparsepipe.pipeline.embedding.table_layout import physical_to_logical
from sparsepipe.pipeline.embedding.table_layout import stack_layouts
from sparsepipe.pipeline.embedding.lookup import sparse_dense_matmul
from sparsepipe.pipeline.embedding.update import UnsupportedOptimizerError
from sparsepipe.pipeline.embedding.variables import relayout_embedding_variables
from sparsepipe.pipeline.embedding.update import sparse_dense_matmul_grad
from sparsepipe.pipeline.embedding.variables import EmbeddingVariables
from sparsepipe.pipeline.embedding.variables import abstract_embedding_variables
from sparsepipe.pipeline.embedding.variables import embedding_variables_sharding
from sparsepipe.pipeline.embedding.variables import init_embedding_variables
from sparsepipe.pipeline.embedding.variables import stack_embedding_tables
from sparsepipe.pipeline.embedding.variables import stack_embedding_variables
from sparsepipe.pipeline.embedding.variables import row_sharding
from sparsepipe.pipeline.embedding.variables import table_sharding
from sparsepipe.pipeline.embedding.variables import unstack_embedding_tables
from sparsepipe.pipeline.embedding.variables import unstack_embedding_variables
from sparsepipe.pipeline.embedding.baseline import dense_lookup_baseline
from sparsepipe.pipeline.embedding.baseline import dense_sgd_update_baseline
from sparsepipe.pipeline.pipelining.pipeline_state import CurrentStepInput
from sparsepipe.pipeline.pipelining.pipeline_state import LastStepInput
from sparsepipe.pipeline.pipelining.pipeline_state import PipelineState
from sparsepipe.pipeline.pipelining.pipeline_state import ScBwdStageFun
from sparsepipe.pipeline.pipelining.pipeline_state import ScFwdStageFun
from sparsepipe.pipeline.pipelining.pipeline_state import StepBeforeLastStepInput
from sparsepipe.pipeline.pipelining.pipeline_state import TcStageFun
from sparsepipe.pipeline.pipelining.pipeline_state import get_abstract_pipeline_state
from sparsepipe.pipeline.pipelining.pipeline_state import get_dummy_input
from sparsepipe.pipeline.pipelining.pipeline_state import get_initial_state
from sparsepipe.pipeline.pipelining.pipeline_state import get_pipeline_state_sharding
from sparsepipe.pipeline.pipelining.pipeline_state import get_pipeline_train_steps
from sparsepipe.pipeline.pipelining.pipeline_state import pipeline_input_sharding
from sparsepipe.pipeline.pipelining.pipeline_state import is_fake_tc_step
from sparsepipe.pipeline.pipelining.pipeline_state import is_output_valid
from sparsepipe.pipeline.pipelining.step import step
from sparsepipe.pipeline.embedding.coo_relayout import CooRelayoutError
from sparsepipe.pipeline.embedding.coo_relayout import relayout_coo_buffers
from sparsepipe.pipeline.pipelining.sc_stages import get_default_sc_bwd_function
from sparsepipe.pipeline.pipelining.sc_stages import get_default_sc_fwd_function
from sparsepipe.pipeline.zero.optimizer import ScatteredGradients
from sparsepipe.pipeline.zero.optimizer import offer_scattered_gradients
from sparsepipe.pipeline.zero.optimizer import scatter_gradients
from sparsepipe.pipeline.zero.optimizer import zero_sharded
from sparsepipe.pipeline.models.model_protocol import Model
from sparsepipe.pipeline.models.model_protocol import feature_dims_of
from sparsepipe.pipeline.models.dcn_v2 import DCNv2
from sparsepipe.pipeline.models.dlrm import DLRM
from sparsepipe.pipeline.models.registry import BUILTIN_MODELS
from sparsepipe.pipeline.models.registry import make_model
from sparsepipe.pipeline.training.tc_stage import DenseInputs
from sparsepipe.pipeline.training.tc_stage import make_predict_fn
from sparsepipe.pipeline.training.tc_stage import make_tc_stage
from sparsepipe.pipeline.training.train_state import TrainState
from sparsepipe.pipeline.training.train_state import abstract_train_state
from sparsepipe.pipeline.training.train_state import create_train_state
from sparsepipe.pipeline.training.train_state import train_state_sharding
from sparsepipe.pipeline.training.trainer import Trainer
from sparsepipe.pipeline.training.mode import pipelining_pays_off
from sparsepipe.pipeline.training.loop import StepHook
from sparsepipe.pipeline.training.loop import StepResult
from sparsepipe.pipeline.training.loop import TrainMetrics
from sparsepipe.pipeline.training.trainer import batch_to_pipeline_input
from sparsepipe.pipeline.training.trainer import make_trainer
from sparsepipe.pipeline.training.loop import loss_of
from sparsepipe.pipeline.training.loop import train
from sparsepipe.pipeline.input.device_buffer import DevicePackedBatch
from sparsepipe.pipeline.input.device_buffer import abstract_packed_batch
from sparsepipe.pipeline.input.device_placement import LabelRangeError
from sparsepipe.pipeline.input.device_placement import abstract_train_batch
from sparsepipe.pipeline.input.device_placement import make_placement
from sparsepipe.pipeline.input.device_placement import to_global_batch
from sparsepipe.pipeline.input.train_input import make_eval_input
from sparsepipe.pipeline.input.train_input import make_train_input
from sparsepipe.pipeline.evaluation.metrics import LOGLOSS_EPS
from sparsepipe.pipeline.evaluation.metrics import EvalMetrics
from sparsepipe.pipeline.evaluation.metrics import auc
from sparsepipe.pipeline.evaluation.metrics import calibration
from sparsepipe.pipeline.evaluation.metrics import compute_metrics
from sparsepipe.pipeline.evaluation.metrics import format_metric
from sparsepipe.pipeline.evaluation.metrics import log_loss
from sparsepipe.pipeline.evaluation.metrics import gather_examples_across_processes
from sparsepipe.pipeline.evaluation.metrics import normalized_entropy
from sparsepipe.pipeline.evaluation.eval_step import EvalStep
from sparsepipe.pipeline.evaluation.eval_step import PredictFn
from sparsepipe.pipeline.evaluation.eval_step import evaluate
from sparsepipe.pipeline.evaluation.eval_step import make_eval_step

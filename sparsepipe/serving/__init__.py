"""Using a trained model: exports, predictions, incremental embedding exports."""

from sparsepipe.serving.dataset_check import DatasetMismatchError
from sparsepipe.serving.delta import apply_delta
from sparsepipe.serving.delta import changed_rows
from sparsepipe.serving.delta import check_applies
from sparsepipe.serving.delta import check_chain
from sparsepipe.serving.delta import rows_to_export
from sparsepipe.serving.export_format import ExportError
from sparsepipe.serving.export_format import ExportInfo
from sparsepipe.serving.export_format import new_export_id
from sparsepipe.serving.export_format import read_info
from sparsepipe.serving.export_format import write_export
from sparsepipe.serving.host_lookup import combined_embeddings
from sparsepipe.serving.output_paths import OutputPathError
from sparsepipe.serving.output_paths import check_export_output
from sparsepipe.serving.output_paths import check_file_output
from sparsepipe.serving.output_paths import saved_work
from sparsepipe.serving.predictor import Predictor
from sparsepipe.serving.scoring import score_dataset

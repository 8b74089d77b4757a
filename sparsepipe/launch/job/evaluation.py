"""Held-out evaluation in the job: when, on what, and where the numbers go.

The eval program is the train step's lookup and the dense forward only
(`pipeline.make_eval_step`); it reads the TrainState and writes nothing, so
a run with eval ends with the same state as one without. It is compiled
once per job: the eval batches use the worst-case COO limits of the batch
(config limits 0), which no batch can exceed, so FDO retunes of the train
step never recompile it and held-out data cannot hit a tuned limit.

When: after every `config.eval.every_steps` trained batches (after the
checkpoint of that boundary, on the current state: inside a pipelined run
the last one or two embedding updates are still in flight), and always at
the end, on the drained final state. A resumed job re-runs the eval of the
boundary it resumed at, so every eval point gets exactly one line.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sparsepipe import data
from sparsepipe import pipeline
from sparsepipe.launch.config import specs as config_specs
from sparsepipe.launch.config.from_manifest import check_manifests_agree
from sparsepipe.launch.job.model import JobModel
from sparsepipe.launch.job.metrics import MetricsLog
from sparsepipe.launch.job.metrics import ProgressLine
from sparsepipe.launch.job.tensorboard import TensorBoardWriter


class JobEval:
  """Runs eval passes of the job's model over `config.eval.data_dir`."""

  def __init__(
    self,
    model: JobModel,
    metrics: MetricsLog,
    progress: ProgressLine,
    tensorboard: TensorBoardWriter,
    *,
    data_dir: str,
    num_steps: int,
  ):
    config = model.config
    check_manifests_agree(
      data.read_manifest(model.input_config.data_dir), data.read_manifest(data_dir)
    )
    self.every = int(config.eval.every_steps)
    if self.every < 0:
      raise ValueError(f"eval.every_steps={self.every} must be >= 0 (0: only at the end)")
    self.num_steps = num_steps
    self.metrics = metrics
    self.progress = progress
    self.tensorboard = tensorboard
    specs = config_specs.build_feature_specs(
      config,
      global_batch_size=model.global_batch,
      global_device_count=model.mesh.size,
      worst_case_limits=True,
    )
    self.step = pipeline.make_eval_step(model.mesh, specs, model.num_sc, model.predict_fn(specs))
    input_config = dataclasses.replace(
      model.input_config, data_dir=data_dir, shuffle=False, num_workers=0
    )
    self.dataset = pipeline.make_eval_input_pipeline(input_config, specs, model.mesh)

  def due(self, trained: int) -> bool:
    """A periodic eval after `trained` batches (the end has its own)."""
    return bool(self.every) and 0 < trained < self.num_steps and trained % self.every == 0

  def run(self, train_state: Any, trained: int) -> pipeline.EvalMetrics:
    """One full pass; logs `{"event": "eval", "batch": trained, ...}`."""
    result = pipeline.evaluate(self.step, train_state, iter(self.dataset))
    record = {"event": "eval", "batch": trained, **result.as_dict()}
    self.metrics.write(record)
    self.tensorboard.scalars(trained, {f"eval/{k}": v for k, v in result.as_dict().items()})
    self.tensorboard.flush()
    self.progress.message(
      f"eval after {trained} batches: AUC {result.auc:.4f}, log loss {result.logloss:.4f},"
      f" NE {result.ne:.4f}, calibration {result.calibration:.3f}"
      f" ({result.examples:,} examples)"
    )
    return result

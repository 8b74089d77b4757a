"""Held-out evaluation in the job: when, on what, and where the numbers go.

The eval program is the train step's lookup and the dense forward only
(`pipeline.make_eval_step`); it reads the TrainState and writes nothing, so
a run with eval ends with the same state as one without. It is compiled
once per job: the eval batches use the worst-case COO limits of the batch
(config limits 0) for the most ids per example of the eval data's manifest
or the config (the eval data may have more than the train data), which no
eval batch can exceed, so FDO retunes of the train step never recompile it,
held-out data cannot hit a limit and no id is dropped (the eval input never
drops ids, whatever data.allow_id_dropping says).

When (hooks.EvalHook): at the batch boundary of every
`config.eval.every_steps`-th batch (after that boundary's checkpoint, on the
current state: inside a pipelined run the last embedding update is still in
flight), and always at the end, on the drained final state. A resumed job
runs the eval of the boundary it resumed at if it had not finished before,
so every eval point gets exactly one line. In one process, a stop signal
abandons an eval at its next batch (a long eval would outlast a
preemption's grace period): the job saves that boundary and exits, and
its rerun runs the eval. Under jax.distributed the processes cannot agree
on an eval batch to stop at, so an eval there ends before the stop.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sparsepipe import data
from sparsepipe import pipeline
from sparsepipe.launch.config import config_specs
from sparsepipe.launch.config.from_manifest import check_manifests_agree
from sparsepipe.launch.config.from_manifest import with_recorded_max_ids
from sparsepipe.launch.job.model import JobModel


class JobEval:
  """Eval passes of the job's model over an eval set (`config.eval.data_dir`)."""

  def __init__(self, model: JobModel, *, data_dir: str):
    config = model.config
    manifest = data.read_manifest(data_dir)
    check_manifests_agree(model.manifest, manifest)
    self.every = int(config.eval.every_steps)
    if self.every < 0:
      raise ValueError(f"eval.every_steps={self.every} must be >= 0 (0: only at the end)")
    # The worst case of the eval data: it may have more ids per example than the
    # train data config.features.*.max_ids were set from.
    specs = config_specs.build_feature_specs(
      with_recorded_max_ids(config, manifest),
      global_batch_size=model.global_batch,
      global_device_count=model.mesh.size,
      worst_case_limits=True,
    )
    self.step = pipeline.make_eval_step(model.mesh, specs, model.num_sc, model.predict_fn(specs))
    # No batch exceeds these limits, so none drops ids (allow_id_dropping is the
    # train input's): one that did would be an error, not a wrong metric.
    input_config = dataclasses.replace(
      model.input_config,
      data_dir=data_dir,
      shuffle=False,
      num_workers=0,
      allow_id_dropping=False,
    )
    self.dataset = pipeline.make_eval_input(input_config, specs, model.mesh)

  def run(self, train_state: Any, stop: Any = None) -> pipeline.EvalMetrics | None:
    """One full pass over the eval set; None if `stop()` abandoned it (pipeline.evaluate)."""
    return pipeline.evaluate(self.step, train_state, iter(self.dataset), stop=stop)

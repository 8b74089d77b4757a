"""python -m sparsepipe.launch.evaluate --workdir W [--step N] [--eval_data_dir DIR]

Evaluates a saved checkpoint without training: reads the job's config from
the checkpoint, restores its model (onto this machine's devices, re-laid out
if their number changed) and runs one eval pass over the job's eval set (or
`--eval_data_dir`, which must have the train set's features). Prints one
line of metrics; `--json PATH` also writes them (a new file, or one replaced
with `--overwrite`; never inside a workdir, dataset or export, checked
before the eval runs). The training data need not be there (the checkpoint
holds a copy of its manifest). Nothing in the workdir changes.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from absl import app
from absl import flags

# Nothing here imports JAX, Orbax or Grain (main does, seconds): --help and a bad
# flag answer at once (command_line.py).
from sparsepipe import command_line


def _define_flags() -> None:
  flags.DEFINE_string("workdir", None, "The job's workdir.", required=True)
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the newest intact one).")
  flags.DEFINE_string("eval_data_dir", None, "Eval dataset (default: the job's).")
  flags.DEFINE_string("json", None, "Also write the metrics to this JSON file.")
  flags.DEFINE_bool("overwrite", False, "Replace an existing --json file.")
  flags.DEFINE_integer(
    "cpu_devices", 0, "Simulate this many CPU devices (0: the platform's devices).", lower_bound=0
  )
  flags.DEFINE_bool("verbose", False, "On an error, print the traceback.")


def evaluate_checkpoint(
  workdir: str, *, step: int | None = None, eval_data_dir: str | None = None
) -> tuple[int, int, Any]:
  """(checkpoint step, batches trained, EvalMetrics) of a saved checkpoint."""
  from sparsepipe import checkpointing  # pylint: disable=g-import-not-at-top
  from sparsepipe import core  # pylint: disable=g-import-not-at-top
  from sparsepipe.launch.job import training_data  # pylint: disable=g-import-not-at-top
  from sparsepipe.launch.job import checkpoints  # pylint: disable=g-import-not-at-top
  from sparsepipe.launch.job.evaluation import JobEval  # pylint: disable=g-import-not-at-top
  from sparsepipe.launch.job.model import JobModel  # pylint: disable=g-import-not-at-top

  workdir = os.path.abspath(workdir)
  saved = checkpoints.saved_job(workdir, step)
  config = saved.config
  # The job's compilation cache (core/compile_cache.py), before anything compiles.
  core.compile_cache.enable(
    config.get("compilation_cache_dir", core.compile_cache.AUTO), refused="warn"
  )
  mesh = core.make_mesh()
  manifest = training_data.training_manifest(saved, workdir)
  model = JobModel(config, manifest, mesh)
  eval_dir = (
    training_data.given_dataset("--eval_data_dir", eval_data_dir)
    if eval_data_dir
    else training_data.eval_data_dir(config, workdir)
  )
  if not eval_dir:
    raise ValueError(f"the job in '{workdir}' has no eval set: give --eval_data_dir")
  run = checkpointing.RunInfo.create(config, mesh, data_worker_count=int(config.data.num_workers))
  # Without `step`, the newest intact step as of now: a running job may have
  # deleted the step whose config was read (it keeps only its newest steps).
  restored = checkpoints.restore_saved_model(saved.directory, model, run, step)
  training_data.check_training_data(saved.directory, restored.checkpoint_step, manifest)
  evaluation = JobEval(model, data_dir=eval_dir)
  trained = restored.position.batches_trained
  return restored.checkpoint_step, trained, evaluation.run(restored.train_state)


def main(argv) -> int:
  command_line.start_command(argv)
  # Imported here, after the flags: each imports JAX (seconds), which --help need not wait for.
  import jax  # pylint: disable=g-import-not-at-top

  from sparsepipe.core import write_errors  # pylint: disable=g-import-not-at-top
  from sparsepipe.serving import output_paths  # pylint: disable=g-import-not-at-top

  f = flags.FLAGS
  if f.json:  # before the eval: nothing saved is replaced, no eval is wasted
    output_paths.check_file_output(f.json, overwrite=f.overwrite, what="metrics", flag="--json")
  if f.cpu_devices:
    jax.config.update("jax_num_cpu_devices", f.cpu_devices)
  step, trained, metrics = evaluate_checkpoint(
    f.workdir, step=f.step, eval_data_dir=f.eval_data_dir
  )
  from sparsepipe.launch.job.metrics_log import json_line  # pylint: disable=g-import-not-at-top

  record = {"step": step, "batch": trained, **metrics.as_dict()}
  print(f"checkpoint {step} (after batch {trained}): {metrics.describe()}")
  if f.json:
    with write_errors.written_whole("the metrics", os.path.abspath(f.json)) as tmp:
      with open(tmp, "w") as out:
        out.write(json_line(record))  # a NaN (one class only) as null
  return 0


if __name__ == "__main__":
  _define_flags()
  sys.exit(app.run(command_line.reports_errors(main), flags_parser=command_line.parse_flags))

"""What a job tells people at its start and end, and the JobResult it returns.

One convention in every line: batch n is the n-th batch trained
(schedule.py), and a checkpoint step is the number of batches trained.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax

from sparsepipe import pipeline
from sparsepipe.launch.job.context import JobContext
from sparsepipe.launch.job.context import JobResult


def _count(n: int, noun: str) -> str:
  return f"{n} {noun}" if n == 1 else f"{n} {noun}es" if noun.endswith("s") else f"{n} {noun}s"


def _mesh(job: JobContext) -> str:
  return f"{_count(job.model.mesh.size, 'device')} ({_count(jax.process_count(), 'process')})"


# A job warns when it trains more than this many epochs (passes over the data).
MANY_EPOCHS = 100


def _ids(lo: int, hi: int, recorded: Any) -> str:
  """Ids per example: the data's most and mean (its manifest), else the config's range."""
  if isinstance(recorded, Mapping) and "max" in recorded and "mean" in recorded:
    most, mean = int(recorded["max"]), float(recorded["mean"])
    if most == 1 and mean == 1.0:
      text = "1 id per example"
    elif most <= 1:
      text = f"0 or 1 ids per example (mean {mean:.2f})"
    else:
      text = f"up to {most} ids per example (mean {mean:.2f})"
    return text if hi == most else f"{text}, max_ids {hi}"
  if lo == hi:
    return f"{hi} id{'s' if hi != 1 else ''} per example"
  if (lo, hi) == (0, 1):
    return "0 or 1 ids per example"
  return f"{lo} to {hi} ids per example"


def features(job: JobContext) -> list[str]:
  """One line per feature (vocabulary, ids per example, combiner, table dim), in the
  data's column order (C1, C2, ..., C10), not the config's sorted one (C1, C10, ...)."""
  lines = []
  recorded = getattr(job.model, "ids_per_example", {})
  in_data = {name: i for i, name in enumerate(job.model.manifest.schema.feature_names)}
  for name, feature in sorted(
    job.config.features.items(), key=lambda item: (in_data.get(item[0], len(in_data)), item[0])
  ):
    ids = _ids(int(feature.min_ids), int(feature.max_ids), recorded.get(name))
    lines.append(
      f"  feature '{name}': vocab {int(feature.vocab_size):,}, {ids},"
      f" combiner {feature.combiner}, table dim {int(job.config.model.embedding_dim)}"
    )
  return lines


def fresh_start(job: JobContext) -> None:
  n, batch = job.schedule.num_steps, job.global_batch
  epochs = job.epoch(n)
  job.output.message(
    f"sparsepipe: training {n:,} batches of {batch:,} ({epochs:.2f} epochs of"
    f" {job.model.epoch_examples:,} examples) on {_mesh(job)}; workdir {job.workdir}"
  )
  for line in features(job):
    job.output.message(line)
  for warning in data_warnings(job):
    job.output.message(f"warning: {warning}")


def data_warnings(job: JobContext) -> list[str]:
  """What the data's manifest and the batch size say will go wrong: dense columns
  stored at a scale that swamps the model, a batch larger than the dataset,
  more than MANY_EPOCHS passes over it."""
  out = list(getattr(job.model, "dense_warnings", ()))
  n, batch, examples = job.schedule.num_steps, job.global_batch, job.model.epoch_examples
  epochs = job.epoch(n)
  if batch > examples:
    out.append(
      f"a batch of {batch:,} examples is larger than the dataset ({examples:,} examples):"
      f" each batch holds every example {batch / examples:.1f} times on average, and"
      f" {n:,} batches are {epochs:,.0f} epochs; lower --config.global_batch_size (or"
      " per_host_batch_size) or train on more data"
    )
  elif epochs > MANY_EPOCHS:
    # By epochs, num_steps follows from num_epochs: lowering it would change nothing.
    lower = (
      "--config.num_epochs"
      if float(job.config.num_epochs) > 0
      else "--config.num_steps (or train a number of epochs: --config.num_epochs)"
    )
    out.append(
      f"{n:,} batches of {batch:,} are {epochs:,.0f} epochs over {examples:,} examples (more"
      f" than {MANY_EPOCHS}): the model will learn these examples by heart; lower {lower}"
      " or train on more data"
    )
  return out


def resumed(job: JobContext, restored) -> None:
  """The resume line: where, from which step, and what changed; after an
  extension, the data's warnings for the new length (data_warnings)."""

  trained, num_steps = job.batch, job.schedule.num_steps
  where = job.checkpoints.mngr.where(restored.checkpoint_step)
  parts = [f"sparsepipe: resumed after batch {trained:,} ({where})"]
  saved_run = job.checkpoints.mngr.read_metadata(restored.checkpoint_step).run
  if (
    saved_run.device_count != job.model.mesh.size or saved_run.process_count != jax.process_count()
  ):
    parts.append(
      f"re-laid out from {_count(saved_run.device_count, 'device')}"
      f" ({_count(saved_run.process_count, 'process')}) to {_mesh(job)}"
    )
  old_steps = int(saved_run.config.get("num_steps", num_steps))
  if num_steps > old_steps:
    parts.append(
      f"num_steps raised from {old_steps:,} to {num_steps:,}: training"
      f" {num_steps - trained:,} more batches"
    )
  else:
    parts.append(f"{num_steps - trained:,} batches to go of {num_steps:,}")
  job.output.event("resume", trained, "; ".join(parts), step=restored.checkpoint_step)
  if num_steps > old_steps:  # an extension: what its new length will do, as at a fresh start
    for warning in data_warnings(job):
      job.output.message(f"warning: {warning}")


def result(job: JobContext) -> JobResult:
  """What the job did in this process's run."""
  metrics = job.train_metrics
  seconds = sum(m.seconds for m in metrics)
  examples = sum(m.examples for m in metrics)
  hooks = job.hooks
  evaluation = hooks.get("evaluation")
  return JobResult(
    batches_trained=job.batch,
    position=job.position,
    checkpoint_step=hooks["checkpoints"].last_saved if hooks else job.resumed_from,
    resumed_from=job.resumed_from,
    preempted=job.preempted,
    last_loss=hooks["losses"].last_loss if hooks else None,
    examples_per_second=examples / seconds if seconds > 0 else 0.0,
    steady_examples_per_second=hooks["progress"].steady_rate() if hooks else None,
    last_eval=evaluation.last_eval if evaluation else None,
  )


def already_trained(job: JobContext) -> JobResult:
  """The job trained this run's num_steps already: what the saved job has, and how to go on.

  The saved num_steps may be above this run's (a job raised with
  --config.num_steps or num_epochs, rerun without them): both are named. A
  run by epochs is told to raise num_epochs, which sets its num_steps.
  """
  saved = job.checkpoints.mngr.read_metadata(job.resumed_from).run.config
  has = f"num_steps {int(saved['num_steps']):,} saved"
  if float(saved.get("num_epochs", 0)) > 0:
    has += f", from num_epochs {float(saved['num_epochs']):g}"
  epochs = float(job.config.num_epochs)
  # By epochs, num_steps follows from them: raising it would change nothing; the
  # saved job's epochs, when more, are what the next run must pass.
  hint = (
    f"--config.num_epochs above {max(epochs, float(saved.get('num_epochs', 0))):g}"
    if epochs > 0
    else f"--config.num_steps above {job.batch:,}"
  )
  job.output.message(
    f"sparsepipe: the job in {job.workdir} has trained {job.batch:,} batches ({has};"
    f" checkpoint {job.resumed_from}); this run's num_steps is {job.schedule.num_steps:,}:"
    f" nothing to train. To train more, raise {hint}"
  )
  return result(job)


def done(job: JobContext) -> JobResult:
  """The `done` record, and the summary line of what this run trained or evaluated
  (a rerun that only finished the final eval has its AUC, no loss)."""
  out = result(job)
  job.output.event("done", job.batch)
  if out.last_loss is None and out.last_eval is None:
    return out
  parts = [f"{job.batch:,} batches"]
  if out.last_loss is not None:
    parts.append(f"last loss {out.last_loss:.4f}")
  if out.last_eval is not None:
    parts.append(f"eval AUC {pipeline.format_metric(out.last_eval.auc)}")
  if out.last_loss is not None:
    steady = out.steady_examples_per_second
    rate = f"{out.examples_per_second:,.0f} examples/s"
    parts.append(rate if steady is None else f"{rate} ({steady:,.0f} in steady state)")
  job.output.message(
    f"sparsepipe: done: {', '.join(parts)}; checkpoint {out.checkpoint_step} in"
    f" {job.checkpoints.mngr.directory}; metrics in {job.output.metrics_path}"
  )
  return out

"""What a job tells people at its start and end, and the JobResult it returns.

One convention in every line: batch n is the n-th batch trained
(schedule.py), and a checkpoint step is the number of batches trained.
"""

from __future__ import annotations

import jax

from sparsepipe.launch.job.context import JobContext
from sparsepipe.launch.job.context import JobResult


def _count(n: int, noun: str) -> str:
  return f"{n} {noun}" if n == 1 else f"{n} {noun}es" if noun.endswith("s") else f"{n} {noun}s"


def _mesh(job: JobContext) -> str:
  return f"{_count(job.model.mesh.size, 'device')} ({_count(jax.process_count(), 'process')})"


def features(job: JobContext) -> list[str]:
  """One line per feature: vocabulary, ids per example, combiner, table dim."""
  lines = []
  for name, feature in sorted(job.config.features.items()):
    lo, hi = int(feature.min_ids), int(feature.max_ids)
    ids = f"{hi} id{'s' if hi != 1 else ''}" if lo == hi else f"{lo} to {hi} ids"
    lines.append(
      f"  feature '{name}': vocab {int(feature.vocab_size):,}, {ids} per example,"
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


def resumed(job: JobContext, restored) -> None:
  """The resume line: where, from which step, and what changed."""

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
  job.output.message(
    f"sparsepipe: already trained {job.batch:,} batches (checkpoint {job.resumed_from} in"
    f" {job.checkpoints.mngr.directory}); num_steps is {job.schedule.num_steps:,}: raise"
    " --config.num_steps to train more"
  )
  return result(job)


def done(job: JobContext) -> JobResult:
  out = result(job)
  job.output.event("done", job.batch)
  if out.last_loss is not None:
    auc = "" if out.last_eval is None else f", eval AUC {out.last_eval.auc:.4f}"
    steady = out.steady_examples_per_second
    rate = f"{out.examples_per_second:,.0f} examples/s"
    if steady is not None:
      rate += f" ({steady:,.0f} in steady state)"
    job.output.message(
      f"sparsepipe: done: {job.batch:,} batches, last loss {out.last_loss:.4f}{auc}, {rate};"
      f" checkpoint {out.checkpoint_step} in {job.checkpoints.mngr.directory};"
      f" metrics in {job.output.metrics_path}"
    )
  return out

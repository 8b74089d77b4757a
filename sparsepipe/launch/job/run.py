"""train_and_evaluate: the whole job, from config and workdir to a trained model.

The job is the library's loop, `pipeline.train(..., hooks=...)`, once per
segment (schedule.py), with the job's hooks (hooks.py) over one context
(context.py); between segments FDO retunes the COO limits (fdo.py).
Everything a resumed job needs is in the newest intact checkpoint, on any
mesh and process count; the resumed job trains exactly the batches an
uninterrupted one would, bit-identical when the mesh is unchanged.

Call on every process (after jax.distributed.initialize when multi-host).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import jax

from sparsepipe import checkpointing
from sparsepipe import data
from sparsepipe import core
from sparsepipe import pipeline
from sparsepipe import transforms
from sparsepipe.launch.config import from_manifest
from sparsepipe.launch.config import config_specs
from sparsepipe.launch.config.checks import check_config
from sparsepipe.launch.config.known_fields import complete_config
from sparsepipe.launch.config.same_config import check_same_config
from sparsepipe.launch.job import announce
from sparsepipe.launch.job import training_data
from sparsepipe.launch.job import fdo
from sparsepipe.launch.job.checkpoints import BATCH_STEPS_FORMAT
from sparsepipe.launch.job.checkpoints import CONFIG_RULES
from sparsepipe.launch.job.checkpoints import in_flight_bytes
from sparsepipe.launch.job.checkpoints import JobCheckpoints
from sparsepipe.launch.job.checkpoints import resolve_job_defaults
from sparsepipe.launch.job.context import JobContext
from sparsepipe.launch.job.context import JobResult
from sparsepipe.launch.job.evaluation import JobEval
from sparsepipe.launch.job.hooks import make_hooks
from sparsepipe.launch.job.model import JobModel
from sparsepipe.launch.job.model import Setup
from sparsepipe.launch.job.job_output import JobOutput
from sparsepipe.launch.job.schedule import Schedule
from sparsepipe.launch.job.startup import StartupTimer
from sparsepipe.launch import stopping
from sparsepipe.launch.workdir import owner
from sparsepipe.launch.workdir.lock import exclusive_workdir
from sparsepipe.launch.workdir.lock import WorkdirLease
from sparsepipe.launch.workdir.location import check_workdir

# What to do when a batch exceeds the COO limits: the first limits (config.limits),
# or FDO's, tuned on the batches before it. A rerun that drops such ids resumes the
# job (the statistics count every id, so the next retune raises the limits to fit).
LIMIT_HINT = (
  "rerun with --config.data.allow_id_dropping=true to go on (such ids are dropped and"
  " counted: dropped_ids_largest_host in metrics.jsonl's fdo records; the next FDO retune"
  " raises the limits to fit), or start a new job with more room: a larger"
  " config.fdo.headroom (over the counts FDO saw) or fdo.first_after (more batches before"
  " the first retune); before a retune the limits are config.limits.* (0: the worst case"
  " of the batch, always enough)"
)


def _absolute_dataset_paths(config: Any) -> None:
  """config.data.dir and config.eval.data_dir made absolute, so that the saved
  config names them wherever launch.evaluate or launch.export later run."""
  if config.data.dir:
    config.data.dir = os.path.abspath(config.data.dir)
  if config.eval.data_dir:
    config.eval.data_dir = os.path.abspath(config.eval.data_dir)


class _Job:
  """One process's share of a job (see train_and_evaluate)."""

  def __init__(self, config: Any, workdir: str, config_name: str):
    self.startup = StartupTimer()
    _absolute_dataset_paths(config)
    if config.features_from_manifest:
      config = from_manifest.apply_manifest(config)
    self.mesh = core.make_mesh()
    check_config(config, self.mesh)  # named before any data is made
    self.config = config
    self.config_name = config_name
    self.workdir = os.path.abspath(workdir)
    os.makedirs(self.workdir, exist_ok=True)
    resolve_job_defaults(config, self.workdir, self.mesh)  # before anything reads them
    by_epochs = float(config.num_epochs) > 0
    if not by_epochs:  # a bad num_steps is named before any data is made
      self.schedule = Schedule.from_config(config)
    is_chief = jax.process_index() == 0
    eval_dir = training_data.eval_data_dir(config, self.workdir)  # a bad eval.data_dir: before data
    data_dir = training_data.ensure_dataset(
      config,
      self.workdir,
      show_progress=is_chief,
      check_owner=lambda: owner.refuse_another_config(self.workdir, config_name),
    )
    self.model = JobModel(config, data.read_manifest(data_dir), self.mesh)
    if by_epochs:  # num_steps follows from the data's size
      config.num_steps = config_specs.num_steps_of_epochs(config, self.model.epoch_examples)
      self.schedule = Schedule.from_config(config)
    self.model.last_retune = self.schedule.retune_points.last_at_or_before  # input switches there
    self.output = JobOutput(self.workdir, total_batches=self.schedule.num_steps)
    self.evaluation = JobEval(self.model, data_dir=eval_dir) if eval_dir else None
    self.run_info = checkpointing.RunInfo.create(
      config, self.mesh, data_worker_count=self.model.input_config.num_workers
    )
    self.startup.mark("data")

  def run(self, lease: WorkdirLease) -> JobResult:
    """Trains and evaluates; `lease` is kept once the job is the workdir's (_start)."""
    ckpt = self.config.checkpoint
    with checkpointing.TrainingCheckpointManager(
      os.path.join(self.workdir, checkpointing.CHECKPOINTS_DIRNAME),
      self.run_info,
      keep_latest=int(ckpt.keep),
      async_save=bool(ckpt.async_save),
      fingerprint_arrays=bool(ckpt.verify_arrays),
      host_copy_gb=float(ckpt.host_copy_gb),
      data_file_mb=float(ckpt.data_file_mb),
      in_flight_bytes=in_flight_bytes(self.model),
      **CONFIG_RULES,
    ) as mngr:
      job = None
      try:
        with checkpointing.PreemptionWatcher(mngr) as watcher:
          stopping.training_begins()  # the launcher's handler is back only to close
          try:
            job = self._start(JobCheckpoints(mngr, self.model), watcher, lease)
          except checkpointing.ConfigMismatchError as e:
            raise owner.another_job_error(self.workdir, e) from e
          self.startup.mark("state")
          self.startup.restored = job.resumed_from is not None
          try:
            return self._train(job)
          except transforms.LimitExceededError as e:
            raise transforms.LimitExceededError(f"{e}; {LIMIT_HINT}") from e
      finally:
        # Saved and written by now: a stop while the workers close is the launcher's
        # "while closing" one (under the watcher, a second Ctrl-C said "without saving").
        if job is not None:
          job.setup.close()
        self.startup.close()
        self.output.close()

  def _context(self, ckpts, watcher, setup, train_state, pipeline_state, position, resumed, job_id):
    return JobContext(
      config=self.config,
      workdir=self.workdir,
      model=self.model,
      schedule=self.schedule,
      output=self.output,
      checkpoints=ckpts,
      watcher=watcher,
      evaluation=self.evaluation,
      setup=setup,
      train_state=train_state,
      pipeline_state=pipeline_state,
      position=position,
      job_id=job_id,
      resumed_from=resumed,
      startup=self.startup,
    )

  def _start(self, ckpts: JobCheckpoints, watcher: Any, lease: WorkdirLease) -> JobContext:
    """The newest checkpoint, or a fresh state at the start (announced either way).

    The workdir is kept from the moment it holds the job (job.json written, or a
    checkpoint restored): a launch that fails or is stopped before that leaves no
    workdir it made, nor the data it generated there (WorkdirLease). A start that
    fails closes its input: its data workers stop now, not at exit, where
    closing them hung.
    """
    training_data.check_resumed_data(ckpts.mngr, self.model.manifest)
    restored = ckpts.restore()
    setup = self.model.setup(self.model.base_specs) if restored is None else restored.setup
    try:
      if restored is None:
        return self._fresh(ckpts, watcher, setup, lease)
      return self._resumed(ckpts, watcher, restored, lease)
    except BaseException:
      setup.close()
      raise

  def _fresh(self, ckpts: JobCheckpoints, watcher: Any, setup: Setup, lease: WorkdirLease):
    setup.iterator.start_prefetch()  # the workers start while the state is made
    job = self._context(
      ckpts,
      watcher,
      setup,
      self.model.fresh_train_state(),
      None,
      self.schedule.first(),
      None,
      owner.new_job_id(),
    )
    owner.write_job_record(self.workdir, owner.new_job_record(job.job_id, self.config_name))
    lease.keep()
    self.output.resume_after(0)
    announce.fresh_start(job)
    return job

  def _resumed(self, ckpts: JobCheckpoints, watcher: Any, restored: Any, lease: WorkdirLease):
    if restored.format_version < BATCH_STEPS_FORMAT:
      raise checkpointing.IncompatibleCheckpointError(
        f"{ckpts.mngr.where(restored.checkpoint_step)} was written by sparsepipe 0.2 (checkpoint"
        f" format {restored.format_version}), whose checkpoint steps count pipeline steps; this"
        " version numbers them by batches and cannot train on from it: finish the job with"
        " sparsepipe 0.2, or start it again in a new --workdir (launch.evaluate and"
        " launch.export read the old steps)"
      )
    lease.keep()
    position = self.schedule.resume(restored.position)
    job = self._context(
      ckpts,
      watcher,
      restored.setup,
      restored.train_state,
      restored.pipeline_state,
      position,
      restored.checkpoint_step,
      restored.job_id,
    )
    self.output.resume_after(position.batches_trained)
    if job.batch < self.schedule.num_steps:
      announce.resumed(job, restored)
    return job

  def _train(self, job: JobContext) -> JobResult:
    if job.batch >= self.schedule.num_steps:
      at_end = job.batch == self.schedule.num_steps and job.evaluation is not None
      if at_end and not job.output.recorded("eval", job.batch):  # a kill or stop cut it short
        return self._final_eval(job)
      return announce.already_trained(job)
    hooks = make_hooks(job)
    for hook in job.hooks.values():
      hook.start()
    if job.watcher.should_stop(job.batch):  # every process asks at the same boundary
      return _stopped_before_training(job)
    while True:
      if not job.position.finished:
        job.train_state, job.pipeline_state, metrics = pipeline.train(
          job.setup.trainer,
          job.train_state,
          job.setup.iterator,
          job.position.length,
          pipeline_state=job.pipeline_state,
          hooks=hooks,
          carried_in=job.position.carried_in,
          drain=job.position.drains,
        )
        job.train_metrics.append(metrics)
        if job.preempted:
          return announce.result(job)
      following = self.schedule.next_segment(job.position)
      # Before the segment's last steps are waited for: the new step compiles meanwhile.
      retuned = self._retune(job) if following is not None else None
      for hook in job.hooks.values():
        hook.segment_end()
      if retuned is None:
        break
      job.setup = retuned()
      if following.carried_in:  # the batches in flight, re-laid out for the new limits
        job.pipeline_state = job.setup.trainer.hand_over(job.pipeline_state)
      else:
        job.pipeline_state = None
      job.position = following
    for hook in job.hooks.values():
      hook.end()
    return _finished(job)

  def _final_eval(self, job: JobContext) -> JobResult:
    """The final eval of a job trained to its end that stopped before it finished."""
    job.output.message(
      f"sparsepipe: the job in {job.workdir} has trained its {job.batch:,} batches; its final"
      " eval did not finish before it stopped: evaluating"
    )
    make_hooks(job)
    job.hooks["evaluation"].end()
    return _finished(job)

  def _retune(self, job: JobContext) -> Callable[[], Setup]:
    """FDO at a segment's end: returns what waits for the next segment's Setup.

    The statistics are merged and the new limits published to the input at
    once (its workers go on with the batches after the retune point), and the
    step for changed limits compiles in a background thread while the job
    finishes the segment (its last steps, losses, checkpoint), unless it was
    compiled ahead for the same limits (fdo.AheadCompiles).
    """
    setup, batch = job.setup, job.position.end
    if not self.schedule.retunes_after(batch):  # e.g. the end of a job since extended
      return lambda: setup
    specs, merged = fdo.retune_limits(
      setup.feature_specs,
      setup.iterator.stats_totals().as_stats(),
      stats_dir=os.path.join(self.workdir, "fdo", f"after_batch_{batch:09d}"),
      headroom=float(self.config.fdo.headroom),
      steps_per_doubling=int(self.config.fdo.steps_per_doubling),
      num_sc_per_device=self.model.num_sc,
      global_device_count=self.mesh.size,
    )
    setup.iterator.publish_limits(batch, specs)
    ahead = job.hooks["compile_ahead"].ahead
    if transforms.get_stack_limits(specs) == transforms.get_stack_limits(setup.feature_specs):
      ahead.discard()  # a step compiled ahead for other limits
      compiled = None
    else:
      # Compiled ahead (fdo.AheadCompiles), or now in the background.
      compiled = ahead.step_for(specs, job.position)

    def retuned() -> Setup:
      self._record_retune(job, batch, setup.feature_specs, specs, merged)
      if compiled is None:
        return setup
      return Setup(specs, compiled(), setup.iterator)

    return retuned

  def _record_retune(
    self, job: JobContext, batch: int, before: Any, specs: Any, merged: Any
  ) -> None:
    """The retune's line and `fdo` record (once: a job resumed at its retune point
    has them already)."""
    if not job.output.recorded("fdo", batch):
      changes = fdo.describe_limits(before, specs)
      # Per host a running sum; across hosts the FDO merge takes the max.
      dropped = {k: int(v) for k, v in merged.id_drop_counters.items()}
      if any(dropped.values()):  # with data.allow_id_dropping: ids over the limits so far
        changes += "; ids dropped so far (largest host): " + ", ".join(
          f"{k} {v:,}" for k, v in sorted(dropped.items()) if v
        )
      job.output.event(
        "fdo",
        batch,
        f"sparsepipe: FDO after batch {batch}: {changes}",
        limits=transforms.get_stack_limits(specs),
        dropped_ids_largest_host=dropped,
      )


def _stopped_before_training(job: JobContext) -> JobResult:
  """A stop that came while the job made or restored its state (its checkpoints open):
  no batch is trained and nothing saved first, since the newest checkpoint, if any,
  holds all the job trained. A stop during the first step's compile trains that
  step and saves it (the program compiles as it first runs)."""
  job.preempted = True
  job.watcher.uninstall()
  kept = "nothing trained yet" if job.resumed_from is None else f"checkpoint {job.batch} kept"
  job.output.event(
    "preempted",
    job.batch,
    f"sparsepipe: preempted before training; {kept}, exiting (run the same command again to go on)",
  )
  return announce.result(job)


def _finished(job: JobContext) -> JobResult:
  """A job past its last batch: done, or stopped during its final eval (the rerun evaluates)."""
  return announce.result(job) if job.preempted else announce.done(job)


def train_and_evaluate(config: Any, workdir: str, *, config_name: str = "") -> JobResult:
  """Trains config.num_steps batches (resuming from workdir's checkpoints).

  Args:
    config: an ml_collections config like the shipped `demo` config.
    workdir: where the dataset (if generated), checkpoints, FDO statistics
      and metrics.jsonl live.
    config_name: the config's name for people, recorded in <workdir>/job.json
      at the job's first start (launch/workdir/owner.py).

  Returns:
    A JobResult; `preempted` tells the caller to exit with
    checkpointing.PREEMPTED_EXIT_CODE.

  Raises:
    WorkdirInUseError: another job is running in `workdir` (launch/workdir/lock.py).
    OutputPathError: `workdir` is a dataset or an export, or inside saved work
      (launch/workdir/location.py).
  """
  config = complete_config(config)  # a misspelt field is named before anything is made
  check_same_config(config, workdir)
  check_workdir(workdir, training_data.GENERATED_DIRNAMES)
  with exclusive_workdir(os.path.abspath(workdir), training_data.GENERATED_DIRNAMES) as lease:
    core.compile_cache.enable(
      config.get("compilation_cache_dir", core.compile_cache.AUTO), workdir=workdir
    )
    job = _Job(config, workdir, config_name)
    return job.run(lease)

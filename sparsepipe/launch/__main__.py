"""python -m sparsepipe.launch [--config=NAME|FILE] [--config.FIELD=VALUE ...] [--workdir=DIR]

With no arguments: the demo (`--config=demo`) in ./workdir/demo: writes a
small synthetic dataset, trains (the step config.pipelining picks: sequential
on CPU), checkpoints, evaluates, prints a summary. Rerunning resumes from the newest checkpoint.

Exit status: 0 done (or already done); 1 an error, named in one line on
stderr (`--verbose` for the traceback); 42 stopped by SIGTERM or Ctrl-C
with everything it trained saved (a checkpoint saved at the next batch,
or stopped while starting or closing, with nothing to save; while closing
it first finishes closing, and a second signal ends it at once): run the same
command again to continue; 130 a second Ctrl-C stopped the training
without saving: run it again to train on from the newest checkpoint.

Multi-host: run one process per host with --coordinator_address,
--num_processes and --process_id (or --distributed_auto on TPU pods and
managed clusters). When one process ends abnormally (an error, a stop while
starting, a second Ctrl-C), the others end within seconds, each saying so in
one line, with 42 if it was stopped, else 1 (peer_ends.py).
"""

import logging as std_logging
import os
import sys
import traceback

from sparsepipe.launch import stopping

# Before the imports below take seconds: SIGTERM and Ctrl-C end the launch
# with one line from its start (stopping.py).
stopping.stop_outside_training()

from absl import app
from absl import flags

# Nothing here imports JAX, Orbax or Grain (main does, seconds): --help and a bad
# flag answer at once (command_line.py).
from sparsepipe import command_line
from sparsepipe.launch.config.flag import config_help
from sparsepipe.launch.config.flag import config_name
from sparsepipe.launch.config.flag import define_config_flag
from sparsepipe.launch.config.flag import parse_flags_or_exit
from sparsepipe.launch.config.flag import top_level_field_line

# ml_collections applies the --config.* overrides of the default config here.
parse_flags_or_exit(None, lambda _: define_config_flag("demo"))
_WORKDIR = flags.DEFINE_string(
  "workdir", None, "Checkpoints, metrics, generated data (default: ./workdir/<config name>)."
)
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes (hosts) in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
_VERBOSE = flags.DEFINE_bool(
  "verbose", False, "On an error, print the traceback, not just the message."
)
_AUTO = flags.DEFINE_bool("distributed_auto", False, "Let JAX detect the cluster (TPU pods).")
_WAIT = flags.DEFINE_float(
  "distributed_wait_s",
  300.0,
  "How long the processes of a multi-process job wait for each other to connect.",
  lower_bound=1.0,
)
_CPU_DEVICES = flags.DEFINE_integer(
  "cpu_devices", 0, "Simulate this many CPU devices (0: the platform's devices).", lower_bound=0
)


class _ExpectedNotices(std_logging.Filter):
  """Drops two absl WARNINGs the launcher says otherwise (start_command's WARNING
  level lets them through; --verbosity shows them again):

  - Orbax's "Waiting for previous save to complete took N seconds": the job saves
    asynchronously, so on a small job a save often meets the previous one still
    writing; the wait is expected, and its time is in the summary's examples/s.
  - the preemption watcher's "Received signal N: saving step S and exiting": the
    launcher's own lines say so ("Ctrl-C: saving at the next ...", "preempted;
    checkpoint after batch S saved, exiting").
  """

  def filter(self, record: std_logging.LogRecord) -> bool:
    message = record.getMessage()
    return not message.startswith(("Waiting for previous save to complete", "Received signal "))


def workdir() -> str:
  """--workdir, or ./workdir/<config name> (each config its own)."""
  name = config_name(flags.FLAGS["config"].config_filename)
  return _WORKDIR.value or os.path.join("workdir", name)


def _report_the_end(error: BaseException, quiet: stopping.QuietAfterTheStopLine) -> tuple[int, str]:
  """Says how a process of a multi-process job ends abnormally, as the launch would
  (peer_ends: it exits before the launch could); its exit status and line."""
  if stopping.interrupted(error):
    quiet.aborted = True
    stopping.report_aborted()
    return stopping.ABORTED_EXIT_CODE, stopping.aborted_line()
  if isinstance(error, SystemExit):  # a stop while starting said so (stopping.py)
    status = error.code if isinstance(error.code, int) else 1
    return status, stopping.stop_line() or f"exited with status {status}"
  if isinstance(error, command_line.USER_ERRORS) and not _VERBOSE.value:
    line = command_line.error_line(error)
  else:
    traceback.print_exception(error)
    line = command_line.error_line(error).replace("error: ", f"error: {type(error).__name__}: ", 1)
  print(line, file=sys.stderr, flush=True)
  return 1, line


def main(argv) -> int:
  command_line.start_command(argv)
  absl_logger = std_logging.getLogger("absl")
  if not flags.FLAGS["verbosity"].present:
    absl_logger.addFilter(_ExpectedNotices())
  quiet = stopping.QuietAfterTheStopLine()
  absl_logger.addFilter(quiet)
  with stopping.imports_uninterrupted():
    import jax  # pylint: disable=g-import-not-at-top

    if _CPU_DEVICES.value:
      jax.config.update("jax_num_cpu_devices", _CPU_DEVICES.value)
    from sparsepipe import checkpointing  # pylint: disable=g-import-not-at-top
    from sparsepipe.launch import distributed  # pylint: disable=g-import-not-at-top
    from sparsepipe.launch import peer_ends  # pylint: disable=g-import-not-at-top
    from sparsepipe.launch import train_and_evaluate  # pylint: disable=g-import-not-at-top

  if not _VERBOSE.value:  # a failed save is the job's one error line
    checkpointing.quiet_failed_saves()
  started, peers = False, None
  try:
    started = distributed.initialize(
      _COORDINATOR.value,
      _NUM_PROCESSES.value,
      _PROCESS_ID.value,
      auto=_AUTO.value,
      wait_s=_WAIT.value,
    )
    if started:
      peers = peer_ends.PeerEnds()
    name = config_name(flags.FLAGS["config"].config_filename)
    result = train_and_evaluate(flags.FLAGS.config, workdir(), config_name=name)
  except BaseException as error:  # pylint: disable=broad-exception-caught
    ended = not (isinstance(error, SystemExit) and error.code in (0, None))
    if ended and peer_ends.connected():  # the others must not wait for this process: it exits
      if not (stopping.stop_requested() or stopping.interrupted(error)):  # not its own stop
        peer_ends.follow_an_ended_peer(peers)  # another process's end broke this one
      peer_ends.end_abnormally(*_report_the_end(error, quiet), peers)
    if not stopping.interrupted(error):  # a second Ctrl-C while training (stopping.py)
      raise
    quiet.aborted = True
    stopping.report_aborted()
    return stopping.ABORTED_EXIT_CODE
  finally:
    distributed.shutdown(started)  # watched: a process that fails meanwhile ends this one
    if peers is not None:
      peers.stop()
    stopping.launch_ended()
  # A stop while closing (stopping.py) lets the launch close, then says 42.
  stopped = result.preempted or stopping.stop_requested()
  return checkpointing.PREEMPTED_EXIT_CODE if stopped else 0


def _import_library_flags() -> None:
  """command_line.import_library_flags, whose native extensions a stop signal must not
  interrupt (stopping.imports_uninterrupted)."""
  with stopping.imports_uninterrupted():
    command_line.import_library_flags()


def parse_command_line(argv: list[str]) -> list[str]:
  """app.run's flags_parser: absl's, the config's help after absl's, and one line for a
  config field given as a flag of its own (`--num_steps=80`: --config.num_steps=80)."""
  return parse_flags_or_exit(
    argv,
    lambda args: command_line.parse_flags(
      args,
      help_epilog=config_help,
      unknown_flag_line=top_level_field_line,
      load_library_flags=_import_library_flags,
    ),
  )


if __name__ == "__main__":
  sys.exit(
    app.run(
      command_line.reports_errors(main, handles_ctrl_c=False),  # stopping.py's handlers
      flags_parser=parse_command_line,
    )
  )

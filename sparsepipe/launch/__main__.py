"""python -m sparsepipe.launch [--config=configs/demo.py] [--workdir=DIR] [...]

With no arguments: the demo (`--config=demo`) in ./workdir/demo: writes a
small synthetic dataset, trains with the pipelined step, checkpoints,
prints a summary. Rerunning resumes from the newest checkpoint. A
preempted run (SIGTERM) saves and exits with status 42.

Multi-host: run one process per host with --coordinator_address,
--num_processes and --process_id (or --distributed_auto on TPU pods and
managed clusters).
"""

import re
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from sparsepipe.data.convert import cli
from sparsepipe.launch.config.shipped import config_path


def _unknown_config_field(error: Exception) -> str:
  """One line for an override of a field the config lacks (ml_collections' 'did you mean')."""
  text = str(error.args[0] if error.args else error)
  match = re.search(r'Did you mean "([^"]+)" instead of "([^"]+)"', text)
  key = match.group(2) if match else re.search(r"(\w+)", text + " ?").group(1)
  given = [a.split("=", 1)[0] for a in sys.argv[1:] if a.startswith("--config.")]
  flag = next((g for g in given if g.split(".")[-1] == key), f"--config.*.{key}")
  hint = f"; did you mean {match.group(1)}?" if match else ""
  return f"error: {flag}: the config has no field '{key}'{hint}"


def _shipped_config_names(argv: list[str]) -> list[str]:
  """--config=NAME of a shipped config -> its file (installed configs need no checkout)."""
  out = []
  for arg in argv:
    name = arg.split("=", 1)[1] if arg.startswith("--config=") else None
    path = config_path(name) if name else None
    out.append(f"--config={path}" if path else arg)
  return out


def _config_overrides_checked(apply, *args, **kwargs):
  """Runs `apply` (which applies the --config.* overrides); a field the
  config lacks exits with one line instead of ml_collections' traceback."""
  try:
    return apply(*args, **kwargs)
  except (AttributeError, KeyError) as e:
    print(_unknown_config_field(e), file=sys.stderr)
    sys.exit(2)


sys.argv = _shipped_config_names(sys.argv)
# ml_collections applies the overrides while defining the flag (the default
# config) or while parsing (a --config given), so both are checked.
_config_overrides_checked(
  config_flags.DEFINE_config_file,
  "config",
  config_path("demo"),
  "ml_collections config: a file (configs/criteo.py) or a shipped config's name (criteo).",
  lock_config=True,
)

_WORKDIR = flags.DEFINE_string("workdir", "workdir/demo", "Checkpoints, metrics, generated data.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes (hosts) in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
_VERBOSE = flags.DEFINE_bool(
  "verbose", False, "On an error, print the traceback, not just the message."
)
_AUTO = flags.DEFINE_bool("distributed_auto", False, "Let JAX detect the cluster (TPU pods).")
_CPU_DEVICES = flags.DEFINE_integer(
  "cpu_devices", 0, "Simulate this many CPU devices (0: the platform's devices)."
)


def main(argv) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # Orbax and Grain log every save at INFO
  import jax  # pylint: disable=g-import-not-at-top

  if _CPU_DEVICES.value:
    jax.config.update("jax_num_cpu_devices", _CPU_DEVICES.value)
  from sparsepipe import checkpointing  # pylint: disable=g-import-not-at-top
  from sparsepipe.launch import distributed  # pylint: disable=g-import-not-at-top
  from sparsepipe.launch import train_and_evaluate  # pylint: disable=g-import-not-at-top

  started = distributed.initialize(
    _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value, auto=_AUTO.value
  )
  try:
    result = train_and_evaluate(flags.FLAGS.config, _WORKDIR.value)
  finally:
    distributed.shutdown(started)
  return checkpointing.PREEMPTED_EXIT_CODE if result.preempted else 0


if __name__ == "__main__":
  sys.exit(
    app.run(
      cli.reports_errors(main),
      flags_parser=lambda argv: _config_overrides_checked(app.parse_flags_with_usage, argv),
    )
  )

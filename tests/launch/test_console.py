"""What the commands print: --help, the progress line's rate, no Orbax notices."""

import io
import subprocess
import sys
import types

import jax
import numpy as np
import pytest

from sparsepipe.launch.config.shipped import criteo
from sparsepipe.launch.job import metrics_log
from sparsepipe.launch.job.hooks import ProgressHook
from sparsepipe.launch.job.metrics_log import ProgressLine

import launch_testing  # pylint: disable=g-bad-import-order
import subprocess_harness as harness  # pylint: disable=g-bad-import-order


def _help(*args):
  return subprocess.run(
    [sys.executable, "-m", *args, "--help"],
    env=harness.cpu_env(1),
    capture_output=True,
    text=True,
    timeout=120,
  )


def test_launcher_help_exits_0_and_names_the_config_fields_and_their_docs():
  out = _help("sparsepipe.launch", "--config=criteo", "--config.num_steps=7")
  assert (out.returncode, out.stderr) == (0, ""), out.stderr
  epilog = out.stdout.split("Try --helpfull to get a list of all flags.\n\n")[1].splitlines()
  assert epilog[:2] == [
    "Config fields and this config's values (set any with --config.FIELD=VALUE;",
    "docs/reference/config.md lists each field's default, units and meaning):",
  ]
  assert all(line.startswith("  ") and len(line) <= 80 for line in epilog[2:]), epilog
  config = criteo.get_config()
  expected = [
    "features.NAME.*"
    if key == "features"
    else f"{key}.*"
    if hasattr(config[key], "items")
    else f"{key}={7 if key == 'num_steps' else config[key]!r}"
    for key in sorted(config.keys())
  ]
  assert " ".join(line.strip() for line in epilog[2:]).split(", ") == expected
  assert "num_steps=7" in expected and "global_batch_size=4096" in expected


@pytest.mark.parametrize(
  "module",
  [
    "sparsepipe.launch.evaluate",
    "sparsepipe.launch.export",
    "sparsepipe.data.csv",
    "sparsepipe.serving.predict",
  ],
)
def test_every_command_help_exits_0(module):
  out = _help(module)
  assert (out.returncode, out.stderr) == (0, ""), out.stderr
  assert out.stdout.rstrip().endswith("Try --helpfull to get a list of all flags."), out.stdout


# What the commands import after their flags: seconds (JAX's import alone was 1.5 s).
_HEAVY = {"jax", "jaxlib", "orbax", "grain", "tensorstore", "array_record"}


def _imports(*args):
  """(exit status, stdout, stderr less -X importtime's lines, top-level packages imported)."""
  out = subprocess.run(
    [sys.executable, "-X", "importtime", "-m", *args],
    env=harness.cpu_env(1),
    capture_output=True,
    text=True,
    timeout=120,
  )
  lines = out.stderr.splitlines()
  timed = [line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")]
  stderr = "".join(f"{line}\n" for line in lines if not line.startswith("import time:"))
  return out.returncode, out.stdout, stderr, {name.split(".")[0] for name in timed}


@pytest.mark.parametrize(
  "args, status, stderr",
  [
    (["sparsepipe.launch", "--help"], 0, ""),
    (["sparsepipe.launch", "--config=dataset", "--help"], 0, ""),
    (
      ["sparsepipe.launch", "--num_steps=80"],
      1,
      "error: --num_steps=80: no such flag; did you mean --config.num_steps=80?\n",
    ),
    (
      ["sparsepipe.launch", "--workdri=x"],
      1,
      "error: Unknown command line flag 'workdri'. Did you mean: workdir ?\n",
    ),
    (["sparsepipe.launch.evaluate", "--help"], 0, ""),
    (["sparsepipe.launch.evaluate", "--bogus"], 1, "error: Unknown command line flag 'bogus'\n"),
    (["sparsepipe.launch.export", "--help"], 0, ""),
  ],
)
def test_help_and_a_bad_flag_answer_before_jax_orbax_and_grain_load(args, status, stderr):
  """They took 2-5 s: the launcher, evaluate and export imported sparsepipe.data (the
  converters' cli module), and with it JAX, Orbax and Grain, before parsing flags."""
  returncode, stdout, rest, imported = _imports(*args)
  assert (returncode, rest) == (status, stderr), stdout
  assert sorted(imported & _HEAVY) == []
  if status == 0:
    assert "Try --helpfull to get a list of all flags." in stdout


def test_the_libraries_flags_are_still_the_commands_flags():
  """Grain, ArrayRecord and Orbax define flags when imported: a command line that names
  one, or --helpfull, imports them before parsing, as every command did."""
  returncode, stdout, rest, imported = _imports(
    "sparsepipe.launch", "--grain_py_debug_mode", "--help"
  )
  assert (returncode, rest) == (0, ""), stdout
  assert {"jax", "grain", "orbax"} <= imported
  full = subprocess.run(
    [sys.executable, "-m", "sparsepipe.launch", "--helpfull"],
    env=harness.cpu_env(1),
    capture_output=True,
    text=True,
    timeout=120,
  ).stdout
  for section in [
    "array_record.python.array_record_data_source:",
    "grain._src.core.config:",
    "orbax.checkpoint._src.multihost.multihost:",
  ]:
    assert f"\n{section}\n" in full, section


# Which flags the job's modules define beyond what the launcher defines before its
# flags parse, and beyond what command_line.import_library_flags defines.
_FLAGS_OF_THE_JOB = """
from absl import flags
from sparsepipe import command_line
import sparsepipe.launch.config.flag
own = set(flags.FLAGS)
command_line.import_library_flags()
libraries = set(flags.FLAGS) - own
import sparsepipe.launch.job.run, sparsepipe.launch.distributed, sparsepipe.launch.peer_ends
import sparsepipe.serving, sparsepipe.launch.evaluate, sparsepipe.launch.export
print(sorted(set(flags.FLAGS) - own - libraries))
print(sorted(n for n in libraries if not n.startswith(command_line.LIBRARY_FLAG_PREFIXES)))
print(len(libraries) > 0)
"""


def test_the_library_flag_prefixes_name_every_flag_the_libraries_define():
  out = subprocess.run(
    [sys.executable, "-c", _FLAGS_OF_THE_JOB],
    env=harness.cpu_env(1),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert (out.returncode, out.stdout) == (0, "[]\n[]\nTrue\n"), out.stderr


class _Clock:
  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


def _progress_hook(monkeypatch):
  """(clock, stream, ProgressHook): 8 batches of 100, a line every 2, started."""
  clock = _Clock()
  monkeypatch.setattr(metrics_log.time, "perf_counter", clock)
  stream = io.StringIO()
  line = ProgressLine(8, stream=stream)
  job = types.SimpleNamespace(
    config=types.SimpleNamespace(log_every_steps=2),
    global_batch=100,
    position=types.SimpleNamespace(start=0),
    hooks={"losses": types.SimpleNamespace(flush=lambda: None, last_loss=0.5)},
    output=types.SimpleNamespace(progress=line.update),
    epoch=lambda batch: None,
  )
  hook = ProgressHook(job)
  hook.start()
  return clock, stream, hook


def test_progress_line_shows_the_rate_of_training_alone(monkeypatch):
  """A compiling first interval and a save's interval leave the line's rate alone."""
  clock, stream, hook = _progress_hook(monkeypatch)
  # Batches 1-2 compile (10 s); 3-4 train (0.5 s, 0.2 s waiting for data);
  # 5-6 also save (5 s); 7-8 train (1 s).
  for index, now, wait, saves in [
    (0, 9.0, 0.0, False),
    (1, 10.0, 0.0, False),
    (2, 10.25, 0.1, False),
    (3, 10.5, 0.1, False),
    (4, 13.0, 0.0, True),
    (5, 15.5, 0.0, False),
    (6, 16.0, 0.0, False),
    (7, 16.5, 0.0, False),
  ]:
    clock.now = now
    if saves:
      hook.disturbed()
    hook(types.SimpleNamespace(batch_index=index, data_wait_seconds=wait))
  assert stream.getvalue().splitlines() == [
    "batch 2/8 | - ex/s | loss 0.5000 | data wait -",
    "batch 4/8 | 400 ex/s | loss 0.5000 | data wait 40%",
    "batch 6/8 | 400 ex/s | loss 0.5000 | data wait 40%",
    "batch 8/8 | 267 ex/s | loss 0.5000 | data wait 13%",
  ]
  assert hook.steady_rate() == pytest.approx(400 / 1.5)


def test_a_retune_that_compiles_nothing_leaves_the_rate_alone(monkeypatch):
  """With fdo.every_steps <= log_every_steps every interval ends a segment: the
  line showed '- ex/s' throughout though the retunes left the limits unchanged.
  An interval is left out when JAX compiled in it, not for a segment's end."""
  clock, stream, hook = _progress_hook(monkeypatch)
  # Segments of one batch; batches 1-2 compile (start), 3-4 and 7-8 train (1 s),
  # 5-6 compile a new step (a changed retune's, here a fresh function: 2 s).
  for index, now in enumerate([5.0, 10.0, 10.5, 11.0, 12.0, 13.0, 13.5, 14.0]):
    clock.now = now
    if index == 4:
      jax.jit(lambda x: x * 3.0 + 1.0)(np.float32(index)).block_until_ready()
    hook(types.SimpleNamespace(batch_index=index, data_wait_seconds=0.0))
    hook.segment_end()
  hook.end()
  assert stream.getvalue().splitlines() == [
    "batch 2/8 | - ex/s | loss 0.5000 | data wait -",
    "batch 4/8 | 200 ex/s | loss 0.5000 | data wait 0%",
    "batch 6/8 | 200 ex/s | loss 0.5000 | data wait 0%",
    "batch 8/8 | 200 ex/s | loss 0.5000 | data wait 0%",
  ]
  assert hook.steady_rate() == pytest.approx(200.0)


# The launcher with Orbax's threshold for its "Waiting for previous save"
# warning at -1 s, so that every save after the first logs it.
_WAITING_LAUNCHER = """
import runpy, sys
import orbax.checkpoint.checkpoint_manager as checkpoint_manager
checkpoint_manager._WAIT_FOR_PREV_SAVE_WARNING_THRESHOLD_SECS = -1.0
sys.argv = ["sparsepipe.launch", *sys.argv[1:]]
runpy.run_module("sparsepipe.launch", run_name="__main__", alter_sys=True)
"""


def test_orbax_save_wait_notices_stay_out_of_the_output_unless_verbosity_is_given(tmp_path):
  flags = launch_testing.flag_overrides(num_steps=4, fdo__every_steps=0, checkpoint__every_steps=1)
  command = [sys.executable, "-c", _WAITING_LAUNCHER, f"--workdir={tmp_path / 'job'}", *flags]
  out = harness.run(command, env=harness.cpu_env(1), timeout_s=300)
  assert out.returncode == 0, out.describe()
  assert _save_waits(out) == [], out.describe()
  assert launch_testing.events(str(tmp_path / "job"), "done") == [{"event": "done", "batch": 4}]
  out = harness.run(
    [*command, "--config.num_steps=6", "--verbosity=0"], env=harness.cpu_env(1), timeout_s=300
  )
  assert out.returncode == 0, out.describe()
  assert _save_waits(out), out.describe()


def _save_waits(out):
  lines = out.lines + out.stderr.splitlines()
  return [line for line in lines if "Waiting for previous save to complete took" in line]

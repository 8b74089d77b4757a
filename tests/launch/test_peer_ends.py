"""A 2-process job ends together, each process saying why, when one fails or is
stopped while starting.

The failed process used to wait at jax.distributed.shutdown's barrier, and
the other in a collective, until JAX aborted both with a fatal-error dump
300 s later; the failed process's own error line was never printed.
"""

import os
import subprocess
import sys
import time

import launch_testing  # pylint: disable=g-bad-import-order
import subprocess_harness as harness  # pylint: disable=g-bad-import-order

_TIMEOUT_S = 150  # JAX's own ends come after 100 s (heartbeats) to 300 s (barriers)

_FAIL_AS_TRAINING_BEGINS = """
from sparsepipe.launch import stopping

def training_begins():
  raise ValueError("dataset shard 3 is unreadable (injected in process 1)")

stopping.training_begins = training_begins
"""

_CTRL_C_ONCE_JOINED = """
import signal
from sparsepipe.launch import distributed

_initialize = distributed.initialize

def initialize(*args, **kwargs):
  started = _initialize(*args, **kwargs)
  signal.raise_signal(signal.SIGINT)  # Ctrl-C to this process once it has joined the job
  return started

distributed.initialize = initialize
"""


def _run_two(
  tmp_path, site_code: dict[int, str], flags: dict[int, list[str]] | None = None
) -> list[tuple[int, float, list[str]]]:
  """Both processes of one job, each with its `site_code` (if any) run first and its
  `flags` added; per process (exit status, seconds, stderr lines but absl's logs and the
  data generation's)."""
  port = harness.free_port()
  procs, start = [], time.monotonic()
  for i in range(2):
    env = harness.cpu_env(2, compilation_cache_dir=harness.SESSION_JAX_CACHE)
    if i in site_code:
      site = tmp_path / f"site{i}"
      site.mkdir()
      (site / "sitecustomize.py").write_text(site_code[i])
      env["PYTHONPATH"] = os.pathsep.join((str(site), env["PYTHONPATH"]))
    command = [
      sys.executable,
      "-m",
      "sparsepipe.launch",
      f"--workdir={tmp_path / 'job'}",
      f"--config={launch_testing.DEMO_CONFIG}",
      *launch_testing.flag_overrides(num_steps=4),
      f"--coordinator_address=127.0.0.1:{port}",
      "--num_processes=2",
      f"--process_id={i}",
      *(flags or {}).get(i, []),
    ]
    procs.append(
      subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True
      )
    )
  results = []
  for proc in procs:
    try:
      _, err = proc.communicate(timeout=max(1.0, _TIMEOUT_S - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
      for p in procs:
        p.kill()
      raise AssertionError(f"the job did not end within {_TIMEOUT_S} s") from None
    lines = [
      line
      for line in err.splitlines()
      if line and line[0] not in "IWE[" and not line.startswith("synthetic ")
    ]
    results.append((proc.returncode, time.monotonic() - start, lines))
  return results


def test_an_error_in_one_process_ends_both_at_once_each_saying_why(tmp_path):
  (p0, _, said0), (p1, _, said1) = _run_two(tmp_path, {1: _FAIL_AS_TRAINING_BEGINS})
  error = "error: dataset shard 3 is unreadable (injected in process 1)"
  assert (p1, said1) == (1, [error])
  assert (p0, said0) == (
    1,
    [
      f"sparsepipe: process 1 of the job ended ({error}), so process 0 ends too, without"
      " saving: once that is mended, run the commands on every process to go on from the"
      " newest checkpoint"
    ],
  )


_STOP = (
  "stopped by Ctrl-C while starting, before training: nothing to save; run the same command"
  " again to go on"
)


def test_ctrl_c_to_both_processes_while_starting_each_says_only_its_own_stop(tmp_path):
  results = _run_two(tmp_path, {0: _CTRL_C_ONCE_JOINED, 1: _CTRL_C_ONCE_JOINED})
  assert [(status, said) for status, _, said in results] == [(42, [f"sparsepipe: {_STOP}"])] * 2


def test_ctrl_c_to_one_process_while_starting_stops_both(tmp_path):
  (p0, _, said0), (p1, _, said1) = _run_two(tmp_path, {1: _CTRL_C_ONCE_JOINED})
  stop = _STOP
  assert (p1, said1) == (42, [f"sparsepipe: {stop}"])
  assert (p0, said0) == (
    42,
    [
      f"sparsepipe: process 1 of the job ended ({stop}), so process 0 ends too, without"
      " saving: run the same commands again on every process to go on from the newest"
      " checkpoint"
    ],
  )


def _both_refused(results, said: list[str]) -> None:
  """Each process found the difference (`said[i]`, process i's line); the one that
  records its end first says its own line, the other its own or that process's."""
  follows = [
    f"sparsepipe: process {1 - i} of the job ended ({said[1 - i]}), so process {i} ends too,"
    " without saving: once that is mended, run the commands on every process to go on from"
    " the newest checkpoint"
    for i in range(2)
  ]
  assert [status for status, _, _ in results] == [1, 1]
  lines = [lines for _, _, lines in results]
  assert all(lines[i] in ([said[i]], [follows[i]]) for i in range(2)), lines
  assert [said[0]] in lines or [said[1]] in lines


def test_processes_started_with_other_configs_are_refused_naming_the_fields(tmp_path):
  """A learning rate given to process 1 alone trained (status 0; the checkpoint recorded
  process 0's); another batch size ended both in Gloo's all-to-all with an abort."""
  flags = {1: ["--config.embedding_optimizer.learning_rate=5", "--config.data.num_workers=1"]}
  _both_refused(
    _run_two(tmp_path, {}, flags),
    [
      "error: the processes of this job were started with other configs:"
      f" config.embedding_optimizer.learning_rate is {theirs} on process {other}, {mine} on"
      f" process {this} (start every process with the same --config and --config.* flags)"
      for this, other, mine, theirs in ((0, 1, 0.05, 5.0), (1, 0, 5.0, 0.05))
    ],
  )
  assert not os.path.exists(tmp_path / "job" / "checkpoints")


def test_processes_started_with_other_workdirs_are_refused_before_anything_is_made(tmp_path):
  """Other workdirs were found at the first save ("No such file or directory"), hours
  in on a cluster, or as Orbax's "sync_global_devices name mismatch"."""
  workdirs = [str(tmp_path / "job"), str(tmp_path / "other")]
  _both_refused(
    _run_two(tmp_path, {}, {1: [f"--workdir={workdirs[1]}"]}),
    [
      "error: the processes of this job were started with other workdirs:"
      f" '{workdirs[1 - i]}' on process {1 - i}, '{workdirs[i]}' on process {i} (give every"
      " process the same --workdir, on a filesystem they share)"
      for i in range(2)
    ],
  )
  assert not any(os.path.exists(w) for w in workdirs)


def test_a_workdir_another_job_holds_is_named_by_every_process(tmp_path):
  """Process 1 said only "process 0 could not take it (see its error)", and process 0,
  following process 1's end, never said it: no process named the job holding it."""
  from sparsepipe.launch import exclusive_workdir  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path / "job")
  with exclusive_workdir(workdir):  # another job: this test's process
    results = _run_two(tmp_path, {})
  holder = f"workdir {workdir} is in use by another job (pid {os.getpid()} on "
  assert [status for status, _, _ in results] == [1, 1]
  for i, (_, _, lines) in enumerate(results):
    assert len(lines) == 1 and holder in lines[0], (i, lines)
  assert [_ for _, _, lines in results if lines[0].startswith(f"error: {holder}")]


_SLOW_TO_EXIT = """
import time
from sparsepipe.launch import peer_ends

_exit = peer_ends._exit

def slow_exit(status):
  time.sleep(0.3)  # descheduled (a loaded machine) between marking itself seen and exiting
  _exit(status)

peer_ends._exit = slow_exit
"""


def test_a_process_slow_to_exit_after_process_0s_end_is_not_aborted(tmp_path):
  """Process 0 exited, ending the coordination service, as soon as process 1 had marked
  itself seen; process 1, not yet gone, was aborted by JAX's client (SIGABRT, its
  'Terminating process because the JAX distributed service detected fatal errors')."""
  from sparsepipe.launch import exclusive_workdir  # pylint: disable=g-import-not-at-top

  with exclusive_workdir(str(tmp_path / "job")):  # both processes end: another job holds it
    results = _run_two(tmp_path, {1: _SLOW_TO_EXIT})
  assert [status for status, _, _ in results] == [1, 1], results


_LATE_TO_LOOK_FOR_CHECKPOINTS = """
import time
from sparsepipe.launch.job import checkpoints

_newest = checkpoints._newest_saved_config

def late(workdir):
  time.sleep(4)  # process 0 meanwhile opens the job's checkpoints (making their folder)
  return _newest(workdir)

checkpoints._newest_saved_config = late
"""


def test_a_process_late_to_look_for_checkpoints_opens_them_with_the_others(tmp_path):
  """Each process looked for the job's checkpoints itself: process 1, later, found the
  folder process 0 had made for its manager and opened a reader of them, while process 0
  opened the job's manager: "sync_global_devices name mismatch" (seen in CI)."""
  from sparsepipe.launch.job.training_data import ensure_dataset  # pylint: disable=g-import-not-at-top

  # A given dataset: generating one is a barrier after the look (process 0 writes it).
  data_dir = ensure_dataset(
    launch_testing.tiny_config(), str(tmp_path / "gen"), show_progress=False
  )
  given = [f"--config.data.dir={data_dir}"]
  results = _run_two(tmp_path, {1: _LATE_TO_LOOK_FOR_CHECKPOINTS}, {0: given, 1: given})
  assert [status for status, _, _ in results] == [0, 0], results

"""Data worker processes: no stop signal ends one, and one that ends is named.

A worker ignores SIGTERM and Ctrl-C from its init on, but it runs its init
only after seconds of start-up; a group signal in that time (Ctrl-C in a
terminal, a scheduler's SIGTERM) killed it, and the job failed with Grain's
"Worker process was terminated unexpectedly" and a traceback, then hung at
exit closing the dead workers. Now workers start with both signals blocked
(core.signals), and a worker that ends anyway (SIGKILL, the out-of-memory
killer) is a DataWorkerExitedError, one line from the launcher.
"""

import sys

import subprocess_harness as harness  # pylint: disable=g-bad-import-order

_INPUT = """
from absl import flags
flags.FLAGS(sys.argv[:1])
from sparsepipe import core, data
from sparsepipe import transforms as T


def make_input(directory):
  features = (data.SyntheticFeature("a", 20, 1, 2),)
  manifest = data.write_synthetic(directory, features, num_examples=256, num_dense=1, seed=1)
  table = core.TableSpec("a", 20, 4, max_ids_per_partition=64, max_unique_ids_per_partition=64)
  feature = core.FeatureSpec("a", table, (8, 2), (8, 4))
  specs = T.prepare_feature_specs_for_training({"a": feature}, 1, 2)
  config = T.InputConfig(manifest.directory, 8, num_sc_per_device=2, num_workers=2)
  return T.make_host_input(
    config, specs, local_device_count=1, global_device_count=1, process_index=0, process_count=1
  )
"""

# A main process that takes the signals (as the launcher's watcher does) and
# sends them to its whole group every 20 ms for 3 s from the workers' start.
_SIGNALS_WHILE_WORKERS_START = (
  "import os, signal, sys, threading, time\n"
  + _INPUT
  + """

def main(directory):
  received = []
  for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, lambda signum, frame: received.append(signum))
  it = make_input(directory)

  def send_signals():
    end = time.monotonic() + 3
    while time.monotonic() < end:
      os.killpg(0, (signal.SIGINT, signal.SIGTERM)[len(received) % 2])
      time.sleep(0.02)

  sender = threading.Thread(target=send_signals)
  sender.start()
  batches = [next(it) for _ in range(4)]  # the first starts the workers
  sender.join()
  it.close()
  print(len(batches), len(received) > 0)  # signals of one kind pending together count once


if __name__ == "__main__":
  main(sys.argv[1])
"""
)

# Reads two batches, SIGKILLs a worker, reads on: the error, then a prompt exit.
_A_WORKER_KILLED = (
  "import multiprocessing, os, signal, sys\n"
  + _INPUT
  + """

def main(directory):
  it = make_input(directory)
  next(it), next(it)
  worker = multiprocessing.active_children()[0]
  os.kill(worker.pid, signal.SIGKILL)
  worker.join()
  try:
    while True:
      next(it)
  except T.DataWorkerExitedError as e:
    print(e)
  it.close()


if __name__ == "__main__":
  main(sys.argv[1])
"""
)


def test_workers_starting_take_no_stop_signal_sent_to_the_group(tmp_path):
  script = tmp_path / "signals_while_workers_start.py"
  script.write_text(_SIGNALS_WHILE_WORKERS_START)
  # In its own process group (the harness's), which its signals reach; a hang
  # (as without the fix) is killed with the group and named.
  ran = harness.run(
    [sys.executable, str(script), str(tmp_path / "ds")], env=harness.cpu_env(1), timeout_s=120
  )
  assert (ran.returncode, ran.lines) == (0, ["4 True"]), ran.stderr
  assert "Traceback" not in ran.stderr, ran.stderr


def test_a_worker_killed_is_named_and_the_input_closes(tmp_path):
  script = tmp_path / "a_worker_killed.py"
  script.write_text(_A_WORKER_KILLED)
  ran = harness.run(
    [sys.executable, str(script), str(tmp_path / "ds")], env=harness.cpu_env(1), timeout_s=120
  )
  assert (ran.returncode, ran.lines) == (
    0,
    [
      "a data worker process ended by SIGKILL (e.g. the kernel's out-of-memory killer) while"
      " the input needed it; its messages above may say why. The input cannot go on without it"
      " (a job resumes from its newest checkpoint)"
    ],
  ), ran.stderr

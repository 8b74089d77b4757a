"""Mistakes in starting a multi-process job are one line each, and the wait for
the other processes is said, bounded and stoppable (launch/distributed.py).

Before: an address without a port was an IndexError traceback, a port that is
not a number a segfault, a port over 65535 a silent 300 s wait and an abort;
process 0 bound a port another job's coordinator held (and that job aborted
when this one's processes joined it); a process whose peers never came waited
300 s without a word, took no stop signal, and aborted with a dump.
"""

import signal
import socket
import subprocess
import sys

import pytest

import launch_testing  # pylint: disable=g-bad-import-order
import subprocess_harness as harness  # pylint: disable=g-bad-import-order


def _command(tmp_path, address, num_processes=2, process_id=0, *flags):
  return [
    sys.executable,
    "-m",
    "sparsepipe.launch",
    f"--workdir={tmp_path / 'job'}",
    f"--config={launch_testing.DEMO_CONFIG}",
    *launch_testing.flag_overrides(num_steps=2),
    f"--coordinator_address={address}",
    f"--num_processes={num_processes}",
    f"--process_id={process_id}",
    *flags,
  ]


@pytest.mark.parametrize(
  "address, num_processes, error",
  [
    ("127.0.0.1", 2, "--coordinator_address='127.0.0.1': expected host:port, with a port in"),
    ("127.0.0.1:abc", 2, "--coordinator_address='127.0.0.1:abc': expected host:port, with a"),
    ("127.0.0.1:99999", 2, "--coordinator_address='127.0.0.1:99999': expected host:port,"),
    ("127.0.0.1:1234", 0, "--num_processes=0 must be >= 1"),
  ],
)
def test_a_bad_address_or_process_count_is_one_line(tmp_path, address, num_processes, error):
  out = harness.run(_command(tmp_path, address, num_processes), env=harness.cpu_env(1))
  assert (out.returncode, out.stderr.startswith(f"error: {error}")) == (1, True), out.describe()
  assert len(out.stderr.splitlines()) == 1 and not (tmp_path / "job").exists()


def test_process_0_refuses_a_port_in_use(tmp_path):
  with socket.socket() as held:  # e.g. another job's coordinator
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    out = harness.run(_command(tmp_path, f"127.0.0.1:{port}"), env=harness.cpu_env(1))
  assert (out.returncode, out.stderr) == (
    1,
    f"error: --coordinator_address='127.0.0.1:{port}': port {port} is in use on this host"
    " (another job's coordinator, or another program): give each job a port of its own\n",
  )


def test_a_process_whose_peers_never_come_gives_up_after_the_wait_naming_it(tmp_path):
  address = f"127.0.0.1:{harness.free_port()}"
  command = _command(tmp_path, address, 2, 0, "--distributed_wait_s=2")
  out = harness.run(command, env=harness.cpu_env(1), timeout_s=60)
  assert (out.returncode, out.stderr) == (
    1,
    f"error: the job's 2 processes did not all connect to the coordinator at {address}"
    " within 2 s (process 0 waited): start each with the same --coordinator_address and"
    " --num_processes and a --process_id of its own, or wait longer with"
    " --distributed_wait_s\n",
  )
  assert not (tmp_path / "job").exists()


def test_a_stop_signal_while_waiting_for_the_peers_is_the_stop_line(tmp_path):
  address = f"127.0.0.1:{harness.free_port()}"
  proc = subprocess.Popen(
    _command(tmp_path, address, 2, 1),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    env=harness.cpu_env(1),
    text=True,
  )
  waiting = proc.stderr.readline()  # said after 5 s
  proc.send_signal(signal.SIGTERM)
  rest = proc.communicate(timeout=30)[1]
  assert waiting == (
    f"sparsepipe: process 1 of 2: waiting for the job's processes to connect at {address}"
    " (up to 300 s)\n"
  )
  assert (proc.returncode, rest) == (
    42,
    "sparsepipe: stopped by SIGTERM while starting, before training: nothing to save; run"
    " the same command again to go on\n",
  )

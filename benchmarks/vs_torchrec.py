"""The shipped criteo job against the same DLRM in TorchRec, in alternating runs.

    python benchmarks/vs_torchrec.py --torch_python=/path/to/venv/bin/python
        [--rounds 3] [--batches 150] [--torchrec_batches 100] [--json out.json]

Each round runs, one after the other on the same machine:
  sparsepipe: `python -m sparsepipe.launch --config=criteo` as shipped (1
      device, 2 data workers, the synthetic dataset of the shipped config:
      2^20 examples in packed records, as it generates them) except for the schedule: a
      first run of --fdo_batches batches ends with an FDO pass and a
      checkpoint, then the job is extended by --batches batches with FDO
      retuning every --fdo_batches. The figure is the launcher's
      steady-state examples/s of the extension (its progress intervals with
      nothing but training: no compilation, save or FDO pass), so it is
      the job after FDO, as issue 22 measured it. Its progress interval
      (log_every_steps, at most 10 batches) is chosen so that at least two
      such intervals fall in the extension; a schedule too short for that
      is refused before anything runs, with the least --batches it needs.
  TorchRec: benchmarks/torchrec_dlrm.py under --torch_python (an
      environment with torch, torchrec and fbgemm_gpu; that script says how
      to make one, and how its model and input match and differ), 2 data
      workers, --torchrec_batches batches after its warm-up.
and reports both, and sparsepipe / TorchRec per round and their median.
The dataset is generated once (the first round's) and read by every
sparsepipe run. The machine may be shared: compare figures of one run.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

from absl import app
from absl import flags
import outputs

_TORCH_PYTHON = flags.DEFINE_string(
  "torch_python", None, "A Python with torch, torchrec and fbgemm_gpu (CPU).", required=True
)
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternating rounds (sparsepipe, then TorchRec).")
_BATCHES = flags.DEFINE_integer("batches", 150, "sparsepipe batches measured after FDO.")
_FDO_BATCHES = flags.DEFINE_integer("fdo_batches", 50, "config.fdo.every_steps of both runs.")
_TORCHREC_BATCHES = flags.DEFINE_integer("torchrec_batches", 100, "TorchRec batches measured.")
_JSON = outputs.json_flag()

_HERE = os.path.dirname(os.path.abspath(__file__))
_STEADY = re.compile(r"\(([\d,]+) in steady state\)")
_MAX_LOG_EVERY = 10  # batches per progress interval (the default schedule's)


def _log_every(fdo_batches: int, batches: int) -> int | None:
  """The longest progress interval (<= 10 batches) leaving two steady ones in the extension.

  The launcher's steady-state rate is over the progress intervals of
  training alone (launch/job/hooks.py ProgressHook): not the first after the
  start (it compiles), nor one beside a retune (every fdo_batches: its FDO
  pass and compilation fall just before or just after that batch, as the job
  is pipelined or not). None: no interval length leaves two.
  """
  end = fdo_batches + batches
  retunes = range(2 * fdo_batches, end, fdo_batches)
  for every in range(_MAX_LOG_EVERY, 0, -1):
    logged = range((fdo_batches // every + 1) * every, end + 1, every)
    steady = [b for b in logged[1:] if not any(b - every <= r <= b for r in retunes)]
    if len(steady) >= 2:
      return every
  return None


def _check_flags() -> None:
  """Refuses, before anything runs, a schedule without a steady-state figure or a
  --torch_python that cannot import TorchRec (used only after the sparsepipe run)."""
  fdo, batches = _FDO_BATCHES.value, _BATCHES.value
  if fdo < 3:  # a retune every batch or two leaves no interval of training alone
    raise app.UsageError(f"--fdo_batches={fdo}: need >= 3 (a retune every batch or two)")
  if batches < 1:
    raise app.UsageError(f"--batches={batches}: need >= 1")
  if _log_every(fdo, batches) is None:
    least = next(b for b in itertools.count(batches) if _log_every(fdo, b) is not None)
    raise app.UsageError(
      f"--batches={batches} with --fdo_batches={fdo} leaves fewer than two progress intervals"
      f" of training alone (no compilation or FDO retune) to measure: use --batches >= {least}"
    )
  python = _TORCH_PYTHON.value
  try:
    done = subprocess.run(
      [python, "-c", "import torch, torchrec, fbgemm_gpu"],
      capture_output=True,
      text=True,
      check=False,
    )
  except OSError as e:  # no such file, not executable
    raise SystemExit(f"--torch_python={python} does not run: {e}") from None
  if done.returncode != 0:
    error = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    raise SystemExit(
      f"--torch_python={python} cannot `import torch, torchrec, fbgemm_gpu`: {error}"
      " (benchmarks/torchrec_dlrm.py's docstring says how to make such an environment)"
    )


def _launch(workdir: str, num_steps: int, data_dir: str | None) -> str:
  """Runs the criteo job to `num_steps` batches; its output."""
  command = [
    sys.executable,
    "-m",
    "sparsepipe.launch",
    "--config=criteo",
    f"--workdir={workdir}",
    f"--config.num_steps={num_steps}",
    f"--config.fdo.every_steps={_FDO_BATCHES.value}",
    f"--config.log_every_steps={_log_every(_FDO_BATCHES.value, _BATCHES.value)}",
    "--config.checkpoint.every_steps=100000",
  ]
  if data_dir is not None:
    command.append(f"--config.data.dir={data_dir}")
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  env.pop("XLA_FLAGS", None)  # one device, as shipped on a CPU machine
  done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
  if done.returncode != 0:
    raise RuntimeError(f"the criteo job failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
  return done.stdout + done.stderr


def _sparsepipe(root: str, round_index: int, data_dir: str | None) -> tuple[float, str]:
  """(steady-state examples/s after FDO, the dataset directory)."""
  workdir = os.path.join(root, f"sparsepipe_{round_index}")
  _launch(workdir, _FDO_BATCHES.value, data_dir)
  out = _launch(workdir, _FDO_BATCHES.value + _BATCHES.value, data_dir)  # the same config
  found = _STEADY.findall(out)
  if not found:
    raise RuntimeError(f"no steady-state rate in the job's output:\n{out[-3000:]}")
  return float(found[-1].replace(",", "")), data_dir or os.path.join(workdir, "data")


def _torchrec(root: str, round_index: int) -> dict:
  out = os.path.join(root, f"torchrec_{round_index}.json")
  command = [
    _TORCH_PYTHON.value,
    os.path.join(_HERE, "torchrec_dlrm.py"),
    f"--batches={_TORCHREC_BATCHES.value}",
    "--workers=2",
    f"--json={out}",
  ]
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  if done.returncode != 0:
    raise RuntimeError(f"torchrec_dlrm.py failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
  with open(out) as f:
    return json.load(f)


def main(argv: list[str]) -> None:
  del argv
  _check_flags()
  root = tempfile.mkdtemp(prefix="sparsepipe_vs_torchrec_")
  rows, data_dir = [], None
  try:
    for r in range(_ROUNDS.value):
      ours, data_dir = _sparsepipe(root, r, data_dir)
      theirs = _torchrec(root, r)
      rows.append(
        {
          "round": r,
          "sparsepipe_examples_per_s": ours,
          "torchrec_examples_per_s": theirs["examples_per_s"],
          "ratio": ours / theirs["examples_per_s"],
          "torchrec": theirs,
        }
      )
      print(
        f"round {r}: sparsepipe {ours:,.0f} examples/s, TorchRec"
        f" {theirs['examples_per_s']:,.0f}, ratio {rows[-1]['ratio']:.3f}",
        flush=True,
      )
  finally:
    shutil.rmtree(root, ignore_errors=True)
  median = statistics.median(row["ratio"] for row in rows)
  print(f"\ncriteo DLRM, batch 4096, 1 device / 1 process, 2 data workers, {os.cpu_count()} cores")
  print(f"{'round':>6} {'sparsepipe ex/s':>16} {'TorchRec ex/s':>14} {'ratio':>7}")
  for row in rows:
    print(
      f"{row['round']:>6} {row['sparsepipe_examples_per_s']:>16,.0f}"
      f" {row['torchrec_examples_per_s']:>14,.0f} {row['ratio']:>7.3f}"
    )
  print(f"median sparsepipe / TorchRec: {median:.3f} (goal of issue 22: >= 1)")
  load = os.getloadavg()[0]
  print(f"load average at the end: {load:.1f}")
  if _JSON.value:
    outputs.write(
      _JSON.value,
      {
        "benchmark": "vs_torchrec",
        "rows": rows,
        "median_ratio": median,
        "batches": _BATCHES.value,
        "fdo_batches": _FDO_BATCHES.value,
        "cpu_count": os.cpu_count(),
        "load_average_end": load,
      },
    )


if __name__ == "__main__":
  app.run(main)

"""Seconds to the first trained batch: a first start against a second one.

    python benchmarks/startup.py [--json out.json] [--data_root DIR] [--configs demo,criteo]
        [--variants before,after]

Each start is the launcher in a fresh process (`python -m sparsepipe.launch`)
in a new workdir over data made beforehand, so a start is what a restarted
or another job of the same config pays: imports, state init, compilation,
the input's first batches. Per config, four starts in one run:

  before   the compilation cache off (`--config.compilation_cache_dir=`),
           twice: the second start pays what the first did;
  after    a cache in a new directory: the first start compiles and fills
           it, the second loads every program from it.

For each start: the seconds from the process's start to the first trained
batch (the job's `first batch after` line), its phases from the job's
`startup` record (data, state, input, compile; programs compiled and cache
hits), and the whole process's seconds. The goals (issue 26): demo, second
start / first start (after) <= 0.4; criteo on 1 CPU device, second start
<= 10 s to the first batch. The machine may be shared: compare figures of
one run only.

`--configs criteo_w0` is the criteo start with `data.num_workers=0` (the
input in the job's process): on a machine with few cores, the shipped 2
workers' start (each a new Python process importing JAX and Grain) competes
with the state's init for the cores.

`--configs criteo_job` starts the criteo job a GPU host runs: 300 batches,
FDO every 300, 12 data workers, a save at the end (the platform's devices;
minutes per start on a CPU). Its process time is the whole job.

`--configs criteo_retune` (and `criteo_pipelined_retune`, the same with the
pipelined step) instead runs a criteo job of 36 batches on 1 CPU
device that retunes FDO after batches 12 and 24 (per variant, one start),
and prints each retune's stall from the job's `retune_stall` records: the
gap between the last batch before the retune and the first after it (each
trained), less one steady batch time (the segment's batches after its first
two over their time; printed as 0 when the gap is shorter, the JSON keeps
the difference); goal: <= 1 steady batch time. It runs once per
`--compile_ahead` value (fdo.compile_ahead; 0: the retune's step compiles
only at the retune).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import outputs

_JSON = outputs.json_flag()
_DATA_ROOT = flags.DEFINE_string(
  "data_root", None, "Where the datasets are made once and reused (default: a temp dir)."
)
_CONFIGS = flags.DEFINE_list("configs", ["demo", "criteo"], "The configs to start.")
_VARIANTS = flags.DEFINE_list(
  "variants", ["before", "after"], "before: the cache off; after: a cache in a new directory."
)
_COMPILE_AHEAD = flags.DEFINE_list(
  "compile_ahead", ["0", "0.5"], "criteo_retune: the fdo.compile_ahead values to run."
)
_CRITEO_STEPS = 3
_RETUNE_EVERY = 12
# A retune's `compiled_ahead` (AheadCompiles.foreseen): its step compiled ahead, one
# compiled for other limits, none compiled.
_AHEAD = {True: "yes", False: "no (one for other limits)", None: "none"}

_CRITEO_START = [
  "--config=criteo",
  "--cpu_devices=1",
  f"--config.num_steps={_CRITEO_STEPS}",
  "--config.fdo.every_steps=0",
  f"--config.checkpoint.every_steps={_CRITEO_STEPS}",
  "--config.checkpoint.async_save=false",
]

CONFIGS = {
  "demo": ["--config=demo", "--config.num_steps=20"],
  "criteo": _CRITEO_START,
  "criteo_w0": [*_CRITEO_START, "--config.data.num_workers=0"],
  # The job on an accelerator host: 300 batches, FDO every 300 (and after
  # first_after), 12 data workers; its process time is the whole job, its save included.
  "criteo_job": [
    "--config=criteo",
    "--config.num_steps=300",
    "--config.fdo.every_steps=300",
    "--config.checkpoint.every_steps=300",
    "--config.data.num_workers=12",
  ],
  "criteo_retune": [
    "--config=criteo",
    "--cpu_devices=1",
    f"--config.num_steps={3 * _RETUNE_EVERY}",
    f"--config.fdo.every_steps={_RETUNE_EVERY}",
    "--config.fdo.first_after=0",
    f"--config.checkpoint.every_steps={3 * _RETUNE_EVERY}",
    "--config.checkpoint.async_save=false",
    "--config.log_every_steps=1000",
  ],
}
# The same with the pipelined step (`auto` runs the sequential one on CPU): its
# retunes hand the batches in flight to the next segment (or drained, before 0.4).
CONFIGS["criteo_pipelined_retune"] = [*CONFIGS["criteo_retune"], "--config.pipelining=true"]


def _env() -> dict[str, str]:
  env = dict(os.environ)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the job's setting decides
  env.setdefault("JAX_PLATFORMS", "cpu")
  env["PYTHONUNBUFFERED"] = "1"
  return env


def _launch(args: list[str]) -> tuple[float | None, float, list[str]]:
  """(seconds to the `first batch after` line, seconds in all, stdout lines)."""
  started = time.perf_counter()
  process = subprocess.Popen(
    [sys.executable, "-m", "sparsepipe.launch", *args],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=_env(),
  )
  first = None
  lines = []
  for line in process.stdout:
    lines.append(line.rstrip("\n"))
    if first is None and "first batch after" in line:
      first = time.perf_counter() - started
  stderr = process.stderr.read()
  if process.wait() != 0:
    raise RuntimeError(f"{' '.join(args)} failed:\n{stderr[-3000:]}")
  return first, time.perf_counter() - started, lines


def _startup_record(workdir: str) -> dict:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    (record,) = [r for r in map(json.loads, f) if r.get("event") == "startup"]
  return record


def _data_dir(name: str, root: str) -> str:
  """The config's dataset, made once by a 1-batch job (its generated data kept); the
  criteo_* variants read the criteo config's."""
  name = name.split("_")[0]
  data = os.path.join(root, f"{name}_data")
  if not os.path.exists(os.path.join(data, "manifest.json")):
    workdir = tempfile.mkdtemp(prefix=f"{name}_data_job_", dir=root)
    _launch(
      [
        *CONFIGS[name],
        "--config.num_steps=1",
        "--config.compilation_cache_dir=",
        f"--workdir={workdir}",
      ]
    )
    os.rename(os.path.join(workdir, "data"), data)
  return data


def _retunes(name: str, root: str) -> list[dict]:
  """One start per variant; a row per retune stall the job recorded."""
  data = _data_dir(name, root)
  rows = []
  for variant, ahead in [(v, a) for v in _VARIANTS.value for a in _COMPILE_AHEAD.value]:
    cache = "" if variant == "before" else tempfile.mkdtemp(prefix="cache_", dir=root)
    workdir = tempfile.mkdtemp(prefix=f"{name}_{variant}_", dir=root)
    _, job_seconds, _ = _launch(
      [
        *CONFIGS[name],
        f"--config.data.dir={data}",
        f"--config.compilation_cache_dir={cache}",
        f"--config.fdo.compile_ahead={ahead}",
        f"--workdir={workdir}",
      ]
    )
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      records = [r for r in map(json.loads, f) if r.get("phase") == "retune_stall"]
    for r in records:
      rows.append(
        {
          "config": name,
          "cache": variant,
          "compile_ahead": float(ahead),
          "compiled_ahead": r.get("compiled_ahead"),
          "after_batch": r["batch"],
          "stall_s": r["seconds"],
          "gap_s": r["gap_s"],
          "steady_batch_s": r["steady_batch_s"],
          "stall_in_batches": round(r["seconds"] / r["steady_batch_s"], 2),
          "job_s": round(job_seconds, 1),
        }
      )
      stall = max(r["seconds"], 0.0)  # a gap shorter than a steady batch: no stall
      print(
        f"{name}: cache {variant}, compile_ahead {ahead}, retune after batch {r['batch']}:"
        f" stall {stall:.2f} s, step compiled ahead: {_AHEAD[r.get('compiled_ahead')]}"
        f" (gap {r['gap_s']:.2f} s, steady batch {r['steady_batch_s']:.3f} s,"
        f" {stall / r['steady_batch_s']:.2f} batches; the job's process {job_seconds:.0f} s)",
        flush=True,
      )
  return rows


def _starts(name: str, root: str) -> list[dict]:
  data = _data_dir(name, root)
  rows = []
  for variant in _VARIANTS.value:
    cache = "" if variant == "before" else tempfile.mkdtemp(prefix="cache_", dir=root)
    for start in ("first", "second"):
      workdir = tempfile.mkdtemp(prefix=f"{name}_{variant}_{start}_", dir=root)
      args = [
        *CONFIGS[name],
        f"--config.data.dir={data}",
        f"--config.compilation_cache_dir={cache}",
        f"--workdir={workdir}",
      ]
      to_first, total, _ = _launch(args)
      record = _startup_record(workdir)
      rows.append(
        {
          "config": name,
          "cache": variant,
          "start": start,
          "first_batch_s": round(to_first, 2),
          "process_s": round(total, 2),
          **{k: record[k] for k in ("data_s", "state_s", "input_s", "compile_s")},
          **{k: record[k] for k in ("programs_compiled", "cache_hits", "cache_misses")},
        }
      )
      print(_row(rows[-1]), flush=True)
  return rows


HEADER = (
  f"{'config':10} {'cache':6} {'start':6} {'1st batch s':>11} {'process s':>9} {'data':>6}"
  f" {'state':>6} {'input':>6} {'compile':>7} {'compiled':>8} {'hits':>5}"
)


def _row(r: dict) -> str:
  return (
    f"{r['config']:10} {r['cache']:6} {r['start']:6} {r['first_batch_s']:11.1f}"
    f" {r['process_s']:9.1f} {r['data_s']:6.1f} {r['state_s']:6.1f} {r['input_s']:6.1f}"
    f" {r['compile_s']:7.1f} {r['programs_compiled']:8d} {r['cache_hits']:5d}"
  )


def _ratios(rows: list[dict]) -> dict[str, float]:
  out = {}
  for name in sorted({r["config"] for r in rows}):
    by = {(r["cache"], r["start"]): r for r in rows if r["config"] == name}
    if ("after", "second") not in by:
      continue
    after = by[("after", "second")]["first_batch_s"]
    out[f"{name}: second start with the cache / first start"] = round(
      after / by[("after", "first")]["first_batch_s"], 3
    )
    if ("before", "second") in by:
      out[f"{name}: second start with the cache / second start without"] = round(
        after / by[("before", "second")]["first_batch_s"], 3
      )
    out[f"{name}: second start with the cache, s to the first batch"] = after
  return out


def main(argv: list[str]) -> None:
  del argv
  root = outputs.runs_folder(_DATA_ROOT.value, "startup", "--data_root")
  rows, retunes = [], []
  try:
    for name in _CONFIGS.value:
      if name.endswith("_retune"):
        retunes += _retunes(name, root)
      else:
        if not rows:
          print(HEADER, flush=True)
        rows += _starts(name, root)
  finally:
    if not _DATA_ROOT.value:  # our temp dir; a --data_root is the user's, reused
      shutil.rmtree(root, ignore_errors=True)
  ratios = _ratios(rows)
  for key, value in ratios.items():
    print(f"{key}: {value}")
  if _JSON.value:
    outputs.write(_JSON.value, {"starts": rows, "ratios": ratios, "retunes": retunes})


if __name__ == "__main__":
  app.run(main)

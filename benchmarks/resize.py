"""How far a resized job drifts from an uninterrupted one (docs/guide/jobs.md).

    python benchmarks/resize.py [--num_steps 2000] [--stops 200,400] [--devices 1,4,1]
        [--json out.json] [--workdir DIR]

Three runs of the demo config through the launcher (subprocesses on
simulated CPU devices; no eval until the end, a checkpoint at every stop):
  reference: uninterrupted on the first device count;
  resized:   trained to each stop on one device count, then extended
             (--config.num_steps raised) on the next: 1 -> 4 -> 1 by default;
  control:   the same stops on the first device count throughout.
The control shows what holds on one topology (its losses equal the
reference's bit for bit); the resized run shows what a topology change does:
the reductions (gradient sums, the loss mean) add in another order on
another device count, so the first batches after a resize differ by float
rounding (about 1e-7 relative) and the difference then grows as two training
runs with different rounding do. Printed: the relative loss difference per
range of batches (max and median), the first batch past 1e-4, the last
loss and the final eval of each run, and how far the final parameters differ.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

from etils import epath
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import app
import outputs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(devices: int, cache: str) -> dict[str, str]:
  env = dict(os.environ)
  xla = [f for f in env.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
  env["XLA_FLAGS"] = " ".join([*xla, f"--xla_force_host_platform_device_count={devices}"])
  env.update(
    JAX_PLATFORMS="cpu",
    PYTHONPATH=os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p),
    JAX_COMPILATION_CACHE_DIR=cache,
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
  )
  return env


def _train(workdir: str, num_steps: int, devices: int, root: str, *, generate=False) -> None:
  data = [
    f"--config.data.dir={os.path.join(root, 'data')}",
    f"--config.eval.data_dir={os.path.join(root, 'data_eval')}",
  ]
  command = [
    sys.executable,
    "-m",
    "sparsepipe.launch",
    "--config=demo",
    f"--workdir={workdir}",
    *([] if generate else data),
    f"--config.num_steps={num_steps}",
    "--config.eval.every_steps=0",
    "--config.log_every_steps=100",
    f"--config.checkpoint.every_steps={num_steps}",
  ]
  env = _env(devices, os.path.join(root, f"jax_cache_{devices}"))
  out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
  if out.returncode != 0:
    raise RuntimeError(f"{' '.join(command)} exited {out.returncode}:\n{out.stderr[-3000:]}")


def _results(workdir: str) -> tuple[dict[int, float], dict[str, float]]:
  """({batch: loss}, the final eval) from metrics.jsonl."""
  losses, final = {}, {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for record in map(json.loads, f):
      if "loss" in record and "event" not in record:
        losses[record["batch"]] = record["loss"]
      elif record.get("event") == "eval":
        final = {k: record[k] for k in ("auc", "logloss")}
  return losses, final


def _arrays(workdir: str, step: int) -> dict[str, np.ndarray]:
  """Every array of a step's train state and tables, by path (read as numpy)."""
  path = epath.Path(workdir, "checkpoints", str(step), "arrays")
  # The item's handler, not a Checkpointer: Checkpointer.metadata also reads the step's
  # _CHECKPOINT_METADATA, which lies one level up (the step directory), and warns.
  handler = ocp.PyTreeCheckpointHandler()
  try:
    metadata = handler.metadata(path)
    metadata = getattr(metadata, "tree", metadata)
    args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
    tree = handler.restore(path, args=ocp.args.PyTreeRestore(restore_args=args))
  finally:
    handler.close()
  leaves = jax.tree_util.tree_flatten_with_path({k: tree[k] for k in ("train_state", "embeddings")})
  return {jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves[0] if v is not None}


def _parameter_drift(ours: str, theirs: str, step: int) -> dict[str, float | int]:
  """How many final arrays differ, and the largest relative difference of the
  dense parameters and of the embedding tables."""
  a, b = _arrays(ours, step), _arrays(theirs, step)
  out = {"arrays": len(b), "differing": 0, "params": 0.0, "tables": 0.0}
  for path, theirs_value in b.items():
    ours_value = a[path]
    if ours_value.tobytes() == theirs_value.tobytes():
      continue
    out["differing"] += 1
    diff = np.abs(ours_value.astype(np.float64) - theirs_value)
    rel = float(np.max(diff / np.maximum(np.abs(theirs_value), 1e-30)))
    for kind in ("params", "table"):
      if f"'{kind}'" in path:
        key = "tables" if kind == "table" else "params"
        out[key] = max(out[key], rel)
  return out


def _data(root: str) -> None:
  """The demo's generated train and eval sets, written once for every run."""
  first = os.path.join(root, "first")
  _train(first, 1, 1, root, generate=True)
  for split in ("data", "data_eval"):
    os.replace(os.path.join(first, split), os.path.join(root, split))


def _drift(ours: dict[int, float], theirs: dict[int, float], stops: list[int], n: int):
  batches = sorted(theirs)
  assert sorted(ours) == batches, "the runs trained other batches"
  rel = np.array([abs(ours[b] - theirs[b]) / abs(theirs[b]) for b in batches])
  edges = sorted(
    {min(e, n) for e in (0, *stops, stops[-1] + 10, stops[-1] + 100, stops[-1] + 500, n)}
  )
  rows = []
  for lo, hi in zip(edges[:-1], edges[1:]):
    part = rel[lo:hi]
    if hi > lo and part.size:
      rows.append(
        {"batches": f"{lo + 1}-{hi}", "max": float(part.max()), "median": float(np.median(part))}
      )
  past = np.nonzero(rel > 1e-4)[0]
  return rows, (int(batches[past[0]]) if past.size else None)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--num_steps", type=int, default=2000)
  parser.add_argument("--stops", default="200,400", help="Batches after which the count changes.")
  parser.add_argument("--devices", default="1,4,1", help="Device counts, one per leg.")
  parser.add_argument("--json", default=None, type=outputs.argparse_path)
  parser.add_argument("--workdir", default=None, help="Keep the runs here (default: a temp dir).")
  args = parser.parse_args()
  stops = [int(s) for s in args.stops.split(",")]
  devices = [int(d) for d in args.devices.split(",")]
  assert len(devices) == len(stops) + 1, "--devices needs one count more than --stops"
  try:
    root = outputs.runs_folder(args.workdir, "resize", "--workdir")
  except app.UsageError as error:
    parser.error(str(error))
  try:
    _data(root)
    runs = {}
    for name, counts in (
      ("reference", [devices[0]]),
      ("control", [devices[0]] * len(devices)),
      ("resized", devices),
    ):
      workdir = os.path.join(root, name)
      ends = [args.num_steps] if len(counts) == 1 else [*stops, args.num_steps]
      for end, count in zip(ends, counts):
        _train(workdir, end, count, root)
      runs[name] = _results(workdir)
    (ref, ref_eval), (ctl, ctl_eval), (res, res_eval) = (
      runs["reference"],
      runs["control"],
      runs["resized"],
    )
    rows, past = _drift(res, ref, stops, args.num_steps)
    figures = {
      "num_steps": args.num_steps,
      "stops": stops,
      "devices": devices,
      "control_bitwise": ctl == ref and ctl_eval == ref_eval,
      "relative_loss_difference": rows,
      "first_batch_past_1e-4": past,
      "last_loss": {"reference": ref[args.num_steps], "resized": res[args.num_steps]},
      "final_eval": {"reference": ref_eval, "resized": res_eval},
      "final_arrays": _parameter_drift(
        os.path.join(root, "resized"), os.path.join(root, "reference"), args.num_steps
      ),
    }
  finally:
    if not args.workdir:  # our temp dir; a --workdir is the user's to keep
      shutil.rmtree(root, ignore_errors=True)
  legs = " -> ".join(str(d) for d in devices)
  print(f"demo, {args.num_steps} batches; resized {legs} devices after batches {args.stops}")
  same = figures["control_bitwise"]
  print(f"same stops on {devices[0]} device(s): losses and eval bit for bit: {same}")
  print(f"{'batches':>12} | {'max rel diff':>12} | {'median':>10}")
  for row in rows:
    print(f"{row['batches']:>12} | {row['max']:12.2e} | {row['median']:10.2e}")
  print(f"first batch past 1e-4 relative: {past}")
  for name, (losses, final) in (("reference", (ref, ref_eval)), ("resized", (res, res_eval))):
    print(
      f"{name:>9}: last loss {losses[args.num_steps]:.6f}, eval AUC {final['auc']:.4f},"
      f" log loss {final['logloss']:.6f}"
    )
  drift = figures["final_arrays"]
  print(
    f"final checkpoint: {drift['differing']} of {drift['arrays']} arrays differ; largest relative"
    f" difference {drift['params']:.1e} in the dense parameters, {drift['tables']:.1e} in the"
    " embedding tables"
  )
  if args.json:
    outputs.write(args.json, figures, indent=2)


if __name__ == "__main__":
  main()

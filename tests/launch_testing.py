"""Shared pieces of the launcher tests: a tiny config, datasets, results."""

from __future__ import annotations

import csv
import glob
import importlib.util
import json
import os
import struct
import sys
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from sparsepipe import data
from sparsepipe.launch.config.shipped import config_path

DEMO_CONFIG = config_path("demo")

# Small enough to compile and train in seconds on 2 cores, big enough to
# exercise stacking, FDO retunes (limits change) and several checkpoints.
TINY_OVERRIDES = {
  "num_steps": 8,
  "global_batch_size": 0,  # per host: the multi-process tests double the global batch
  "per_host_batch_size": 32,
  "log_every_steps": 1,
  "synthetic.num_examples": 1024,
  "synthetic.num_dense": 3,
  "synthetic.records_per_shard": 256,
  "model.bottom_mlp_dims": (8, 4),
  "model.top_mlp_dims": (8,),
  "model.embedding_dim": 4,
  "fdo.every_steps": 4,
  "checkpoint.every_steps": 3,
  "checkpoint.keep": 2,
  "synthetic.eval_examples": 0,  # no eval unless a test asks for it
  "eval.every_steps": 0,
  # The tests follow the pipelined schedule (fill, drain); "auto", the
  # default, would pick the sequential step on CPU devices.
  "pipelining": True,
}


def tiny_config(**overrides: Any):
  """configs/demo.py with TINY_OVERRIDES and `overrides` (dotted keys as a__b)."""
  spec = importlib.util.spec_from_file_location("demo_config", DEMO_CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  for key, value in {
    **TINY_OVERRIDES,
    **{k.replace("__", "."): v for k, v in overrides.items()},
  }.items():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    with node.ignore_type():  # pipelining: 'auto' by default, a bool in tests
      node[leaf] = value
  return config


def flag_overrides(**overrides: Any) -> list[str]:
  """The same overrides as launcher flags (--config.a.b=value)."""
  merged = {**TINY_OVERRIDES, **{k.replace("__", "."): v for k, v in overrides.items()}}
  out = []
  for key, value in merged.items():
    if isinstance(value, tuple):
      value = "(" + ",".join(str(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    out.append(f"--config.{key}={value}")
  return out


def launch_command(workdir: Any, **overrides: Any) -> list[str]:
  """`python -m sparsepipe.launch` of the tiny demo job in `workdir` (flag_overrides)."""
  return [
    sys.executable,
    "-m",
    "sparsepipe.launch",
    f"--workdir={workdir}",
    f"--config={DEMO_CONFIG}",
    *flag_overrides(**overrides),
  ]


def batch_losses(workdir: str) -> dict[int, float]:
  """{batch: loss} from metrics.jsonl (duplicates would be a bug: checked)."""
  losses: dict[int, float] = {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      record = json.loads(line)
      if "loss" in record:
        assert record["batch"] not in losses, f"batch {record['batch']} logged twice"
        losses[record["batch"]] = record["loss"]
  return losses


def events(workdir: str, kind: str) -> list[dict[str, Any]]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r.get("event") == kind]


def checkpoint_arrays(workdir: str, step: int) -> dict[str, np.ndarray]:
  """Every array of a step's train_state and embeddings items, by path."""
  path = os.path.join(workdir, "checkpoints", str(step), "arrays")
  with ocp.PyTreeCheckpointer() as checkpointer:
    # As numpy: the saving devices (other processes) need not exist here.
    metadata = checkpointer.metadata(path)
    metadata = getattr(metadata, "item_metadata", metadata)
    metadata = getattr(metadata, "tree", metadata)
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
    tree = checkpointer.restore(path, args=ocp.args.PyTreeRestore(restore_args=restore_args))
  out = {}
  for item in ("train_state", "embeddings"):
    for keypath, leaf in _flatten(tree[item], item):
      out[keypath] = np.asarray(leaf)
  return out


def _flatten(tree: Any, prefix: str):
  if isinstance(tree, dict):
    for k, v in tree.items():
      yield from _flatten(v, f"{prefix}/{k}")
  elif isinstance(tree, (list, tuple)):
    for i, v in enumerate(tree):
      yield from _flatten(v, f"{prefix}/{i}")
  elif tree is not None:
    yield prefix, tree


def shipped_config(name: str, **overrides: Any):
  """A shipped config with TINY_OVERRIDES' sizes and `overrides` (dotted keys as a__b)."""
  spec = importlib.util.spec_from_file_location(f"{name}_config", config_path(name))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  sizes = {k: v for k, v in TINY_OVERRIDES.items() if k in flatten_keys(config)}
  for key, value in {**sizes, **{k.replace("__", "."): v for k, v in overrides.items()}}.items():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    with node.ignore_type():  # pipelining: 'auto' by default, a bool in tests
      node[leaf] = value
  return config


def flatten_keys(config: Any, prefix: str = "") -> set[str]:
  """Dotted keys of a ConfigDict's leaves."""
  out = set()
  for key, value in config.items():
    name = f"{prefix}{key}"
    if hasattr(value, "items") and not isinstance(value, dict) and len(value):
      out |= flatten_keys(value, name + ".")
    else:
      out.add(name)
  return out


class BatchRecorder:
  """Records the global index of every batch the job's input hands out (monkeypatched)."""

  def __init__(self, monkeypatch):
    from sparsepipe import transforms  # pylint: disable=g-import-not-at-top

    self.indices: list[int] = []
    original = transforms.InputIterator.__next__

    def recording(iterator):
      index = iterator.next_batch
      out = original(iterator)
      self.indices.append(index)
      return out

    monkeypatch.setattr(transforms.InputIterator, "__next__", recording)


def remove_checkpoints_after(workdir: str, step: int) -> None:
  """Deletes the checkpoint steps after `step` (as if the job had stopped there)."""
  import shutil  # pylint: disable=g-import-not-at-top

  directory = os.path.join(workdir, "checkpoints")
  for name in os.listdir(directory):
    if name.isdigit() and int(name) > step:
      shutil.rmtree(os.path.join(directory, name))


def read_events(logdir: str):
  """Every Event of the event files, files in name order (TFRecord framing)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top

  for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
    with open(path, "rb") as f:
      data = f.read()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack("<Q", data[pos : pos + 8])
      yield event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length])
      pos += 12 + length + 4


def tensorboard_view(logdir: str) -> dict[tuple[int, str], float]:
  """{(step, tag): value} as TensorBoard shows the event files: a SessionLog START at
  step s (a writer's purge_step) drops the points of step >= s read before it;
  a point shown twice fails."""
  points = {}
  for event in read_events(logdir):
    if event.HasField("session_log") and event.session_log.status == 1:  # START
      points = {k: v for k, v in points.items() if k[0] < event.step}
    for value in event.summary.value:
      key = (event.step, value.tag)
      assert key not in points, f"{key} shown twice"
      points[key] = value.simple_value
  return points


def write_ratings_csv(path: str, *, seed: int) -> str:
  """Writes 400 random rating rows (userId, genre, age, rating) as CSV; returns `path`."""
  rng = np.random.default_rng(seed)
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["userId", "genre", "age", "rating"])
    for _ in range(400):
      row = [rng.integers(0, 50), f"g{rng.integers(0, 9)}", rng.integers(18, 70)]
      writer.writerow([*row, rng.integers(1, 6)])
  return path


def write_movielens_csv(path: str, *, rows: int = 2000, seed: int = 0) -> str:
  """Writes MovieLens-shaped rows (userId, movieId, rating, genres joined by '|') as CSV:
  the columns the README's conversion names; returns `path`."""
  rng = np.random.default_rng(seed)
  genres = ["Action", "Comedy", "Drama", "Horror", "Romance", "Sci-Fi", "Thriller"]
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["userId", "movieId", "rating", "genres"])
    for _ in range(rows):
      picked = rng.choice(genres, size=rng.integers(1, 4), replace=False)
      writer.writerow(
        [rng.integers(1, 300), rng.integers(1, 900), rng.integers(1, 6), "|".join(picked)]
      )
  return path


def convert_ratings(path: str, output: str, eval_output: str, **options: Any) -> None:
  """Converts `write_ratings_csv`'s file (a quarter held out; replacing `output`):
  label rating >= 4, integer user ids, a hashed genre, a dense age."""
  data.convert_csv(
    [path],
    output,
    eval_output=eval_output,
    eval_fraction=0.25,
    overwrite=True,
    label_column="rating",
    label_threshold=4.0,
    dense_columns=["age"],
    sparse_columns=["userId", "genre"],
    integer_id_columns=["userId"],
    vocab_sizes=["64"],
    **options,
  )

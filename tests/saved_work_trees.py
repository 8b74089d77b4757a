"""Saved work on disk for the output-path tests: a workdir of each version, a dataset,
an export and a file, as the files that make each one (core.saved_work)."""

import hashlib
import os

DATASET = '{"format": "sparsepipe.arrayrecord"}'
EXPORT = '{"format": "sparsepipe.export"}'


def tree(root, files: dict[str, str]) -> str:
  """Writes `files` ({relative path: text}) under `root`; returns `root`."""
  for name, text in files.items():
    path = os.path.join(root, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write(text)
  return str(root)


def saved_work(root) -> dict[str, str]:
  """{kind: path} of saved work under `root` (see the module docstring)."""
  return {
    "workdir": tree(root / "w", {"job.json": "{}", "checkpoints/4/x": "", "metrics.jsonl": ""}),
    "old_workdir": tree(root / "w02", {"checkpoints/4/x": ""}),
    "dataset": tree(root / "d", {"manifest.json": DATASET, "shard-00000": ""}),
    "export": tree(
      root / "e",
      {"export.json": EXPORT, "params.npz": "", "predict.jaxexport": "", "tables/user.npy": ""},
    ),
    "file": tree(root, {"notes.txt": "keep me"}) + "/notes.txt",
  }


def digests(root) -> dict[str, str]:
  """{relative path: sha256} of every file under `root` (hidden ones included)."""
  out = {}
  for folder, _, names in os.walk(root):
    for name in names:
      path = os.path.join(folder, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
  return out

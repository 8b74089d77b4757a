"""Cost of the converters' input checks and of the checked shard reader.

    python benchmarks/converters.py [--json out.json] [--lines 200000]

Measures, on a generated Criteo-shaped TSV file (gzip and plain):
  (a) reading its lines: sparsepipe.data.convert.text_input.read_lines (per-line
      UTF-8 decoding, errors with line numbers) against a plain text-mode
      file (the baseline, no line numbers in errors);
  (b) the whole Criteo conversion (parse, hash, write), for scale;
  (c) batched random record reads: data.source.ShardSource (unreadable
      records named and skippable) against Grain's ArrayRecordDataSource.
Ratios are against the baseline measured in the same run.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tempfile
import time

from absl import app
from absl import flags
import grain
import numpy as np

from sparsepipe import data
from sparsepipe.data.convert.text_input import read_lines

_JSON = flags.DEFINE_string("json", None, "Write the results here.")
_LINES = flags.DEFINE_integer("lines", 200_000, "Lines in the generated Criteo file.")


def _best_of(fn, repeats: int = 3) -> float:
  """Fastest of `repeats` runs, in seconds."""
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return min(times)


def _criteo_file(directory: str, n: int, compress: bool) -> str:
  rng = np.random.default_rng(0)
  cats = [f"{x:08x}" for x in rng.integers(0, 2**32, 5000)]
  lines = []
  for i in range(n):
    dense = [str(int(v)) if v > 1 else "" for v in rng.exponential(20, 13)]
    sparse = [cats[j] for j in rng.integers(0, len(cats), 26)]
    lines.append("\t".join([str(i % 2), *dense, *sparse]) + "\n")
  text = "".join(lines).encode()
  path = os.path.join(directory, "day.tsv.gz" if compress else "day.tsv")
  with gzip.open(path, "wb") if compress else open(path, "wb") as f:
    f.write(text)
  return path


def _plain_lines(path: str) -> int:
  raw = gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")
  with io.TextIOWrapper(raw, encoding="utf-8", newline="") as f:
    return sum(1 for _ in f)


def _reads(source, order: np.ndarray, batch: int) -> None:
  for start in range(0, len(order), batch):
    source.__getitems__(order[start : start + batch].tolist())


def main(argv) -> None:
  del argv
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for compress in (False, True):
      path = _criteo_file(tmp, _LINES.value, compress)
      # pylint: disable=cell-var-from-loop
      base = _best_of(lambda: _plain_lines(path))
      ours = _best_of(lambda: sum(1 for _ in read_lines(path)))
      rows.append((f"read lines ({'gzip' if compress else 'plain'})", base, ours))
    out = os.path.join(tmp, "out")
    convert = _best_of(
      lambda: data.convert_criteo([path], out, vocab_sizes=100_000, overwrite=True), repeats=1
    )
    rows.append(("criteo conversion (gzip), for scale", convert, convert))
    manifest = data.read_manifest(out)
    paths = [f"{p}[0:{s.num_records}]" for p, s in zip(manifest.shard_paths(), manifest.shards)]
    order = np.random.default_rng(1).permutation(manifest.num_records)
    options = dict(data.source.DEFAULT_READER_OPTIONS)
    grain_source = grain.sources.ArrayRecordDataSource(paths, reader_options=options)
    checked = data.manifest_source(manifest)
    base = _best_of(lambda: _reads(grain_source, order, 64))
    ours = _best_of(lambda: _reads(checked, order, 64))
    rows.append(("random record reads, 64 per call", base, ours))
  print(f"{'measure':40s} {'baseline s':>11s} {'ours s':>9s} {'ours/base':>10s}")
  for name, base, ours in rows:
    print(f"{name:40s} {base:11.3f} {ours:9.3f} {ours / base:10.3f}")
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(
        [{"measure": n, "baseline_s": b, "ours_s": o, "ratio": o / b} for n, b, o in rows],
        f,
        indent=1,
      )


if __name__ == "__main__":
  app.run(main)

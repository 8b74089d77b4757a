"""Cost of the converters' input checks and of the checked shard reader.

    python benchmarks/converters.py [--json out.json] [--lines 200000]

Measures, on a generated Criteo-shaped TSV file (gzip and plain):
  (a) reading its lines: sparsepipe.data.convert.text_input.read_lines (per-line
      UTF-8 decoding, errors with line numbers) against a plain text-mode
      file (the baseline, no line numbers in errors);
  (b) the whole Criteo conversion (parse, hash, write), for scale;
  (c) batched random record reads: data.source.ShardSource (unreadable
      records named and skippable; the file reader's default buffer)
      against Grain's ArrayRecordDataSource (a 32 KiB buffer each read
      fills), of the conversion's records of 128 examples, 64 per call, and
      of the same lines converted to records of one example, 4096 per call;
  (d) the Parquet converter against the CSV converter on one generated
      Criteo-shaped table (label, 13 integer columns with nulls, 26 string
      columns of Zipf-distributed categories, a list<string> column of 0-4
      items) written both ways, with equivalent flags; both give the same
      dataset (checked), rows/s of each.
Ratios are against the baseline measured in the same run.

    python benchmarks/converters.py --parquet_rss_rows 1000000,4000000

instead measures the peak RSS of `python -m sparsepipe.data.parquet` on
generated files of those many rows (row groups of pyarrow's default 1Mi
rows), next to a process that only imports sparsepipe.data.
"""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import grain
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from sparsepipe import data
from sparsepipe.data.convert.text_input import read_lines
import outputs

_JSON = outputs.json_flag("Write the results here.")
_LINES = flags.DEFINE_integer("lines", 200_000, "Lines in the generated Criteo file.")
_TABLE_ROWS = flags.DEFINE_integer("table_rows", 200_000, "Rows of the CSV/Parquet table.")
_RSS_ROWS = flags.DEFINE_list("parquet_rss_rows", [], "Measure peak RSS at these row counts.")

_DENSE = [f"I{i}" for i in range(1, 14)]
_SPARSE = [f"C{i}" for i in range(1, 27)]
# Equivalent flags for both converters; the CSV one also splits "tags" on "|".
_COLUMNS = dict(
  label_column="label",
  dense_columns=_DENSE,
  dense_transform="log1p",
  sparse_columns=[*_SPARSE, "tags"],
  vocab_sizes=100_000,
)


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


def _record_reads(manifest, batch: int, what: str) -> tuple[str, float, float]:
  """(c): every record in a random order, Grain's source (baseline) and ours."""
  paths = [f"{p}[0:{s.num_records}]" for p, s in zip(manifest.shard_paths(), manifest.shards)]
  order = np.random.default_rng(1).permutation(manifest.num_records)
  options = dict(data.source.DEFAULT_READER_OPTIONS)
  grain_source = grain.sources.ArrayRecordDataSource(paths, reader_options=options)
  checked = data.manifest_source(manifest)
  base = _best_of(lambda: _reads(grain_source, order, batch))
  ours = _best_of(lambda: _reads(checked, order, batch))
  return (f"random reads, {what}", base, ours)


def _click_table(n: int, seed: int) -> pa.Table:
  """A Criteo-shaped table, generated column by column (no per-row Python).

  Categories are Zipf-distributed numbers as text (exponent 1.2): a few
  frequent ones and a long tail of rare ones, as in click logs.
  """
  rng = np.random.default_rng(seed)
  categories = lambda size: pa.array(rng.zipf(1.2, size)).cast(pa.string())
  columns = {"label": pa.array(rng.integers(0, 2, n))}
  for name in _DENSE:
    values = rng.exponential(20, n).astype(np.int64)
    columns[name] = pa.array(values, mask=rng.random(n) < 0.2)
  for name in _SPARSE:
    columns[name] = categories(n)
  lengths = rng.integers(0, 5, n)
  offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
  columns["tags"] = pa.ListArray.from_arrays(offsets, categories(int(lengths.sum())))
  return pa.table(columns)


def _write_table_both_ways(directory: str, n: int) -> tuple[str, str]:
  table = _click_table(n, 0)
  parquet = os.path.join(directory, "table.parquet")
  pq.write_table(table, parquet)
  as_text = table.set_column(
    table.schema.get_field_index("tags"), "tags", pc.binary_join(table["tags"], "|")
  )
  csv_path = os.path.join(directory, "table.csv")
  pa_csv.write_csv(as_text, csv_path)
  return csv_path, parquet


def _parquet_against_csv(directory: str, n: int) -> dict:
  """Seconds and rows/s of both converters on the same table; their outputs must agree."""
  csv_path, parquet = _write_table_both_ways(directory, n)
  outputs = {k: os.path.join(directory, k) for k in ("csv", "parquet")}
  csv_s = _best_of(
    lambda: data.convert_csv(
      [csv_path], outputs["csv"], multivalent_columns=["tags"], overwrite=True, **_COLUMNS
    ),
    repeats=2,
  )
  parquet_s = _best_of(
    lambda: data.convert_parquet([parquet], outputs["parquet"], overwrite=True, **_COLUMNS),
    repeats=2,
  )
  a, b = (data.manifest_source(data.read_manifest(outputs[k])) for k in ("csv", "parquet"))
  if len(a) != len(b) or any(a[i] != b[i] for i in range(len(a))):
    raise AssertionError("the CSV and Parquet conversions of the same table differ")
  return {"rows": n, "csv_s": csv_s, "parquet_s": parquet_s}


# Runs `python -m MODULE ARGS...` (or only imports sparsepipe.data when MODULE is "-") and
# prints its own peak RSS at exit. The kernel's VmHWM of the process, not getrusage's
# ru_maxrss: that one keeps the parent's size at fork (this script's generated tables).
_REPORT_PEAK = """
import atexit, runpy, sys
def report():
  status = open("/proc/self/status").read().split("VmHWM:")[1]
  print("peak_kib", status.split()[0], file=sys.stderr)
atexit.register(report)
sys.argv = sys.argv[1:]
if sys.argv[0] == "-":
  import sparsepipe.data
else:
  runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def _peak_rss_mib(module: str, args: list[str]) -> float:
  """Peak resident memory of `python -m module args...` in a child process, in MiB."""
  out = subprocess.run(
    [sys.executable, "-c", _REPORT_PEAK, module, *args],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
    check=True,
  )
  return int(out.stderr.split("peak_kib")[-1].split()[0]) / 1024


def _parquet_rss(row_counts: list[int]) -> list[dict]:
  """Peak RSS of the Parquet command line on files of `row_counts` rows."""
  results = []
  with tempfile.TemporaryDirectory() as tmp:
    base = _peak_rss_mib("-", [])
    for n in row_counts:
      path = os.path.join(tmp, f"rows{n}.parquet")
      with pq.ParquetWriter(path, _click_table(1, 0).schema) as writer:
        for start in range(0, n, 1 << 20):  # written in parts: the generator stays small too
          writer.write_table(_click_table(min(1 << 20, n - start), start), 1 << 20)
      flag_values = [
        *("--label_column", "label", "--dense_columns", ",".join(_DENSE)),
        *("--dense_transform", "log1p", "--sparse_columns", ",".join([*_SPARSE, "tags"])),
        *("--vocab_sizes", "100000", "--input", path, "--output", os.path.join(tmp, "out")),
      ]
      rss = _peak_rss_mib("sparsepipe.data.parquet", [*flag_values, "--overwrite"])
      size = os.path.getsize(path) / 2**20
      results.append({"rows": n, "file_mib": size, "peak_rss_mib": rss, "import_rss_mib": base})
      print(
        f"{n:>10,} rows ({size:,.0f} MiB Parquet): peak RSS {rss:,.0f} MiB"
        f" (importing sparsepipe.data alone: {base:,.0f} MiB)"
      )
  return results


def main(argv) -> None:
  del argv
  if _RSS_ROWS.value:
    results = _parquet_rss([int(n) for n in _RSS_ROWS.value])
    if _JSON.value:
      outputs.write(_JSON.value, results)
    return
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
    rows.append(_record_reads(data.read_manifest(out), 64, "records of 128, 64 per call"))
    one = data.convert_criteo(
      [path], os.path.join(tmp, "one"), vocab_sizes=100_000, examples_per_record=1
    )
    rows.append(_record_reads(one, 4096, "records of 1, 4096 per call"))
    table = _parquet_against_csv(tmp, _TABLE_ROWS.value)
    rows.append(("parquet conversion (baseline: csv)", table["csv_s"], table["parquet_s"]))
  width = max(len(name) for name, _, _ in rows)  # the labels' column, as wide as the longest
  print(f"{'measure':{width}s} {'baseline s':>11s} {'ours s':>9s} {'ours/base':>10s}")
  for name, base, ours in rows:
    print(f"{name:{width}s} {base:11.3f} {ours:9.3f} {ours / base:10.3f}")
  table_rows = table["rows"]
  csv_rate, parquet_rate = table_rows / table["csv_s"], table_rows / table["parquet_s"]
  print(
    f"{table_rows:,} rows: csv {csv_rate:,.0f} rows/s, parquet {parquet_rate:,.0f} rows/s"
    f" (parquet/csv {parquet_rate / csv_rate:.2f}x)"
  )
  if _JSON.value:
    results = [{"measure": n, "baseline_s": b, "ours_s": o, "ratio": o / b} for n, b, o in rows]
    results[-1].update(rows=table_rows, csv_rows_per_s=csv_rate, parquet_rows_per_s=parquet_rate)
    outputs.write(_JSON.value, results)


if __name__ == "__main__":
  app.run(main)

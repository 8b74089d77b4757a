"""python -m sparsepipe.serving.apply --base E --delta D [--delta D2 ...] --output E2

Applies deltas (made with `launch.export --since`) to a full export, in
order, and writes the result as a full export of the newest delta's
checkpoint: its tables and dense parameters equal, bit for bit, those of a
full export of that checkpoint. It keeps the newest delta's export_id (it
holds the model that delta stands for), so the deltas made after that one
apply to it as well: E + D40 = A40, then A40 + D60. The base and the deltas
are left as they are; the output is written beside its place and moved in
when complete, and is never one of them or inside them
(output_paths.check_export_output).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Sequence

from absl import app
from absl import flags

from sparsepipe import command_line
from sparsepipe.serving.export_format import PREDICT_FILENAME
from sparsepipe.serving.export_format import ExportInfo
from sparsepipe.serving.export_format import read_info
from sparsepipe.serving.export_format import write_export
from sparsepipe.serving.output_paths import check_export_output
from sparsepipe.serving.predictor import load_chain


def apply_deltas(base: str, deltas: Sequence[str], output: str, *, overwrite: bool = False):
  """Writes `base` with `deltas` applied as a full export at `output`; returns its info."""
  if not deltas:
    raise ValueError("give at least one --delta to apply")
  inputs = [("the --base export", base)] + [("a --delta export", d) for d in deltas]
  check_export_output(output, overwrite=overwrite, inputs=inputs)
  first, newest, tables, params = load_chain(base, deltas)
  with open(os.path.join(base, PREDICT_FILENAME), "rb") as f:
    predict = f.read()
  shapes = {t: {**v, "rows": int(tables[t].shape[0])} for t, v in first.tables.items()}
  # The newest delta's export_id: the deltas made on top of it apply to this export too.
  info: ExportInfo = dataclasses.replace(newest, kind="full", since=None, tables=shapes)
  write_export(
    output, info, params=params, tables=tables, ids=None, predict=predict, overwrite=overwrite
  )
  return read_info(output)


def _define_flags() -> None:
  flags.DEFINE_string("base", None, "A full export.", required=True)
  flags.DEFINE_multi_string(
    "delta", None, "A delta made after it; repeat the flag for each, in order.", required=True
  )
  flags.DEFINE_string("output", None, "The full export to write.", required=True)
  flags.DEFINE_bool("overwrite", False, "Replace an existing export (only an export) at --output.")
  flags.DEFINE_bool("verbose", False, "On an error, print the traceback.")


def main(argv) -> int:
  command_line.start_command(argv)
  f = flags.FLAGS
  info = apply_deltas(f.base, f.delta, f.output, overwrite=f.overwrite)
  print(
    f"export of checkpoint {info.checkpoint_step} (after batch {info.batches_trained}) from"
    f" {f.base} and {len(f.delta)} delta(s): {f.output}"
  )
  return 0


if __name__ == "__main__":
  _define_flags()
  sys.exit(app.run(command_line.reports_errors(main), flags_parser=command_line.parse_flags))

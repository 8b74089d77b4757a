"""What the dataset-writing commands share: the writer flags and the run step.

The commands (criteo.py, csv.py, synthetic.py) define their own flags plus
these, then hand their converter to `run_and_summarize`, which adds the
writer flags, shows progress and prints the one summary line. A bad input
or argument ends the command with one line on stderr (`error: ...`) and
exit status 1; `--verbose` shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, Sequence

from absl import flags

from sparsepipe.command_line import USER_ERRORS
from sparsepipe.command_line import exit_with_error
from sparsepipe.data.conversion_rules import COLUMN_CONVERTERS, maker
from sparsepipe.data.manifest import Manifest, read_manifest
from sparsepipe.data.convert.outputs import check_dataset_output
from sparsepipe.data.progress import summarize
from sparsepipe.data.convert.dense_stats import SWAMP_MAGNITUDE, scale_warnings
from sparsepipe.data.convert.text_input import DENSE_TRANSFORMS
from sparsepipe.data.convert.vocab_sizing import HEADROOM, VOCAB_CAP, sizing_lines
from sparsepipe.data.writer import DEFAULT_EXAMPLES_PER_RECORD, DEFAULT_MAX_RECORDS_PER_SHARD
from sparsepipe.data.writer import check_apart

# The flags defined below belong to the command that asks for them, so its
# `--help` lists them with its own (absl's mechanism for helper modules).
flags.disclaim_key_flags()


def define_input_flag(help_text: str) -> None:
  """--input: a required list of input files."""
  flags.DEFINE_list("input", None, help_text, required=True)


def define_column_flags(sparse_help: str) -> None:
  """The column converters' (CSV, Parquet) flags for label, dense and sparse columns."""
  flags.DEFINE_string("label_column", None, "Column holding the label.", required=True)
  flags.DEFINE_float("label_threshold", None, "If set, label = 1.0 if value >= threshold else 0.0.")
  flags.DEFINE_list("dense_columns", [], "Numeric columns, in order.")
  flags.DEFINE_enum(
    "dense_transform",
    "auto",
    ("auto", *DENSE_TRANSFORMS),
    "Transform of dense values: log1p (log(1 + max(x, 0))), none, or auto: log1p for a"
    f" column whose values are all >= 0 and reach above {SWAMP_MAGNITUDE:g}, none for others.",
  )
  flags.DEFINE_list("sparse_columns", [], sparse_help)
  flags.DEFINE_list("integer_id_columns", [], "Sparse columns holding integer ids (not hashed).")
  flags.DEFINE_list(
    "vocab_sizes",
    [],
    "Default N and/or column=N entries; a column without one is sized from its distinct"
    f" values ({HEADROOM}x, a power of two, at most {VOCAB_CAP:,}).",
  )
  flags.DEFINE_string(
    "like",
    None,
    "A dataset converted before with the same columns (e.g. the train data): take its"
    " vocabulary sizes and dense transforms, so that this input (a held-out file) gets the"
    " same ids and dense values. Not with --vocab_sizes or --dense_transform.",
  )


# The column flags a --like dataset must have been converted with.
_LIKE_COLUMNS = ("label_column", "dense_columns", "sparse_columns", "integer_id_columns")


def column_kwargs() -> dict[str, Any]:
  """The column converters' arguments from define_column_flags' flags (and --like's
  dataset)."""
  f = flags.FLAGS
  names = ("label_column", "label_threshold", "dense_columns", "dense_transform")
  names += ("sparse_columns", "integer_id_columns", "vocab_sizes")
  kwargs = {name: f[name].value for name in names}
  if f.like is not None:
    kwargs.update(_like(f.like, kwargs))
  return kwargs


def _like(directory: str, kwargs: dict[str, Any]) -> dict[str, Any]:
  """vocab_sizes and dense_transform as the dataset in `directory` was converted with."""
  given = [name for name in ("vocab_sizes", "dense_transform") if flags.FLAGS[name].present]
  if given:
    raise ValueError(f"--like takes --{given[0]} from '{directory}': give one of them, not both")
  info = read_manifest(directory).info
  if maker(info) not in COLUMN_CONVERTERS:
    raise ValueError(
      f"--like '{directory}' was made by {maker(info)!r}, not by the CSV or Parquet"
      " converter: give a dataset converted from columns"
    )
  for name in _LIKE_COLUMNS:
    theirs, ours = info.get(name), kwargs[name]
    if (list(theirs or ()) if isinstance(ours, list) else theirs) != ours:
      raise ValueError(
        f"--like '{directory}' was converted with --{name}={theirs!r}, this command gives"
        f" {ours!r}: give the same columns"
      )
  return {
    "vocab_sizes": [f"{column}={size}" for column, size in info["vocab_sizes"].items()],
    "dense_transform": info.get("dense_transform", "none"),
  }


def _check_like_is_no_output(eval_output: str | None) -> None:
  """ValueError if --like names --output or --eval_output: the dataset read to
  convert alike would be replaced by the conversion (with --overwrite)."""
  like = flags.FLAGS["like"].value if "like" in flags.FLAGS else None
  if like is None:
    return
  for flag, output in (("--output", flags.FLAGS.output), ("--eval_output", eval_output)):
    if output and os.path.realpath(output) == os.path.realpath(like):
      raise ValueError(
        f"--like '{like}' is the {flag}: --like reads the dataset this one is converted like;"
        f" give another {flag}"
      )


def define_writer_flags() -> None:
  """--output, --examples_per_record, --max_records_per_shard, --overwrite, --verbose."""
  flags.DEFINE_string("output", None, "Output dataset directory.", required=True)
  flags.DEFINE_integer(
    "examples_per_record", DEFAULT_EXAMPLES_PER_RECORD, "Examples packed per record."
  )
  flags.DEFINE_integer(
    "max_records_per_shard", DEFAULT_MAX_RECORDS_PER_SHARD, "Records per shard file."
  )
  flags.DEFINE_bool("overwrite", False, "Replace an existing dataset in --output.")
  flags.DEFINE_bool("verbose", False, "On an error, print the traceback, not just the message.")


def define_split_flags() -> None:
  """--eval_output, --eval_fraction, --split_seed (see sparsepipe.data.split)."""
  flags.DEFINE_string("eval_output", None, "Also write an eval split to this directory.")
  flags.DEFINE_float("eval_fraction", 0.0, "Share of the examples that go to --eval_output.")
  flags.DEFINE_integer("split_seed", 0, "Seed of the deterministic train/eval split.")


def split_kwargs() -> dict[str, Any]:
  """The converters' eval-split arguments from define_split_flags' flags."""
  f = flags.FLAGS
  if f.eval_output is None and f["eval_fraction"].present:
    raise ValueError("--eval_fraction needs --eval_output (the directory of the eval split)")
  return dict(eval_output=f.eval_output, eval_fraction=f.eval_fraction, split_seed=f.split_seed)


def input_paths(argv: Sequence[str]) -> list[str]:
  """--input, then any paths given as arguments (so `--input a.tsv b.tsv` works)."""
  return list(flags.FLAGS.input) + list(argv[1:])


def run_and_summarize(write: Callable[..., Manifest], *args: Any, **kwargs: Any) -> Manifest:
  """Calls `write(*args, output_dir=--output, <writer flags>, show_progress=True, **kwargs)`.

  Prints the summary line (progress.summarize; one more for an eval split),
  the vocabulary sizes chosen from the data (vocab_sizing.sizing_lines), and
  on stderr a warning per dense column stored at a scale that swamps a
  model (dense_stats.scale_warnings),
  and returns the manifest; a bad input ends the command (exit_with_error).
  """
  f = flags.FLAGS
  start = time.monotonic()
  try:
    check_dataset_output(f.output)
    if kwargs.get("eval_output"):
      check_dataset_output(kwargs["eval_output"], "--eval_output")
      check_apart(f.output, kwargs["eval_output"])
    _check_like_is_no_output(kwargs.get("eval_output"))
    manifest = write(
      *args,
      output_dir=f.output,
      examples_per_record=f.examples_per_record,
      max_records_per_shard=f.max_records_per_shard,
      overwrite=f.overwrite,
      show_progress=True,
      **kwargs,
    )
  except USER_ERRORS as e:
    if f.verbose:
      raise
    exit_with_error(e)
  seconds = time.monotonic() - start
  print(summarize(manifest, seconds))
  if kwargs.get("eval_output"):
    print(summarize(read_manifest(kwargs["eval_output"]), seconds))
  for line in sizing_lines(manifest.info.get("vocab_sizing") or {}):
    print(line)
  for warning in scale_warnings(manifest.info):
    print(f"warning: {warning}", file=sys.stderr, flush=True)
  return manifest

"""What the dataset-writing commands share: the writer flags and the run step.

The commands (criteo.py, csv.py, synthetic.py) define their own flags plus
these, then hand their converter to `run_and_summarize`, which adds the
writer flags, shows progress and prints the one summary line.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from absl import flags

from sparsepipe.data.manifest import Manifest
from sparsepipe.data.progress import summarize
from sparsepipe.data.writer import DEFAULT_EXAMPLES_PER_RECORD, DEFAULT_MAX_RECORDS_PER_SHARD

# The flags defined below belong to the command that asks for them, so its
# `--help` lists them with its own (absl's mechanism for helper modules).
flags.disclaim_key_flags()


def define_input_flag(help_text: str) -> None:
  """--input: a required list of input files."""
  flags.DEFINE_list("input", None, help_text, required=True)


def define_writer_flags() -> None:
  """--output, --examples_per_record, --max_records_per_shard, --overwrite."""
  flags.DEFINE_string("output", None, "Output dataset directory.", required=True)
  flags.DEFINE_integer("examples_per_record", DEFAULT_EXAMPLES_PER_RECORD, "Examples packed per record.")
  flags.DEFINE_integer("max_records_per_shard", DEFAULT_MAX_RECORDS_PER_SHARD, "Records per shard file.")
  flags.DEFINE_bool("overwrite", False, "Replace an existing dataset in --output.")


def input_paths(argv: Sequence[str]) -> list[str]:
  """--input, then any paths given as arguments (so `--input a.tsv b.tsv` works)."""
  return list(flags.FLAGS.input) + list(argv[1:])


def run_and_summarize(write: Callable[..., Manifest], *args: Any, **kwargs: Any) -> Manifest:
  """Calls `write(*args, output_dir=--output, <writer flags>, show_progress=True, **kwargs)`.

  Prints the summary line (progress.summarize) and returns the manifest.
  """
  f = flags.FLAGS
  start = time.monotonic()
  manifest = write(
      *args,
      output_dir=f.output,
      examples_per_record=f.examples_per_record,
      max_records_per_shard=f.max_records_per_shard,
      overwrite=f.overwrite,
      show_progress=True,
      **kwargs,
  )
  print(summarize(manifest, time.monotonic() - start))
  return manifest

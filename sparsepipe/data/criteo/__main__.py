r"""Command line: convert Criteo click logs (see convert.py for the transforms).

    python -m sparsepipe.data.criteo --input day_0.gz,day_1.gz --output DIR \
        [--vocab_sizes 1000000] [--empty_category drop|reserve] \
        [--eval_output DIR --eval_fraction 0.05 [--split_seed 0]] [--verbose]
"""

from __future__ import annotations

from absl import flags

from sparsepipe import command_line
from sparsepipe.data.convert import cli
from sparsepipe.data.criteo.convert import EMPTY_CATEGORY_MODES, convert_criteo


def _define_flags():
  cli.define_input_flag("Criteo TSV files (.gz allowed), in order; more may follow as arguments.")
  flags.DEFINE_list(
    "vocab_sizes",
    [],
    "One vocab size for all 26 features, or 26; none: each feature's from its distinct values"
    " (4x, a power of two, at most 1,048,576; a first pass over the input counts them).",
  )
  flags.DEFINE_enum(
    "empty_category",
    "drop",
    EMPTY_CATEGORY_MODES,
    "Empty categorical field: no id, or reserved id 0.",
  )
  flags.DEFINE_string("delimiter", "auto", "auto, tab, comma, or one character.")
  flags.DEFINE_enum(
    "header", "auto", ["auto", "yes", "no"], "Whether each file starts with a header line."
  )
  cli.define_writer_flags()
  cli.define_split_flags()


def _main(argv):
  f = flags.FLAGS
  cli.run_and_summarize(
    convert_criteo,
    cli.input_paths(argv),
    vocab_sizes=f.vocab_sizes,
    empty_category=f.empty_category,
    delimiter=f.delimiter,
    header=f.header,
    **cli.split_kwargs(),
  )


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top

  _define_flags()
  app.run(command_line.reports_errors(_main), flags_parser=command_line.parse_flags)

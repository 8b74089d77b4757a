r"""Command line: convert a CSV file (see convert.py for the column options).

    python -m sparsepipe.data.csv --input ratings.csv --output DIR \
        --label_column rating --label_threshold 4 \
        --sparse_columns userId,movieId,genres --multivalent_columns genres \
        --separator '|' --integer_id_columns userId,movieId \
        [--dense_columns COLUMN,...] [--vocab_sizes N,userId=N,...] \
        [--eval_output DIR --eval_fraction 0.05 [--split_seed 0]] [--verbose]

ratings.csv here: MovieLens ratings joined with movies.csv (columns
userId,movieId,rating,genres; genres as Comedy|Drama).
"""

from __future__ import annotations

from absl import flags

from sparsepipe import command_line
from sparsepipe.data.convert import cli
from sparsepipe.data.csv.convert import convert_csv


def _define_flags():
  cli.define_input_flag(
    "CSV files with the same header (.gz allowed); more may follow as arguments."
  )
  cli.define_column_flags("Categorical columns, in order.")
  flags.DEFINE_list("multivalent_columns", [], "Sparse columns holding several values.")
  flags.DEFINE_string("separator", "|", "Separator inside multivalent fields.")
  flags.DEFINE_string("delimiter", ",", "Field delimiter: a character, tab, comma or auto.")
  cli.define_writer_flags()
  cli.define_split_flags()


def _main(argv):
  f = flags.FLAGS
  cli.run_and_summarize(
    convert_csv,
    cli.input_paths(argv),
    delimiter=f.delimiter,
    multivalent_columns=f.multivalent_columns,
    separator=f.separator,
    **cli.column_kwargs(),
    **cli.split_kwargs(),
  )


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top

  _define_flags()
  app.run(command_line.reports_errors(_main), flags_parser=command_line.parse_flags)

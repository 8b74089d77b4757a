r"""Command line: convert Parquet files or directories (see convert.py for the columns).

    python -m sparsepipe.data.parquet --input ratings.parquet --output DIR \
        --label_column rating --label_threshold 4 \
        --sparse_columns userId,movieId,genres --integer_id_columns userId,movieId \
        [--dense_columns COLUMN,...] [--vocab_sizes N,userId=N,...] \
        [--weight_columns genres=genre_weights] \
        [--eval_output DIR --eval_fraction 0.05 [--split_seed 0]] [--verbose]

List columns (e.g. genres as list<string>) are multivalent by their type.
"""

from __future__ import annotations

from absl import flags

from sparsepipe import command_line
from sparsepipe.data.convert import cli
from sparsepipe.data.parquet.convert import DEFAULT_BATCH_ROWS, convert_parquet


def _define_flags():
  cli.define_input_flag(
    "Parquet files or directories of them (.parquet files, sorted); more may follow as arguments."
  )
  cli.define_column_flags("Categorical columns (scalar or list), in order.")
  flags.DEFINE_list(
    "weight_columns", [], "feature=column entries: the column holds the feature's id weights."
  )
  flags.DEFINE_integer("batch_rows", DEFAULT_BATCH_ROWS, "Rows read and converted at a time.")
  cli.define_writer_flags()
  cli.define_split_flags()


def _main(argv):
  f = flags.FLAGS
  cli.run_and_summarize(
    convert_parquet,
    cli.input_paths(argv),
    batch_rows=f.batch_rows,
    weight_columns=f.weight_columns,
    **cli.column_kwargs(),
    **cli.split_kwargs(),
  )


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top

  _define_flags()
  app.run(command_line.reports_errors(_main), flags_parser=command_line.parse_flags)

r"""Command line: write a synthetic dataset (see generate.py for the data).

    python -m sparsepipe.data.synthetic --output DIR --num_examples 1000000 \
        --num_dense 13 --num_sparse 26 --vocab_sizes 100000 --min_ids 1 --max_ids 20 \
        --eval_output EVAL_DIR --eval_fraction 0.05
"""

from __future__ import annotations

from absl import flags

from sparsepipe import command_line
from sparsepipe.data.convert import cli
from sparsepipe.data.synthetic.generate import criteo_like_features, write_synthetic
from sparsepipe.data.convert.text_input import parse_size


def _define_flags():
  flags.DEFINE_integer("num_examples", 100_000, "Examples to generate.")
  flags.DEFINE_integer("num_dense", 13, "Dense features per example.")
  flags.DEFINE_integer("num_sparse", 26, "Sparse features (named C1..Cn).")
  flags.DEFINE_list("vocab_sizes", ["100000"], "One vocab size for all, or one per feature.")
  flags.DEFINE_integer("min_ids", 1, "Fewest ids per feature per example.")
  flags.DEFINE_integer("max_ids", 20, "Most ids per feature per example.")
  flags.DEFINE_float("zipf_exponent", 1.1, "Zipf exponent of the id distribution.")
  flags.DEFINE_bool("weighted", False, "Give every sparse feature float weights.")
  flags.DEFINE_integer("seed", 0, "Random seed (the dataset is a function of it).")
  flags.DEFINE_string("eval_output", None, "Also write an eval dataset (same model) here.")
  flags.DEFINE_float("eval_fraction", None, "Share of --num_examples that goes to --eval_output.")
  flags.DEFINE_integer("eval_examples", None, "Eval examples (instead of --eval_fraction).")
  cli.define_writer_flags()


def _main(argv):
  del argv
  f = flags.FLAGS
  features = criteo_like_features(
    f.num_sparse,
    [parse_size(v, "vocab_sizes (--vocab_sizes)") for v in f.vocab_sizes],
    min_ids=f.min_ids,
    max_ids=f.max_ids,
    weighted=f.weighted,
    zipf_exponent=f.zipf_exponent,
  )
  cli.run_and_summarize(
    write_synthetic,
    features=features,
    num_examples=f.num_examples,
    num_dense=f.num_dense,
    seed=f.seed,
    eval_output=f.eval_output,
    eval_fraction=f.eval_fraction,
    eval_examples=f.eval_examples,
  )


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top

  _define_flags()
  app.run(command_line.reports_errors(_main), flags_parser=command_line.parse_flags)

"""Command line: convert Criteo click logs (see criteo_convert.py for the transforms).

    python -m sparsepipe.data.criteo --input day_0.gz,day_1.gz --output DIR \
        --vocab_sizes 1000000 [--empty_category drop|reserve]
"""

from __future__ import annotations

import time

from sparsepipe.data.criteo_convert import EMPTY_CATEGORY_MODES, convert_criteo
from sparsepipe.data.progress import summarize
from sparsepipe.data.writer import DEFAULT_EXAMPLES_PER_RECORD, DEFAULT_MAX_RECORDS_PER_SHARD


def _define_flags():
  from absl import flags  # pylint: disable=g-import-not-at-top

  flags.DEFINE_list("input", None, "Criteo TSV files (.gz allowed), in order; more may follow as arguments.", required=True)
  flags.DEFINE_string("output", None, "Output dataset directory.", required=True)
  flags.DEFINE_list("vocab_sizes", ["1000000"], "One vocab size for all 26 features, or 26.")
  flags.DEFINE_enum("empty_category", "drop", EMPTY_CATEGORY_MODES, "Empty categorical field: no id, or reserved id 0.")
  flags.DEFINE_string("delimiter", "auto", "auto, tab, comma, or one character.")
  flags.DEFINE_enum("header", "auto", ["auto", "yes", "no"], "Whether each file starts with a header line.")
  flags.DEFINE_integer("examples_per_record", DEFAULT_EXAMPLES_PER_RECORD, "Examples packed per record.")
  flags.DEFINE_integer("max_records_per_shard", DEFAULT_MAX_RECORDS_PER_SHARD, "Records per shard file.")
  flags.DEFINE_bool("overwrite", False, "Replace an existing dataset in --output.")


def _main(argv):
  from absl import flags  # pylint: disable=g-import-not-at-top

  f = flags.FLAGS
  inputs = list(f.input) + list(argv[1:])  # `--input a.tsv b.tsv` works too.
  start = time.monotonic()
  manifest = convert_criteo(
      inputs,
      f.output,
      vocab_sizes=[int(v) for v in f.vocab_sizes],
      empty_category=f.empty_category,
      delimiter=f.delimiter,
      header=f.header,
      examples_per_record=f.examples_per_record,
      max_records_per_shard=f.max_records_per_shard,
      overwrite=f.overwrite,
      show_progress=True,
  )
  print(summarize(manifest, time.monotonic() - start))


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top

  _define_flags()
  app.run(_main)

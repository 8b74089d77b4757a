"""python -m sparsepipe.serving.predict --export E [--delta D ...] --data DIR --output scores.npy

Scores every example of a converted dataset (in its order) with an export
(and its deltas), writes the click probabilities as a float32 .npy and
prints the dataset's metrics (AUC, log loss, NE, calibration) when it has labels.
The output is checked before anything is scored: an existing file is
replaced only with --overwrite, and never one inside a workdir, a dataset
or an export (output_paths.check_file_output).
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags

from sparsepipe import command_line
from sparsepipe.core.write_errors import written_whole
from sparsepipe.serving.output_paths import check_file_output


def _define_flags() -> None:
  flags.DEFINE_string("export", None, "A full export.", required=True)
  flags.DEFINE_multi_string(
    "delta", [], "A delta made after it; repeat the flag for each, in order."
  )
  flags.DEFINE_string("data", None, "A converted dataset (with manifest.json).", required=True)
  flags.DEFINE_string("output", None, "Where to write the scores (.npy).", required=True)
  flags.DEFINE_bool("overwrite", False, "Replace an existing file at --output.")
  flags.DEFINE_integer("batch_size", 4096, "Examples scored at once.")
  flags.DEFINE_bool("verbose", False, "On an error, print the traceback.")


def main(argv) -> int:
  command_line.start_command(argv)
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  jax.config.update("jax_platforms", "cpu")
  from sparsepipe import pipeline  # pylint: disable=g-import-not-at-top
  from sparsepipe.serving.predictor import Predictor  # pylint: disable=g-import-not-at-top
  from sparsepipe.serving.scoring import score_dataset  # pylint: disable=g-import-not-at-top

  f = flags.FLAGS
  check_file_output(f.output, overwrite=f.overwrite)
  predictor = Predictor.load(f.export, f.delta)
  scores, labels = score_dataset(predictor, f.data, batch_size=f.batch_size, show_progress=True)
  output = os.path.abspath(f.output)
  with written_whole("the scores", output, ".npy") as tmp:
    np.save(tmp, scores)
  line = f"{len(scores):,} scores: {output}"
  if labels.size:  # labels in [0, 1] (pipeline.compute_metrics)
    metrics = pipeline.compute_metrics(labels, scores)
    line += f"; {metrics.describe()}"
  print(line)
  return 0


if __name__ == "__main__":
  _define_flags()
  sys.exit(app.run(command_line.reports_errors(main), flags_parser=command_line.parse_flags))

"""Where a converter may write its dataset: never into, over or above saved work.

A converter's --output (and --eval_output) is refused, before anything is
read or written, when it lies inside saved work (a workdir, a dataset or an
export: core.saved_work), when it is a workdir, an export or a symbolic
link, and when it is a folder that holds saved work. An existing dataset
there is replaced only with --overwrite, and a folder of other files gets
the dataset beside them (data.writer). The launcher's own data (`<workdir>/data`) is written
through the writer, not these commands.
"""

from __future__ import annotations

import os

from sparsepipe.core.saved_work import refuse_holding_saved_work
from sparsepipe.core.saved_work import refuse_inside_saved_work
from sparsepipe.core.saved_work import refuse_other_saved_work
from sparsepipe.core.saved_work import refuse_symbolic_link


def check_dataset_output(output: str, flag: str = "--output") -> None:
  """Raises OutputPathError unless a converter may write a dataset at `output`."""
  given, real = os.path.abspath(output), os.path.realpath(output)
  refuse_inside_saved_work(given, real, "dataset", flag)
  refuse_symbolic_link(given, flag)
  if not refuse_other_saved_work(given, real, flag, "dataset", "a dataset"):
    refuse_holding_saved_work(given, real, flag, "a dataset goes")

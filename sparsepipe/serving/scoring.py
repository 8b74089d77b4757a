"""Scoring a whole converted dataset with a Predictor, in the dataset's order.

The dataset must have been converted as the export's training data was
(dataset_check.py): one converted from other columns or options is refused
before anything is scored, naming the differences.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from sparsepipe.data.progress import Progress
from sparsepipe.data.manifest import Manifest
from sparsepipe.data.manifest import read_manifest
from sparsepipe.serving.dataset_check import check_dataset
from sparsepipe.serving.predictor import Predictor
from sparsepipe.transforms.input.example_order import ExampleOrder
from sparsepipe.transforms.input.read_examples import ExampleReader


def _batches(manifest: Manifest, batch_size: int) -> Iterator[tuple[int, object]]:
  order = ExampleOrder(manifest, shuffle=False)
  reader = ExampleReader(manifest)
  total = order.epoch_examples
  for start in range(0, total, batch_size):
    stop = min(total, start + batch_size)
    yield total, reader.read(order.locate(start, stop)).examples


def score_dataset(
  predictor: Predictor, data_dir: str, *, batch_size: int = 4096, show_progress: bool = False
) -> tuple[np.ndarray, np.ndarray]:
  """(scores, labels) of every example of the dataset at `data_dir`, in its order.

  Raises:
    DatasetMismatchError: the dataset was converted otherwise than the
      export's training data (naming the dataset, the export and the first
      differences: features, vocabularies, hashing, dense columns).
  """
  if not isinstance(predictor, Predictor):
    raise TypeError(
      f"score_dataset takes a Predictor (serving.Predictor.load(export)), got"
      f" {type(predictor).__name__} {predictor!r}"
    )
  if batch_size < 1:
    raise ValueError(f"batch_size={batch_size} must be >= 1")
  manifest = read_manifest(data_dir)
  check_dataset(manifest, predictor.info, predictor.where)
  scores, labels, progress = [], [], None
  for total, examples in _batches(manifest, batch_size):
    if show_progress and progress is None:
      progress = Progress("predict", total)
    scores.append(predictor.predict(examples))
    labels.append(np.asarray(examples.labels, np.float32))
    if progress is not None:
      progress.update(examples.num_examples)
  if progress is not None:
    progress.close()
  if not scores:
    return np.zeros(0, np.float32), np.zeros(0, np.float32)
  return np.concatenate(scores), np.concatenate(labels)

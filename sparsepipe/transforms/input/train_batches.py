"""Grain map: a global batch index -> this host's examples of that batch.

Global batch k is examples [k*G, (k+1)*G) of the training example stream
(example_order.py), G = per_host_batch_size * process_count; host h of P
takes its contiguous block [k*G + h*B, k*G + (h+1)*B), B per host. So the
global batch sequence is the same on one host or many, with any number of
Grain workers (each worker maps the indices Grain gives it; Grain keeps
their order), and any batch can be read again from its index alone, e.g.
to rebuild the batches a checkpoint had in flight for another mesh.

With the window shuffle (example_order.py) the batches read the windows
in WINDOW_LANES lanes: global batch k is examples [t*G, (t+1)*G) of lane
k mod S, t = k // S, S = WINDOW_LANES (ExampleOrder.window_slots: the
windows of each epoch are dealt to the lanes, and over S epochs each lane
holds every window once). Grain hands worker j of N the batches j, j+N,
...: with N dividing S, every window is read by one worker alone, which
decodes it once (window_read.py); S is a constant, so the batches still
do not depend on the worker or host count.

A corrupt record skipped with skip_corrupt leaves its examples out; the
batch is then filled to B by repeating its own good examples from the
start (logged with the corrupt record, counted in the batch), so every
batch keeps its static size and later batches do not shift. A batch with
no good example at all is an error.
"""

from __future__ import annotations

from typing import NamedTuple

import grain

from sparsepipe.data.example import ExampleBatch
from sparsepipe.data.example import concat_batches
from sparsepipe.data.example import slice_batch
from sparsepipe.transforms.input.example_order import ExampleOrder
from sparsepipe.transforms.input.read_examples import ExampleReader
from sparsepipe.transforms.input.window_read import WindowReader


# Lanes of the window shuffle: with 1, 2, 4 or 8 workers each window is
# decoded once; N workers decode each N / gcd(N, 8) times. A process keeps
# at most 2 decoded windows per lane it reads.
WINDOW_LANES = 8


class ParsedBatch(NamedTuple):
  """A host batch of examples and the corrupt records skipped to get it.

  Attributes:
    examples: columnar examples, exactly the per-host batch size.
    num_corrupt_records: corrupt records skipped (0 unless skip_corrupt).
  """

  examples: ExampleBatch
  num_corrupt_records: int = 0


def _filled(examples: ExampleBatch, size: int) -> ExampleBatch:
  """`examples` repeated from the start until there are `size` of them."""
  repeats = -(-size // examples.num_examples)
  return slice_batch(concat_batches([examples] * repeats), 0, size)


class ReadTrainBatch(grain.transforms.Map):
  """Global batch index -> ParsedBatch of this host's block of that batch.

  Args:
    order: the example stream (shuffled per epoch or in file order).
    reader: reads record runs of the dataset.
    per_host_batch_size: B.
    process_index, process_count: this host h and the host count P.
  """

  def __init__(
    self,
    order: ExampleOrder,
    reader: ExampleReader,
    *,
    per_host_batch_size: int,
    process_index: int,
    process_count: int,
  ):
    self._order = order
    self._reader = reader
    self._windows = WindowReader(order, reader) if order.shuffles_examples else None
    self._b = int(per_host_batch_size)
    self._offset = int(process_index) * self._b
    self._global = self._b * int(process_count)

  def map(self, batch_index: int) -> ParsedBatch:
    if self._windows is not None:
      t, lane = divmod(int(batch_index), WINDOW_LANES)
      start = t * self._global + self._offset
      read = self._windows.read(start, start + self._b, lane, WINDOW_LANES)
    else:
      start = int(batch_index) * self._global + self._offset
      read = self._reader.read(self._order.locate(start, start + self._b))
    if read.examples is None:
      raise ValueError(
        f"batch {int(batch_index)}: all {read.num_corrupt_records} records holding this"
        " host's examples are corrupt: the data is damaged beyond skipping"
      )
    examples = read.examples
    if examples.num_examples < self._b:
      examples = _filled(examples, self._b)
    return ParsedBatch(examples, read.num_corrupt_records)

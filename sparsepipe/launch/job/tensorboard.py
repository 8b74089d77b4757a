"""Scalars for TensorBoard: event files under <workdir>/tensorboard.

A thin tensorboardX `SummaryWriter` (as MaxText uses): `scalars(step,
{"eval/auc": 0.79, ...})` writes one scalar per name at `step`. Only
process 0 writes (every process computes the same merged eval metrics);
elsewhere the writer does nothing, so the job can call it unconditionally.
Point TensorBoard at `<workdir>/tensorboard`.
"""

from __future__ import annotations

import os
from typing import Mapping

import jax

TENSORBOARD_DIR = "tensorboard"


class TensorBoardWriter:
  """Writes scalars to event files under `<workdir>/tensorboard` (process 0 only).

  Args:
    workdir: the job's workdir.
    enabled: write at all; default: this is JAX process 0.
    purge_step: a resumed job's first step: TensorBoard drops the points
      saved at this step and later (tensorboardX's purge_step), so every
      point appears once however often the job was restarted.
  """

  def __init__(self, workdir: str, *, enabled: bool | None = None, purge_step: int | None = None):
    self.logdir = os.path.join(workdir, TENSORBOARD_DIR)
    self.enabled = jax.process_index() == 0 if enabled is None else bool(enabled)
    self._writer = None
    if self.enabled:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top

      self._writer = SummaryWriter(logdir=self.logdir, purge_step=purge_step)

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    """One scalar per name at `step` (a NaN, e.g. a degenerate AUC, is kept)."""
    if self._writer is None:
      return
    for name, value in values.items():
      self._writer.add_scalar(name, float(value), global_step=int(step))

  def flush(self) -> None:
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._writer = None

  def __enter__(self) -> TensorBoardWriter:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

"""A retune's step compiled ahead (launch/job/fdo.py AheadCompiles): used when its limits
are foreseen, replaced when not; the losses are those of the job without it either way."""

import threading

import pytest

from sparsepipe import pipeline
from sparsepipe.launch import train_and_evaluate
from sparsepipe.launch.job import fdo

import launch_testing  # pylint: disable=g-bad-import-order

# Retunes after batches 2, 4 and 8 of 10; the one after batch 2 changes the limits (from the
# worst case), the later ones keep them. Headroom 1.0: limits exactly the statistics seen,
# which the later batches of this data (records of one example) stay within; of packed
# records some exceed them.
COMMON = dict(
  num_steps=10,
  fdo__first_after=2,
  fdo__headroom=1.0,
  data__num_workers=0,
  synthetic__examples_per_record=1,
  data__shuffle_window=0,
)


class _Watch:
  """The job's AheadCompiles and the compilations of a step ahead of its run."""

  def __init__(self, monkeypatch, speculation_headroom=None):
    self.made: list[fdo.AheadCompiles] = []
    self.compilations = 0
    init, compile_ahead = fdo.AheadCompiles.__init__, pipeline.Trainer.compile_ahead

    def making(compiles, *args, **kwargs):
      init(compiles, *args, **kwargs)
      if speculation_headroom is not None:  # derives other limits than the retune's
        compiles.headroom = speculation_headroom
      self.made.append(compiles)

    def compiling(trainer, *args, **kwargs):
      self.compilations += 1
      return compile_ahead(trainer, *args, **kwargs)

    monkeypatch.setattr(fdo.AheadCompiles, "__init__", making)
    monkeypatch.setattr(pipeline.Trainer, "compile_ahead", compiling)


def _compile_threads() -> list[threading.Thread]:
  threads = [t for t in threading.enumerate() if t.name.startswith("sparsepipe-compile")]
  for thread in threads:
    thread.join(timeout=10)  # a finished worker exits on its own, moments later
  return [t for t in threads if t.is_alive()]


@pytest.fixture(scope="module")
def without(tmp_path_factory):
  """The job with nothing compiled ahead: its workdir and its retunes' compilations."""
  workdir = str(tmp_path_factory.mktemp("without"))
  with pytest.MonkeyPatch.context() as monkeypatch:
    watch = _Watch(monkeypatch)
    train_and_evaluate(launch_testing.tiny_config(fdo__compile_ahead=0.0, **COMMON), workdir)
  assert [e["batch"] for e in launch_testing.events(workdir, "fdo")] == [2, 4, 8]
  (compiles,) = watch.made
  assert (compiles.used, compiles.missed) == (0, 0)
  return workdir, watch.compilations


def _train_ahead(watch, workdir, reference):
  """Trains the job with compile_ahead=1.0 in `workdir`; checks that its losses and limits
  are bitwise the `reference` job's and that no compiling thread is left; returns its
  AheadCompiles."""
  train_and_evaluate(launch_testing.tiny_config(fdo__compile_ahead=1.0, **COMMON), workdir)
  (compiles,) = watch.made
  assert launch_testing.batch_losses(workdir) == launch_testing.batch_losses(reference)
  assert launch_testing.events(workdir, "fdo") == launch_testing.events(reference, "fdo")
  assert _compile_threads() == []
  return compiles


def test_a_foreseen_retune_trains_on_the_step_compiled_ahead(without, tmp_path, monkeypatch):
  """compile_ahead=1.0 derives the limits once the segment's last batch is read: from the
  retune's own statistics, so every changed retune's step is the one compiled ahead (no
  compilation at the retune) and the losses and limits are bitwise the job's without it."""
  reference, changes = without
  watch = _Watch(monkeypatch)
  compiles = _train_ahead(watch, str(tmp_path / "ahead"), reference)
  assert changes == 1
  assert (compiles.used, compiles.missed, watch.compilations) == (1, 0, 1)


def test_a_retune_to_other_limits_than_foreseen_compiles_its_own_step(
  without, tmp_path, monkeypatch
):
  """The limits derived ahead use another headroom than the retune's, so they differ from
  the segment's at all three retunes: the three steps compiled ahead are dropped, the retune
  after batch 2 compiles its own (the later ones keep their limits), and the losses and
  limits are still bitwise the job's without compilation ahead."""
  reference, changes = without
  watch = _Watch(monkeypatch, speculation_headroom=2.0)
  compiles = _train_ahead(watch, str(tmp_path / "missed"), reference)
  assert changes == 1
  assert (compiles.used, compiles.missed, watch.compilations) == (0, 3, 4)

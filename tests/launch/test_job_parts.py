"""The launcher's small parts: metrics log, progress line, FDO scaling, flags."""

import io
import json
from types import SimpleNamespace

import numpy as np
import pytest

from sparsepipe import core
from sparsepipe import pipeline
from sparsepipe import transforms
from sparsepipe.launch import distributed
from sparsepipe.launch.job import fdo as fdo_retune
from sparsepipe.launch.job.hooks import CheckpointHook
from sparsepipe.launch.job.metrics_log import MetricsLog
from sparsepipe.launch.job.metrics_log import ProgressLine


def test_truncate_drops_later_batches_and_cut_lines(tmp_path):
  path = str(tmp_path / "metrics.jsonl")
  log = MetricsLog(path)
  for batch in range(1, 6):
    log.write({"batch": batch, "loss": 0.5})
  log.write({"event": "checkpoint", "batch": 3})
  log.write({"event": "checkpoint", "batch": 5})
  log.close()
  with open(path, "a") as f:
    f.write('{"batch": 6, "lo')  # a kill in the middle of a write
  kept = MetricsLog(path).truncate_after(3)
  with open(path) as f:
    records = [json.loads(line) for line in f]
  assert (
    records
    == kept
    == [
      {"batch": 1, "loss": 0.5},
      {"batch": 2, "loss": 0.5},
      {"batch": 3, "loss": 0.5},
      {"event": "checkpoint", "batch": 3},
    ]
  )


def _strict_json(line):
  def refuse(constant):
    raise ValueError(f"{constant} is no JSON")

  return json.loads(line, parse_constant=refuse)


def test_non_finite_values_are_written_as_null(tmp_path):
  """An eval over one example has a NaN AUC: metrics.jsonl said `NaN`, which is no
  JSON (JavaScript's JSON.parse refused the file)."""
  path = str(tmp_path / "metrics.jsonl")
  log = MetricsLog(path)
  log.write({"event": "eval", "batch": 1, "auc": float("nan"), "logloss": 0.5, "examples": 1})
  log.write({"event": "phase", "batch": 2, "seconds": float("inf"), "parts": [float("-inf")]})
  log.close()
  with open(path, "a") as f:
    f.write('{"batch": 3, "loss": NaN}\n')  # as 0.3 wrote it
  expected = [
    {"event": "eval", "batch": 1, "auc": None, "logloss": 0.5, "examples": 1},
    {"event": "phase", "batch": 2, "seconds": None, "parts": [None]},
  ]
  with open(path) as f:
    assert [_strict_json(line) for line in f.readlines()[:2]] == expected
  # A resume reads the nulls back and rewrites the file as strict JSON.
  kept = MetricsLog(path).truncate_after(3)
  with open(path) as f:
    assert [_strict_json(line) for line in f] == [*expected, {"batch": 3, "loss": None}]
  assert kept[:2] == expected and kept[2]["batch"] == 3


def test_the_eval_line_counts_one_example_as_one():
  metrics = pipeline.EvalMetrics(
    auc=float("nan"), logloss=0.25, ne=float("nan"), calibration=float("nan"), examples=1
  )
  assert metrics.describe() == (
    "AUC n/a, log loss 0.2500, NE n/a, calibration n/a (1 example, all negative: AUC and NE"
    " are undefined)"
  )
  positives = pipeline.EvalMetrics(float("nan"), 0.1, float("nan"), 0.9, 2)
  assert positives.describe() == (
    "AUC n/a, log loss 0.1000, NE n/a, calibration 0.900 (2 examples, all positive: AUC and NE"
    " are undefined)"
  )
  assert pipeline.EvalMetrics(0.75, 0.45, 0.8, 1.0, 4096).describe() == (
    "AUC 0.7500, log loss 0.4500, NE 0.8000, calibration 1.000 (4,096 examples)"
  )


def test_disabled_log_writes_nothing(tmp_path):
  log = MetricsLog(str(tmp_path / "m.jsonl"), enabled=False)
  log.write({"batch": 0})
  assert log.truncate_after(0) == []
  assert not (tmp_path / "m.jsonl").exists()


def test_progress_line_without_terminal_prints_one_line_per_update():
  stream = io.StringIO()
  line = ProgressLine(100, stream=stream)
  line.update(10, 12345.6, 0.69312, 0.25, epoch=0.1234)
  line.event("ckpt @12")
  line.update(20, 2000.0, None, 0.0)
  line.message("done")
  assert stream.getvalue().splitlines() == [
    "batch 10/100 | epoch 0.12 | 12,346 ex/s | loss 0.6931 | data wait 25%",
    "batch 20/100 | 2,000 ex/s | loss - | data wait 0% | ckpt @12",
    "done",
  ]


def _stats(max_ids, max_unique, required):
  return core.SparseDenseMatmulInputStats(
    max_ids_per_partition={"s": np.array(max_ids, np.int32)},
    max_unique_ids_per_partition={"s": np.array(max_unique, np.int32)},
    required_buffer_size_per_sc={"s": np.array(required, np.int32)},
    id_drop_counters={"s": 0},
  )


def test_scale_stats_rounds_up_and_aligns_buffers_to_8():
  scaled = fdo_retune.scale_stats(_stats([10, 3], [7, 0], [40, 17]), 1.5)
  np.testing.assert_array_equal(scaled.max_ids_per_partition["s"], [15, 5])
  np.testing.assert_array_equal(scaled.max_unique_ids_per_partition["s"], [11, 0])
  np.testing.assert_array_equal(scaled.required_buffer_size_per_sc["s"], [64, 32])


def test_round_up_to_steps_gives_8_values_per_doubling_less_than_an_eighth_above():
  values = [1, 8, 9, 16, 17, 19, 31, 33, 450, 458, 471, 480, 481, 512, 513, 1680, 1793]
  rounded = [core.round_up_to_steps(v, 8) for v in values]
  assert rounded == [1, 8, 9, 16, 18, 20, 32, 36, 480, 480, 480, 480, 512, 512, 576, 1792, 1920]
  assert all(v <= r < v * 9 / 8 for v, r in zip(values, rounded))
  assert [core.round_up_to_steps(v, 0) for v in values] == values
  ladder = sorted({core.round_up_to_steps(v, 8) for v in range(257, 1025)})
  assert ladder == [288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 832, 896, 960, 1024]


def test_round_up_refuses_a_multiple_below_one():
  """Before: round_up(5, -2) was 4, below the value, and round_up(5, 0) ZeroDivisionError."""
  assert [core.round_up(v, 8) for v in (0, 1, 8, 9)] == [0, 8, 8, 16]
  for multiple in (0, -2):
    with pytest.raises(ValueError) as refused:
      core.round_up(5, multiple)
    assert str(refused.value) == f"round_up: multiple={multiple} must be at least 1"


def test_scale_stats_rounds_to_steps_per_doubling_then_aligns_buffers_to_8():
  # x 1.5: max_ids 300, 306 and 314 -> 450, 459, 471: one limit, 480, with 8 steps.
  scaled = fdo_retune.scale_stats(_stats([300, 306, 314], [7, 0, 9], [40, 17, 1117]), 1.5, 8)
  np.testing.assert_array_equal(scaled.max_ids_per_partition["s"], [480, 480, 480])
  np.testing.assert_array_equal(scaled.max_unique_ids_per_partition["s"], [11, 0, 14])
  np.testing.assert_array_equal(scaled.required_buffer_size_per_sc["s"], [64, 32, 1792])
  with pytest.raises(ValueError, match=r"fdo.steps_per_doubling=-1 must be >= 0"):
    fdo_retune.scale_stats(_stats([1], [1], [8]), 1.5, -1)


def test_fdo_headroom_stops_at_what_a_batch_can_fill(tmp_path):
  # 1 device x 2 SCs (N = 2); stack "s": one feature of 4 ids, batch 16: a
  # SC's 8 samples hold 32 ids, + 7 x 2 padding = 46 -> 48 per SC, 96 per device.
  table = core.TableSpec(
    name="s", vocabulary_size=100, embedding_dim=8, combiner="sum",
    max_ids_per_partition=32, max_unique_ids_per_partition=32,
  )  # fmt: skip
  specs = transforms.prepare_feature_specs_for_training(
    {"f": core.FeatureSpec("f", table, (16, 4), (16, 8))}, 1, 2
  )
  retune = dict(stats_dir=str(tmp_path / "a"), num_sc_per_device=2, global_device_count=1)
  # Needed 40 and 24 per SC: x 1.5 -> 64 per SC (128 per device), past the 96 a batch fills.
  tuned, _ = fdo_retune.retune_limits(specs, _stats([20], [20], [40, 24]), headroom=1.5, **retune)
  assert transforms.get_stack_limits(tuned)["s"] == {
    "max_ids_per_partition": 30,
    "max_unique_ids_per_partition": 30,
    "suggested_coo_buffer_size_per_device": 96,
  }
  retune["stats_dir"] = str(tmp_path / "b")
  tuned, _ = fdo_retune.retune_limits(specs, _stats([20], [20], [24, 16]), headroom=1.5, **retune)
  assert transforms.get_stack_limits(tuned)["s"]["suggested_coo_buffer_size_per_device"] == 80


def test_headroom_below_one_is_refused():
  with pytest.raises(ValueError, match=r"fdo.headroom=0.9 must be >= 1.0"):
    fdo_retune.scale_stats(_stats([1], [1], [8]), 0.9)


@pytest.mark.parametrize(
  "args, message",
  [
    (
      ("127.0.0.1:1", None, 0),
      r"multi-host needs all of --coordinator_address, --num_processes and --process_id",
    ),
    (("127.0.0.1:1", 2, 2), r"--process_id=2 outside 0..1"),
  ],
)
def test_incomplete_multihost_flags_are_refused(args, message):
  with pytest.raises(ValueError, match=message):
    distributed.initialize(*args)


def test_no_multihost_flags_means_one_process():
  assert distributed.initialize(None, None, None) is False


def test_the_progress_line_names_a_checkpoint_once_it_is_written():
  """A kill while an asynchronous save was written showed 'ckpt @15' on the line, and
  the rerun resumed after batch 10: the line now says 'saving' until it is written."""
  marks, writing = [], [True]
  job = SimpleNamespace(
    config=SimpleNamespace(checkpoint=SimpleNamespace(every_steps=5)),
    resumed_from=10,
    hooks={
      "losses": SimpleNamespace(flush=lambda: None),
      "progress": SimpleNamespace(disturbed=lambda: None),
    },
    checkpoints=SimpleNamespace(
      save=lambda *args, **kwargs: True,
      mngr=SimpleNamespace(saving_in_progress=lambda: writing[0]),
    ),
    output=SimpleNamespace(event=lambda *args: None, mark=marks.append, flush=lambda: None),
    position=SimpleNamespace(at_boundary=True),
    preempted=False,
    batch=15,
    setup=None,
    train_state=None,
    pipeline_state=None,
    job_id="j",
  )
  hook = CheckpointHook(job)
  assert hook(None) is False
  assert marks == ["ckpt @15 saving"]
  job.batch, job.position.at_boundary = 16, False
  hook(None)
  assert marks == ["ckpt @15 saving"]  # still being written
  writing[0] = False
  hook(None)
  assert marks == ["ckpt @15 saving", "ckpt @15"]
  hook(None)
  assert marks == ["ckpt @15 saving", "ckpt @15"]

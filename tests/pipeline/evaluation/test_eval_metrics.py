"""Eval metrics against direct formulas: pairwise AUC, log loss, NE, calibration."""

import math

import numpy as np
import pytest

from sparsepipe import pipeline as evaluation


def pairwise_auc(labels, scores):
  """O(n^2): wins of positives over negatives, ties count half."""
  pos = [s for y, s in zip(labels, scores) if y == 1]
  neg = [s for y, s in zip(labels, scores) if y == 0]
  wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
  return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(5))
def test_auc_equals_pairwise_count_with_ties(seed):
  rng = np.random.default_rng(seed)
  n = 60
  labels = rng.integers(0, 2, n).astype(np.float32)
  scores = rng.integers(0, 7, n) / 7.0  # few distinct values: many ties
  assert evaluation.auc(labels, scores) == pytest.approx(pairwise_auc(labels, scores), abs=1e-15)


def test_fractional_labels_count_as_parts_of_a_positive_and_a_negative():
  """A label of 0.5 is half a positive and half a negative: the AUC of every example
  split into two halves (a 0.5 into a positive and a negative, tied with each other;
  a 0 or 1 into two of its kind); log loss, NE and calibration by their formulas."""
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 3, 40) / 2.0  # 0, 0.5, 1
  scores = rng.integers(1, 9, 40) / 10.0  # ties
  split_labels = np.concatenate([np.ceil(labels), np.floor(labels)])
  split_scores = np.concatenate([scores, scores])
  got = evaluation.compute_metrics(labels, scores)
  assert got.auc == pytest.approx(pairwise_auc(split_labels, split_scores), abs=1e-15)
  direct = -np.mean(labels * np.log(scores) + (1 - labels) * np.log(1 - scores))
  assert got.logloss == pytest.approx(direct, rel=1e-12)
  rate = labels.mean()
  entropy = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
  assert got.ne == pytest.approx(direct / entropy, rel=1e-12)
  assert got.calibration == pytest.approx(scores.sum() / labels.sum(), rel=1e-12)
  assert evaluation.auc([0.5, 0.5], [0.2, 0.7]) == 0.5  # each beats and loses to the other half


def test_auc_known_values():
  assert evaluation.auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75
  assert evaluation.auc([0, 1], [0.5, 0.5]) == 0.5
  assert evaluation.auc([1, 1, 0], [0.9, 0.8, 0.1]) == 1.0
  assert evaluation.auc([1, 0], [0.1, 0.9]) == 0.0


def test_log_loss_and_ne_match_direct_formulas():
  labels = np.array([1, 0, 1, 1, 0], np.float32)
  scores = np.array([0.9, 0.2, 0.6, 0.3, 0.5], np.float32)
  direct = -np.mean(
    [math.log(float(p)) if y else math.log(1 - float(p)) for y, p in zip(labels, scores)]
  )
  assert evaluation.log_loss(labels, scores) == pytest.approx(direct, rel=1e-12)
  rate = 3 / 5
  entropy = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
  assert evaluation.normalized_entropy(labels, scores) == pytest.approx(direct / entropy, rel=1e-12)
  assert evaluation.calibration(labels, scores) == pytest.approx(np.sum(scores) / 3, rel=1e-7)


def test_log_loss_clips_saturated_probabilities():
  eps = evaluation.LOGLOSS_EPS
  got = evaluation.log_loss([1, 0], [0.0, 1.0])
  assert got == pytest.approx(-math.log(eps), rel=1e-9)


def test_base_rate_prediction_has_ne_one():
  labels = np.array([1, 0, 0, 0], np.float32)
  assert evaluation.normalized_entropy(labels, np.full(4, 0.25)) == pytest.approx(1.0, rel=1e-12)


def test_single_label_sets_give_nan_not_errors():
  m = evaluation.compute_metrics([0, 0, 0], [0.1, 0.2, 0.3])
  assert math.isnan(m.auc) and math.isnan(m.ne) and math.isnan(m.calibration)
  assert m.examples == 3
  assert m.logloss == pytest.approx(-np.mean(np.log([0.9, 0.8, 0.7])), rel=1e-12)
  m = evaluation.compute_metrics([1, 1], [0.5, 0.25])
  assert math.isnan(m.auc) and math.isnan(m.ne)
  assert m.calibration == 0.375


def test_bad_input_is_a_clear_error():
  with pytest.raises(ValueError, match=r"^no examples to evaluate$"):
    evaluation.compute_metrics([], [])
  with pytest.raises(ValueError, match=r"^labels must lie in \[0, 1\]: example 1 has label 1.5$"):
    evaluation.auc([1, 1.5], [0.2, 0.3])
  with pytest.raises(ValueError, match=r"^labels must lie in \[0, 1\]: example 0 has label nan$"):
    evaluation.auc([np.nan, 1], [0.2, 0.3])
  with pytest.raises(ValueError, match=r"^3 labels but 2 scores$"):
    evaluation.auc([1, 0, 1], [0.2, 0.3])
  with pytest.raises(ValueError, match=r"^score of example 0 is nan, not finite$"):
    evaluation.log_loss([1], [np.nan])


def test_merge_keeps_valid_examples_of_one_process():
  labels, scores = evaluation.gather_examples_across_processes(
    [1, 0, 0, 1], [0.5, 0.25, 0.0, 0.75], [1, 1, 0, 1]
  )
  np.testing.assert_array_equal(labels, [1, 0, 1])
  np.testing.assert_array_equal(scores, [0.5, 0.25, 0.75])


def test_metrics_as_dict():
  m = evaluation.EvalMetrics(auc=0.5, logloss=0.7, ne=1.0, calibration=1.1, examples=3)
  assert m.as_dict("eval/") == {
    "eval/auc": 0.5,
    "eval/logloss": 0.7,
    "eval/ne": 1.0,
    "eval/calibration": 1.1,
    "eval/examples": 3,
  }

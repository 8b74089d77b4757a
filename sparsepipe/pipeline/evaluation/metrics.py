"""Metrics of a whole eval set, computed once from every example's score.

AUC is exact (the Mann-Whitney statistic, tied scores counted half), not a
bucketed estimate, so it needs all scores in one place:
`gather_examples_across_processes` gathers the valid examples of every process and
every process then computes the same numbers. Nothing is averaged per host
or per batch.

Conventions:
  - labels lie in [0, 1], as the converters and the train step take them; a
    fractional label y counts as y of a positive and 1 - y of a negative
    (AUC weighs each pair by them, as TorchRec's AUC does); scores are
    predicted probabilities of label 1.
  - log loss clips probabilities to [LOGLOSS_EPS, 1 - LOGLOSS_EPS]: a
    float32 sigmoid rounds to exactly 0 or 1 for |logit| > ~17, and an
    unclipped log(0) would make one confident mistake infinite.
  - degenerate sets (all labels equal) give AUC, NE and (with no positives)
    calibration NaN rather than an error: a rare-event eval set in a long
    job should log a NaN, not kill the job. An empty set is an error.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from jax.experimental import multihost_utils
import numpy as np

# Probabilities are clipped to [eps, 1 - eps] in log loss (see above).
LOGLOSS_EPS = 1e-7


@dataclasses.dataclass(frozen=True)
class EvalMetrics:
  """Metrics over a whole eval set.

  Attributes:
    auc: ROC AUC, ties counted half (NaN without a positive or a negative part).
    logloss: mean binary cross-entropy of the clipped scores.
    ne: normalized entropy, logloss / entropy of the base rate (NaN if the
      base rate is 0 or 1).
    calibration: mean score / mean label (NaN with no positive label).
    examples: examples evaluated.
  """

  auc: float
  logloss: float
  ne: float
  calibration: float
  examples: int

  def as_dict(self, prefix: str = "") -> dict[str, float]:
    """{prefix + name: value}, e.g. for TensorBoard scalars or JSON lines."""
    return {f"{prefix}{k}": v for k, v in dataclasses.asdict(self).items()}

  def describe(self) -> str:
    """'AUC 0.7512, log loss 0.4510, NE 0.8123, calibration 1.012 (4,096 examples)';
    a set whose labels are all of one class says so (AUC and NE need both)."""
    count = f"{self.examples:,} example{'' if self.examples == 1 else 's'}"
    if math.isnan(self.auc) and self.examples:
      kind = "negative" if math.isnan(self.calibration) else "positive"
      count += f", all {kind}: AUC and NE are undefined"
    return (
      f"AUC {format_metric(self.auc)}, log loss {format_metric(self.logloss)},"
      f" NE {format_metric(self.ne)}, calibration {format_metric(self.calibration, '.3f')}"
      f" ({count})"
    )


def format_metric(value: float, spec: str = ".4f") -> str:
  """`value` formatted by `spec`, or "n/a" where it is undefined (NaN, infinite)."""
  return format(value, spec) if math.isfinite(value) else "n/a"


def _check(labels: Any, scores: Any) -> tuple[np.ndarray, np.ndarray]:
  labels = np.asarray(labels, np.float64).reshape(-1)
  scores = np.asarray(scores, np.float64).reshape(-1)
  if labels.shape != scores.shape:
    raise ValueError(f"{labels.size} labels but {scores.size} scores")
  if labels.size == 0:
    raise ValueError("no examples to evaluate")
  bad = ~((labels >= 0) & (labels <= 1))  # NaN too
  if bad.any():
    i = int(np.argmax(bad))
    raise ValueError(f"labels must lie in [0, 1]: example {i} has label {labels[i]}")
  if not np.isfinite(scores).all():
    i = int(np.argmax(~np.isfinite(scores)))
    raise ValueError(f"score of example {i} is {scores[i]}, not finite")
  return labels, scores


def auc(labels: Any, scores: Any) -> float:
  """Exact ROC AUC: P(score of a positive > score of a negative) + P(tie) / 2,
  each example y of a positive and 1 - y of a negative.

  Computed per group of tied scores in O(n log n): each group's positive part
  beats the negative part of the groups below it and ties half its own. With
  0/1 labels every sum is a count, exact in float64 (below 2**53).
  """
  labels, scores = _check(labels, scores)
  positives = float(labels.sum())
  negatives = float(labels.size - positives)
  if positives == 0 or negatives == 0:
    return float("nan")
  order = np.argsort(scores, kind="stable")
  sorted_scores, sorted_labels = scores[order], labels[order]
  starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
  group_positives = np.add.reduceat(sorted_labels, starts)
  group_negatives = np.add.reduceat(1.0 - sorted_labels, starts)
  negatives_below = np.cumsum(group_negatives) - group_negatives
  wins_x2 = np.sum(group_positives * (2.0 * negatives_below + group_negatives))
  return float(wins_x2 / (2.0 * positives * negatives))


def log_loss(labels: Any, scores: Any, eps: float = LOGLOSS_EPS) -> float:
  """Mean of -[y log p + (1 - y) log(1 - p)], p clipped to [eps, 1 - eps]."""
  labels, scores = _check(labels, scores)
  p = np.clip(scores, eps, 1.0 - eps)
  return float(-np.mean(labels * np.log(p) + (1.0 - labels) * np.log1p(-p)))


def normalized_entropy(labels: Any, scores: Any, eps: float = LOGLOSS_EPS) -> float:
  """Log loss over the entropy of the base rate (NaN if all labels are equal).

  Below 1 means the model beats always predicting the eval set's base rate.
  """
  labels, scores = _check(labels, scores)
  rate = float(labels.mean())
  if rate in (0.0, 1.0):
    return float("nan")
  entropy = -(rate * np.log(rate) + (1.0 - rate) * np.log1p(-rate))
  return log_loss(labels, scores, eps) / entropy


def calibration(labels: Any, scores: Any) -> float:
  """Mean score over mean label: 1 is calibrated (NaN with no positive label)."""
  labels, scores = _check(labels, scores)
  positives = float(labels.sum())
  if positives == 0.0:
    return float("nan")
  return float(scores.sum() / positives)


def compute_metrics(labels: Any, scores: Any, eps: float = LOGLOSS_EPS) -> EvalMetrics:
  """All metrics of one complete set of (label, score) pairs."""
  labels, scores = _check(labels, scores)
  return EvalMetrics(
    auc=auc(labels, scores),
    logloss=log_loss(labels, scores, eps),
    ne=normalized_entropy(labels, scores, eps),
    calibration=calibration(labels, scores),
    examples=int(labels.size),
  )


def gather_examples_across_processes(
  labels: Any, scores: Any, mask: Any
) -> tuple[np.ndarray, np.ndarray]:
  """Labels and scores of the valid examples of every process, process order.

  Every process passes arrays of the same length (the eval input gives each
  host the same number of static-size batches) with mask 1 for its real
  examples; the arrays are gathered (`process_allgather`, also fine with one
  process) and the padding dropped. Every process gets the same result.
  Scores travel as float32 (what the eval step computes).
  """
  local = np.stack(
    [
      np.asarray(labels, np.float32).reshape(-1),
      np.asarray(scores, np.float32).reshape(-1),
      np.asarray(mask, np.float32).reshape(-1),
    ]
  )
  gathered = np.asarray(multihost_utils.process_allgather(local))  # [P, 3, n]
  gathered = gathered.reshape(-1, 3, local.shape[1]).transpose(1, 0, 2).reshape(3, -1)
  valid = gathered[2] > 0
  return gathered[0][valid], gathered[1][valid]

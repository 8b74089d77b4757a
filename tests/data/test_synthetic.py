"""Synthetic data: the planted click model, stream determinism, the eval split, the command."""

import paths
import collections
import hashlib
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from sparsepipe.data import ExampleBatch
from sparsepipe.data import RaggedBatch
from sparsepipe.data import SyntheticFeature
from sparsepipe.data import concat_batches
from sparsepipe.data import criteo_like_features
from sparsepipe.data import decode_batch
from sparsepipe.data import generate_batches
from sparsepipe.data import manifest_source
from sparsepipe.data import read_manifest
from sparsepipe.data import slice_batch
from sparsepipe.data import synthetic_click_probabilities
from sparsepipe.data import write_synthetic
from sparsepipe.data.synthetic import generate as synthetic_gen
from sparsepipe.data.synthetic import click_model as synthetic_model

FEATURES = (
  SyntheticFeature("u", 50, 1, 3),
  SyntheticFeature("v", 7, 0, 4, weighted=True, zipf_exponent=1.0),
)


def _all_examples(manifest):
  source = manifest_source(manifest)
  return concat_batches([decode_batch(source[i], manifest.schema) for i in range(len(source))])


def _assert_same(x, y):
  np.testing.assert_array_equal(x.labels, y.labels)
  np.testing.assert_array_equal(x.dense, y.dense)
  for name in x.sparse:
    for a, b in zip(x.sparse[name], y.sparse[name]):
      np.testing.assert_array_equal(a, b)


def _stream(n, seed, split="train", features=FEATURES, num_dense=2):
  return concat_batches(list(generate_batches(features, num_dense, n, seed, split=split)))


def _auc(p, y):
  ranks = np.empty(len(p))
  ranks[np.argsort(p, kind="stable")] = np.arange(1, len(p) + 1)
  pos = y > 0.5
  n1, n0 = pos.sum(), (~pos).sum()
  return (ranks[pos].sum() - n1 * (n1 + 1) / 2) / (n1 * n0)


def _fmix32(x):
  x ^= x >> 16
  x = (x * 0x85EBCA6B) & 0xFFFFFFFF
  x ^= x >> 13
  x = (x * 0xC2B2AE35) & 0xFFFFFFFF
  return x ^ (x >> 16)


def _reference_probability(seed, dense_row, ids_by_feature):
  """The module doc's formula, one example, in plain Python."""

  def weight(key, what):
    salt = (
      int.from_bytes(hashlib.blake2b(f"{seed}/{what}".encode(), digest_size=8).digest(), "little")
      & 0xFFFFFFFF
    )
    u = _fmix32((key & 0xFFFFFFFF) ^ salt) / 2.0**32
    return (2.0 * u - 1.0) * math.sqrt(3.0)

  s = 0.0
  for name, (ids, gains) in ids_by_feature.items():
    if ids:
      total = sum(g * weight(i, f"sparse/{name}") for i, g in zip(ids, gains))
      s += total / math.sqrt(sum(g * g for g in gains))
  s /= math.sqrt(len(ids_by_feature))
  d = sum(weight(j, "dense") * (x - 2.0147) / 0.9115 for j, x in enumerate(dense_row))
  d /= math.sqrt(len(dense_row))
  logit = -1.3 + 1.15 * (0.8 * s + 0.6 * d)
  return 1.0 / (1.0 + math.exp(-logit))


def test_probabilities_follow_the_documented_formula():
  batch = ExampleBatch(
    np.zeros(3, np.float32),
    np.array([[0.5, 3.0], [2.0, 0.0], [1.0, 1.0]], np.float32),
    {
      "u": RaggedBatch(np.array([4, 9, 4, 7], np.int32), np.array([2, 0, 2], np.int32)),
      "v": RaggedBatch(
        np.array([1, 2, 3], np.int32),
        np.array([1, 1, 1], np.int32),
        np.array([0.5, 1.25, 1.0], np.float32),
      ),
    },
  )
  got = synthetic_click_probabilities(batch, seed=11)
  expected = [
    _reference_probability(11, [0.5, 3.0], {"u": ([4, 9], [1, 1]), "v": ([1], [0.5])}),
    _reference_probability(11, [2.0, 0.0], {"u": ([], []), "v": ([2], [1.25])}),
    _reference_probability(11, [1.0, 1.0], {"u": ([4, 7], [1, 1]), "v": ([3], [1.0])}),
  ]
  np.testing.assert_allclose(got, expected, rtol=1e-12)
  assert synthetic_model.fmix32(np.array([0, 1], np.uint32)).tolist() == [0, 0x514E28B7]


def test_labels_are_draws_of_the_probabilities_with_a_learnable_auc():
  features = criteo_like_features(26, 1000, max_ids=4)
  batches = list(generate_batches(features, 13, 100_000, seed=3))
  p = np.concatenate([synthetic_click_probabilities(b, 3) for b in batches])
  y = np.concatenate([b.labels for b in batches])
  # 4 standard errors of a mean of 100k Bernoulli draws is ~0.005.
  assert abs(y.mean() - p.mean()) < 0.005, (y.mean(), p.mean())
  assert 0.15 < p.mean() < 0.3
  assert 0.75 < _auc(p, y) < 0.81
  # Calibrated: in each probability decile the click rate matches the mean probability.
  edges = np.quantile(p, np.linspace(0, 1, 11))
  bins = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, 9)
  for k in range(10):
    assert abs(y[bins == k].mean() - p[bins == k].mean()) < 0.02, k
  # Another seed plants another model.
  first = slice_batch(batches[0], 0, 100)
  assert not np.allclose(p[:100], synthetic_click_probabilities(first, 4))


def test_probabilities_do_not_depend_on_batching_and_survive_the_disk(tmp_path):
  m = write_synthetic(
    str(tmp_path / "a"), FEATURES, num_examples=5000, num_dense=2, seed=7, examples_per_record=3
  )
  stored = _all_examples(m)
  whole = synthetic_click_probabilities(stored, m.info["seed"])
  parts = [synthetic_click_probabilities(b, 7) for b in generate_batches(FEATURES, 2, 5000, 7)]
  np.testing.assert_array_equal(whole, np.concatenate(parts))
  np.testing.assert_array_equal(
    synthetic_click_probabilities(slice_batch(stored, 1234, 1300), 7), whole[1234:1300]
  )


def test_streams_are_deterministic_and_extend():
  short, long = _stream(5000, seed=1), _stream(9000, seed=1)
  _assert_same(short, slice_batch(long, 0, 5000))
  _assert_same(short, _stream(5000, seed=1))
  assert not np.array_equal(short.sparse["u"].values, _stream(5000, seed=2).sparse["u"].values)
  with pytest.raises(ValueError, match=r"split 'test' must be one of \('train', 'eval'\)"):
    next(generate_batches(FEATURES, 2, 10, 0, split="test"))


def _rows(batch):
  """Each example as bytes, to compare sets of examples."""
  out = []
  for i in range(batch.num_examples):
    ex = slice_batch(batch, i, i + 1)
    out.append(ex.dense.tobytes() + b"".join(r.values.tobytes() + b"|" for r in ex.sparse.values()))
  return out


def test_eval_split_is_disjoint_deterministic_and_from_its_own_stream(tmp_path):
  train = write_synthetic(
    str(tmp_path / "t"),
    FEATURES,
    num_examples=400,
    num_dense=2,
    seed=5,
    eval_output=str(tmp_path / "e"),
    eval_fraction=0.25,
  )
  evals = read_manifest(str(tmp_path / "e"))
  assert (train.num_examples, evals.num_examples) == (300, 100)
  assert (train.info["split"], evals.info["split"]) == ("train", "eval")
  assert evals.info["seed"] == 5 and evals.info["click_model_version"] == 1
  assert evals.schema == train.schema
  _assert_same(_all_examples(train), _stream(300, 5))
  _assert_same(_all_examples(evals), _stream(100, 5, split="eval"))
  assert not set(_rows(_all_examples(train))) & set(_rows(_all_examples(evals)))
  again = write_synthetic(
    str(tmp_path / "t2"),
    FEATURES,
    num_examples=50,
    num_dense=2,
    seed=5,
    eval_output=str(tmp_path / "e2"),
    eval_examples=100,
  )
  assert again.num_examples == 50
  _assert_same(_all_examples(read_manifest(str(tmp_path / "e2"))), _all_examples(evals))


@pytest.mark.parametrize(
  "kwargs,message",
  [
    ({"eval_fraction": 0.1}, r"eval_fraction/eval_examples need eval_output"),
    ({"eval_output": "E"}, r"eval_output needs exactly one of eval_fraction and eval_examples"),
    (
      {"eval_output": "E", "eval_fraction": 0.1, "eval_examples": 3},
      r"eval_output needs exactly one of eval_fraction and eval_examples",
    ),
    ({"eval_output": "E", "eval_fraction": 1.0}, r"eval_fraction=1.0 must be in \(0, 1\)"),
    ({"eval_output": "E", "eval_examples": 0}, r"eval_examples=0 must be >= 1"),
    ({"eval_output": "T", "eval_examples": 1}, r"^the eval output 'T' is the train output 'T'$"),
    (
      {"eval_output": "T/E", "eval_examples": 1},
      r"^the eval output 'T/E' is inside the train output 'T': give two folders, neither inside"
      r" the other$",
    ),
  ],
)
def test_eval_split_arguments_are_checked(tmp_path, kwargs, message):
  kwargs = {k: str(tmp_path / v) if k == "eval_output" else v for k, v in kwargs.items()}
  message = message.replace("'T", f"'{tmp_path / 'T'}")
  with pytest.raises(ValueError, match=message):
    write_synthetic(str(tmp_path / "T"), FEATURES, num_examples=10, **kwargs)


def test_scramble_table_equals_the_modular_bijection():
  vocab = 1000
  ranks = np.arange(vocab, dtype=np.int64)
  table = synthetic_gen.scramble(ranks, vocab)
  m = synthetic_gen._scramble_multiplier(vocab)  # pylint: disable=protected-access
  np.testing.assert_array_equal(table, (ranks * m) % vocab)
  assert table.dtype == np.int32 and len(np.unique(table)) == vocab
  big = (1 << 22) + 1
  direct = synthetic_gen.scramble(np.array([0, 1, big - 1]), big)
  m = synthetic_gen._scramble_multiplier(big)  # pylint: disable=protected-access
  assert direct.tolist() == [0, m, (big - 1) * m % big]


def test_scramble_tables_are_cached_by_bytes(monkeypatch):
  monkeypatch.setattr(synthetic_gen, "_TABLE_CACHE_BYTES", 12_000)
  monkeypatch.setattr(synthetic_gen, "_TABLES", collections.OrderedDict())
  for vocab in (1000, 1500, 999, 1000):
    ranks = np.arange(vocab, dtype=np.int64)
    m = synthetic_gen._scramble_multiplier(vocab)  # pylint: disable=protected-access
    np.testing.assert_array_equal(synthetic_gen.scramble(ranks, vocab), ranks * m % vocab)
  # int32 tables of 4000, 6000, 3996 bytes: over 12000 the least recently used go first.
  assert list(synthetic_gen._TABLES) == [999, 1000]  # pylint: disable=protected-access


def test_command_writes_the_eval_split(tmp_path):
  root = paths.REPO_ROOT
  env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
  args = [
    "--output",
    str(tmp_path / "t"),
    "--num_examples",
    "200",
    "--num_sparse",
    "2",
    "--vocab_sizes",
    "10",
    "--num_dense",
    "2",
    "--seed",
    "9",
    "--eval_output",
    str(tmp_path / "e"),
    "--eval_fraction",
    "0.1",
  ]
  out = subprocess.run(
    [sys.executable, "-m", "sparsepipe.data.synthetic", *args],
    capture_output=True,
    text=True,
    env=env,
    check=False,
    timeout=120,
  )
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  assert lines[0].startswith("wrote 180 examples")
  assert lines[1].startswith("wrote 20 examples") and lines[1].endswith(str(tmp_path / "e"))
  assert len(lines) == 2
  features = criteo_like_features(2, 10)
  _assert_same(
    _all_examples(read_manifest(str(tmp_path / "e"))),
    _stream(20, 9, split="eval", features=features),
  )


def test_a_stop_while_generating_the_eval_split_leaves_both_old_splits(tmp_path, monkeypatch):
  """--overwrite of a pair: the train split used to be moved into place before the
  eval split was generated, so a stop (Ctrl-C) meanwhile left a new train split
  beside the old eval split."""
  args = dict(eval_output=str(tmp_path / "e"), eval_examples=40, overwrite=True)
  old = {
    part: _all_examples(m)
    for part, m in zip(
      ("t", "e"),
      (
        write_synthetic(str(tmp_path / "t"), FEATURES, num_examples=100, **args),
        read_manifest(str(tmp_path / "e")),
      ),
    )
  }
  generate = synthetic_gen.generate_batches

  def stopped_in_the_eval_split(*a, split, **kw):
    for batch in generate(*a, split=split, **kw):
      if split == "eval":
        raise KeyboardInterrupt
      yield batch

  monkeypatch.setattr(synthetic_gen, "generate_batches", stopped_in_the_eval_split)
  with pytest.raises(KeyboardInterrupt):
    write_synthetic(str(tmp_path / "t"), FEATURES, num_examples=100, seed=1, **args)
  assert sorted(os.listdir(tmp_path)) == ["e", "t"]
  for part, examples in old.items():
    _assert_same(_all_examples(read_manifest(str(tmp_path / part))), examples)

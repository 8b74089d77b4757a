"""export.json is covered by its own sha256, and unknown combiners are refused wherever read.

Exports here are written by write_export from small arrays (no training):
the digest and the combiner checks read only export.json.
"""

import dataclasses
import json
import logging
import os

import numpy as np
import pytest

from sparsepipe import core
from sparsepipe import serving
from sparsepipe.checkpointing.integrity.digests import digest
from sparsepipe.data import ExampleBatch
from sparsepipe.data import RaggedBatch
from sparsepipe.launch import train_and_evaluate
from sparsepipe.launch.config import config_specs
from sparsepipe.transforms.coo.gains import id_gains

import launch_testing  # pylint: disable=g-bad-import-order

ALLOWED = "is not one of sum, mean, sqrtn"


def _info(combiner="mean"):
  return serving.ExportInfo(
    kind="full",
    export_id="e1",
    job_id="j1",
    checkpoint_step=4,
    batches_trained=4,
    updates_applied=4,
    since=None,
    model={"name": "dlrm", "factory": "", "config": {"lr": 0.01}},
    dense_dim=1,
    features=(
      {
        "name": "user",
        "table": "user",
        "vocab_size": 4,
        "dim": 2,
        "combiner": combiner,
        "weighted": False,
        "max_ids": 1,
      },
    ),
    tables={"user": {"vocab_size": 4, "dim": 2, "rows": 4}},
    converter={"info": {"converter": "sparsepipe.data.csv"}, "schema": {}},
    params={"count": 1, "paths": ["['w']"]},
    platforms=("cpu",),
  )


def _write(path, info=None):
  serving.write_export(
    str(path),
    info or _info(),
    params=[np.ones(3, np.float32)],
    tables={"user": np.arange(8, dtype=np.float32).reshape(4, 2)},
    ids=None,
    predict=b"not read here",
  )
  return str(path)


def _as_written_by_0_3(export):
  """Rewrites export.json as sparsepipe 0.3 wrote it: format_version 1, no digest of itself."""
  path = os.path.join(export, "export.json")
  with open(path) as f:
    data = json.load(f)
  del data["sha256"]
  data["format_version"] = 1
  with open(path, "w") as f:
    json.dump(data, f, indent=1, sort_keys=True)
  return data


def _replace_in_info(export, old, new):
  path = os.path.join(export, "export.json")
  with open(path, "rb") as f:
    raw = f.read()
  assert raw.count(old) == 1
  with open(path, "wb") as f:
    f.write(raw.replace(old, new))


def test_export_json_carries_the_sha256_of_its_canonical_json(tmp_path):
  export = _write(tmp_path / "e")
  with open(os.path.join(export, "export.json")) as f:
    data = json.load(f)
  assert data["format_version"] == 2
  body = {k: v for k, v in data.items() if k != "sha256"}
  assert data["sha256"] == digest(body)
  assert serving.read_info(export) == dataclasses.replace(_info(), files=data["files"])


def test_one_changed_byte_in_a_combiner_name_is_caught(tmp_path):
  export = _write(tmp_path / "e")
  _replace_in_info(export, b'"combiner": "mean"', b'"combiner": "meal"')
  with pytest.raises(
    serving.ExportError,
    match=rf"^export '{export}': file 'export.json' does not match its sha256"
    r" \(damaged or altered\)$",
  ):
    serving.read_info(export)


def test_every_single_byte_change_of_export_json_is_caught_or_changes_nothing(tmp_path):
  export = _write(tmp_path / "e")
  path = os.path.join(export, "export.json")
  with open(path, "rb") as f:
    raw = f.read()
  want = json.loads(raw)
  missed = []
  for i in range(len(raw)):
    changed = bytearray(raw)
    changed[i] ^= 0x01
    with open(path, "wb") as f:
      f.write(changed)
    try:
      serving.read_info(export)
    except serving.ExportError:
      continue
    if json.loads(changed) != want:  # whitespace flips parse to the same content
      missed.append((i, bytes(changed[max(0, i - 20) : i + 20])))
  assert not missed


def test_a_removed_digest_or_a_lowered_version_is_caught(tmp_path):
  export = _write(tmp_path / "e")
  _replace_in_info(export, b'"format_version": 2', b'"format_version": 1')
  with pytest.raises(serving.ExportError, match=r"file 'export.json' does not match its sha256"):
    serving.read_info(export)
  export = _write(tmp_path / "f")
  _replace_in_info(export, b'"sha256": "', b'"sha257": "')
  with pytest.raises(
    serving.ExportError,
    match=rf"^export '{export}': file 'export.json' carries no sha256 \(damaged or altered\)$",
  ):
    serving.read_info(export)


def test_an_export_of_sparsepipe_0_3_reads_with_a_warning(tmp_path, caplog):
  export = _write(tmp_path / "e")
  written = _as_written_by_0_3(export)
  with caplog.at_level(logging.WARNING):
    info = serving.read_info(export)
  assert info.files == written["files"] and info.features == _info().features
  assert (
    f"export '{export}' was written by sparsepipe 0.3 (export format_version 1): its export.json"
    " carries no sha256, so damage to it cannot be detected; export the checkpoint again to have"
    " it checked"
  ) in caplog.messages


def test_an_unknown_combiner_in_an_export_of_0_3_names_the_feature(tmp_path):
  export = _write(tmp_path / "e")
  _as_written_by_0_3(export)
  _replace_in_info(export, b'"combiner": "mean"', b'"combiner": "meal"')
  with pytest.raises(
    serving.ExportError,
    match=rf"^export '{export}': feature 'user': combiner 'meal' {ALLOWED}$",
  ):
    serving.read_info(export)


def test_a_newer_format_version_is_named(tmp_path):
  export = _write(tmp_path / "e")
  _replace_in_info(export, b'"format_version": 2', b'"format_version": 3')
  with pytest.raises(
    serving.ExportError,
    match=rf"^export '{export}' has export format_version 3; this sparsepipe reads 2 and older$",
  ):
    serving.read_info(export)


def test_the_host_lookup_refuses_an_unknown_combiner():
  batch = ExampleBatch(
    labels=np.zeros(1, np.float32),
    dense=np.zeros((1, 1), np.float32),
    sparse={"user": RaggedBatch(np.array([1]), np.array([1]))},
  )
  features = [{**_info().features[0], "combiner": "avg"}]
  tables = {"user": np.ones((4, 2), np.float32)}
  with pytest.raises(ValueError, match=rf"^feature 'user': combiner 'avg' {ALLOWED}$"):
    serving.combined_embeddings(tables, features, batch)
  # The COO gains took any unknown name as sqrtn.
  with pytest.raises(ValueError, match=rf"^id_gains: combiner 'avg' {ALLOWED}$"):
    id_gains("avg", np.array([2]), None)


def test_specs_refuse_an_unknown_combiner():
  with pytest.raises(ValueError, match=rf"^table 'user': combiner 'avg' {ALLOWED}$"):
    core.TableSpec(name="user", vocabulary_size=10, embedding_dim=4, combiner="avg")
  with pytest.raises(ValueError, match=rf"^stack 's': combiner 'avg' {ALLOWED}$"):
    core.StackedTableSpec(
      stack_name="s",
      stack_vocab_size=16,
      stack_embedding_dim=8,
      optimizer=core.SGDOptimizerSpec(),
      combiner="avg",
      total_sample_count=8,
    )


def test_a_config_with_an_unknown_combiner_is_refused_before_any_data_is_made(tmp_path):
  config = launch_testing.tiny_config(features__user__combiner="avg")
  message = rf"^config.features.user.combiner \(feature 'user'\): combiner 'avg' {ALLOWED}$"
  with pytest.raises(ValueError, match=message):
    config_specs.check_combiners(config)
  with pytest.raises(ValueError, match=message):
    train_and_evaluate(config, str(tmp_path / "job"))
  assert not os.path.exists(tmp_path / "job" / "data")

"""What a job says about its data: features in plain words, tables too small for the data
(and what to do), dense columns that swamp the model, a batch larger than the dataset."""

import sys
import types

import ml_collections
import pytest

from sparsepipe import data
from sparsepipe.launch.config.base_config import feature
from sparsepipe.launch.config.from_manifest import check_vocab_sizes
from sparsepipe.launch.job import announce

import subprocess_harness as harness  # pylint: disable=g-bad-import-order


def _dataset(tmp_path, rows, **columns):
  csv = tmp_path / "t.csv"
  csv.write_text("y,ts,item\n" + "".join(f"{i % 2},{1_000_000 + i},{i % 7}\n" for i in range(rows)))
  return data.convert_csv(
    [str(csv)],
    str(tmp_path / "data"),
    label_column="y",
    dense_columns=["ts"],
    sparse_columns=["item"],
    **columns,
  )


def test_tables_smaller_than_the_data_say_how_to_convert_it(tmp_path):
  manifest = _dataset(tmp_path, 10, vocab_sizes=["1000000"])
  config = ml_collections.ConfigDict({"features": {"item": feature(1460), "other": feature(5)}})
  with pytest.raises(ValueError) as e:
    check_vocab_sizes(config, manifest)
  assert str(e.value) == (
    f"dataset '{manifest.directory}': the config's tables are smaller than the data's"
    " vocabularies: feature 'item' has vocab_size 1,000,000 in the data,"
    " config.features.item.vocab_size = 1,460. Convert the data with the config's vocabulary"
    " sizes (the converter's --vocab_sizes flag; for --config=criteo its VOCAB_SIZES, see"
    " docs/reference/config.md), or train on this data with --config=dataset (its tables follow the"
    " data's manifest)"
  )
  config.features.item.vocab_size = 1_000_000
  check_vocab_sizes(config, manifest)  # large enough: no error


@pytest.mark.parametrize(
  "lo, hi, recorded, words",
  [
    (0, 1, {"max": 1, "mean": 0.5}, "0 or 1 ids per example (mean 0.50)"),
    (1, 1, {"max": 1, "mean": 1.0}, "1 id per example"),
    (0, 2, {"max": 2, "mean": 1.33203125}, "up to 2 ids per example (mean 1.33)"),
    (0, 16, {"max": 3, "mean": 1.5}, "up to 3 ids per example (mean 1.50), max_ids 16"),
    (0, 1, None, "0 or 1 ids per example"),
    (2, 2, None, "2 ids per example"),
    (1, 4, None, "1 to 4 ids per example"),
  ],
)
def test_ids_per_example_in_words(lo, hi, recorded, words):
  assert announce._ids(lo, hi, recorded) == words  # pylint: disable=protected-access


def _job(num_steps, batch, examples, dense_warnings=(), num_epochs=0.0):
  return types.SimpleNamespace(
    config=types.SimpleNamespace(num_epochs=num_epochs),
    schedule=types.SimpleNamespace(num_steps=num_steps),
    global_batch=batch,
    model=types.SimpleNamespace(epoch_examples=examples, dense_warnings=list(dense_warnings)),
    epoch=lambda n: n * batch / examples,
  )


def test_a_batch_larger_than_the_dataset_or_many_epochs_warn():
  assert announce.data_warnings(_job(20, 4096, 163)) == [
    "a batch of 4,096 examples is larger than the dataset (163 examples): each batch holds"
    " every example 25.1 times on average, and 20 batches are 503 epochs; lower"
    " --config.global_batch_size (or per_host_batch_size) or train on more data"
  ]
  assert announce.data_warnings(_job(1000, 64, 600)) == [
    "1,000 batches of 64 are 107 epochs over 600 examples (more than 100): the model will"
    " learn these examples by heart; lower --config.num_steps (or train a number of epochs:"
    " --config.num_epochs) or train on more data"
  ]
  assert announce.data_warnings(_job(900, 64, 600)) == []  # 96 epochs
  assert announce.data_warnings(_job(10, 64, 600, ["x"])) == ["x"]


def test_many_epochs_by_num_epochs_say_to_lower_num_epochs():
  """A job run by epochs takes its num_steps from them: the warning named num_steps,
  whose lowering changed nothing."""
  assert announce.data_warnings(_job(1000, 64, 600, num_epochs=106.7)) == [
    "1,000 batches of 64 are 107 epochs over 600 examples (more than 100): the model will"
    " learn these examples by heart; lower --config.num_epochs or train on more data"
  ]


def test_the_job_prints_the_warnings_at_its_start(tmp_path):
  manifest = _dataset(tmp_path, 40, dense_transform="none")
  workdir = str(tmp_path / "job")
  command = [sys.executable, "-m", "sparsepipe.launch", "--config=dataset"]
  command += [f"--config.data.dir={manifest.directory}", f"--workdir={workdir}"]
  command += ["--config.num_steps=2", "--config.global_batch_size=64"]
  out = harness.run(command, env=harness.cpu_env(1), timeout_s=300)
  assert out.returncode == 0, out.describe()
  assert out.lines[1:4] == [
    "  feature 'item': vocab 32, 1 id per example, combiner sum, table dim 16",
    "warning: dense column 'ts' is stored with values up to 1e+06 in magnitude (mean 1e+06,"
    " std 11.54, transform none): inputs past 100 swamp the model; convert with"
    " --dense_transform log1p (or auto) to store log(1 + x)",
    "warning: a batch of 64 examples is larger than the dataset (40 examples): each batch"
    " holds every example 1.6 times on average, and 2 batches are 3 epochs; lower"
    " --config.global_batch_size (or per_host_batch_size) or train on more data",
  ]
  # Extended, the job says what its new length does (it once said nothing).
  command[-2] = "--config.num_steps=3"
  out = harness.run(command, env=harness.cpu_env(1), timeout_s=300)
  assert out.returncode == 0, out.describe()
  warnings = [line for line in out.lines if line.startswith("warning: ")]
  assert warnings[1] == (
    "warning: a batch of 64 examples is larger than the dataset (40 examples): each batch"
    " holds every example 1.6 times on average, and 3 batches are 5 epochs; lower"
    " --config.global_batch_size (or per_host_batch_size) or train on more data"
  )

"""What a new user meets through the launcher: epochs instead of batches, a limit
error that says what to do, a step no longer kept named as such."""

import json
import os
import re
import subprocess
import sys

from sparsepipe import data

import launch_testing  # pylint: disable=g-bad-import-order
import subprocess_harness as harness  # pylint: disable=g-bad-import-order


def _run(module, *flags):
  command = [sys.executable, "-m", module, *flags]
  return harness.run(command, env=harness.cpu_env(1), timeout_s=300)


def test_num_epochs_sets_the_batches_and_evaluate_names_the_steps_kept(tmp_path):
  workdir = str(tmp_path / "job")
  overrides = launch_testing.flag_overrides(fdo__every_steps=0, num_steps=1000)
  trained = _run("sparsepipe.launch", f"--workdir={workdir}", *overrides, "--config.num_epochs=0.3")
  assert trained.returncode == 0, trained.describe()
  # ceil(0.3 * 1024 / 32) = 10 batches, not num_steps.
  assert trained.lines[0] == (
    "sparsepipe: training 10 batches of 32 (0.31 epochs of 1,024 examples) on 1 device"
    f" (1 process); workdir {workdir}"
  )
  assert launch_testing.events(workdir, "done") == [{"event": "done", "batch": 10}]
  kept = sorted(int(p) for p in os.listdir(os.path.join(workdir, "checkpoints")) if p.isdigit())
  assert kept == [9, 10]

  missing = _run("sparsepipe.launch.evaluate", f"--workdir={workdir}", "--step=3")
  assert (missing.returncode, missing.stderr) == (
    1,
    f"error: {workdir}/checkpoints holds no step 3: the steps kept are 9, 10 (a job keeps its"
    " newest checkpoint.keep steps)\n",
  )
  negative = _run("sparsepipe.launch.evaluate", f"--workdir={workdir}", "--cpu_devices=-1")
  assert (negative.returncode, negative.stderr) == (
    1,
    "error: --cpu_devices=-1: -1 is not a non-negative integer\n",  # before: accepted
  )

  # --json never replaces saved work or an existing file (without --overwrite), and is
  # checked before the eval runs.
  metrics_file = os.path.join(workdir, "metrics.jsonl")
  with open(metrics_file, "rb") as f:
    saved = f.read()
  inside = _run("sparsepipe.launch.evaluate", f"--workdir={workdir}", f"--json={metrics_file}")
  assert (inside.returncode, inside.lines) == (1, []), inside.describe()
  assert inside.stderr == (
    f"error: --json '{metrics_file}' is inside workdir '{workdir}' (it has job.json): write"
    " the metrics outside any workdir, dataset or export\n"
  )
  nowhere = str(tmp_path / "nowhere")
  missing_data = _run(
    "sparsepipe.launch.evaluate", f"--workdir={workdir}", f"--eval_data_dir={nowhere}"
  )
  assert (missing_data.returncode, missing_data.stderr) == (
    1,
    f"error: --eval_data_dir='{nowhere}': no manifest.json in '{nowhere}' (not a finished"
    " dataset)\n",
  )
  existing = tmp_path / "metrics.json"
  existing.write_text("mine\n")
  refused = _run("sparsepipe.launch.evaluate", f"--workdir={workdir}", f"--json={existing}")
  assert (refused.returncode, refused.lines, refused.stderr) == (
    1,
    [],
    f"error: '{existing}' exists: give --overwrite to replace it, or another --json\n",
  )
  with open(metrics_file, "rb") as f:
    assert f.read() == saved
  assert existing.read_text() == "mine\n"
  replaced = _run(
    "sparsepipe.launch.evaluate",
    f"--workdir={workdir}",
    f"--eval_data_dir={os.path.join(workdir, 'data')}",  # the job has no eval set of its own
    f"--json={existing}",
    "--overwrite",
  )
  assert replaced.returncode == 0, replaced.describe()
  record = json.loads(existing.read_text())
  assert (record["step"], record["batch"]) == (10, 10) and 0 <= record["auc"] <= 1, record
  assert sorted(os.listdir(tmp_path)) == ["job", "metrics.json"]  # no temporary file left


def test_a_batch_over_the_limits_is_one_line_saying_what_to_do(tmp_path):
  workdir = str(tmp_path / "job")
  out = _run(
    "sparsepipe.launch",
    f"--workdir={workdir}",
    *launch_testing.flag_overrides(),
    "--config.limits.max_ids_per_partition=2",
    "--config.limits.max_unique_ids_per_partition=2",
  )
  assert out.returncode == 1, out.describe()
  *generating, line = out.stderr.splitlines()  # the data generator's progress, the error
  assert all(g.startswith("synthetic ") for g in generating), out.stderr
  assert line.startswith("error: batch 1: features 'category', 'history', 'item', 'user'"), line
  assert line.endswith(f" exceed max_ids_per_partition=2; {_LIMIT_HINT}"), line


_LIMIT_HINT = (
  "rerun with --config.data.allow_id_dropping=true to go on (such ids are dropped and"
  " counted: dropped_ids_largest_host in metrics.jsonl's fdo records; the next FDO retune"
  " raises the limits to fit), or start a new job with more room: a larger"
  " config.fdo.headroom (over the counts FDO saw) or fdo.first_after (more batches before"
  " the first retune); before a retune the limits are config.limits.* (0: the worst case"
  " of the batch, always enough)"
)


def test_a_batch_over_the_limits_fdo_tuned_goes_on_as_the_error_says(tmp_path):
  """Limits tuned on a few batches (no headroom) and a later batch over them: the error
  advised raising config.limits, which FDO overwrote at its next retune, and a rerun with
  allow_id_dropping was refused as another job's config; the job could not finish."""
  workdir = str(tmp_path / "job")
  tight = [f"--workdir={workdir}", "--config.num_steps=24", "--config.checkpoint.every_steps=2"]
  tight += ["--config.fdo.headroom=1.0", "--config.fdo.steps_per_doubling=0"]
  failed = _run("sparsepipe.launch", *tight)
  assert failed.returncode == 1, failed.describe()
  line = failed.stderr.splitlines()[-1]
  found = re.fullmatch(
    r"error: batch (\d+): features 'category',"
    r" 'history', 'item', 'user' \(stack 'category_history_item_user'\): .* exceed"
    r" max_(unique_)?ids_per_partition=\d+; (.*)",
    line,
  )
  assert found and found.group(3) == _LIMIT_HINT, line
  stopped_at = int(found.group(1))
  assert 4 < stopped_at < 20  # after the retune after batch 4
  before = launch_testing.batch_losses(workdir)
  went_on = _run("sparsepipe.launch", *tight, "--config.data.allow_id_dropping=true")
  assert went_on.returncode == 0, went_on.describe()
  losses = launch_testing.batch_losses(workdir)
  assert sorted(losses) == list(range(1, 25))
  (resume,) = launch_testing.events(workdir, "resume")
  assert 4 <= resume["batch"] < stopped_at
  assert all(losses[b] == before[b] for b in range(1, resume["batch"] + 1))
  (retune,) = [e for e in launch_testing.events(workdir, "fdo") if e["batch"] == 20]
  assert retune["dropped_ids_largest_host"]["category_history_item_user"] > 0
  assert any(
    re.fullmatch(
      r"sparsepipe: FDO after batch 20: category_history_item_user: .*; ids dropped so far"
      r" \(largest host\): category_history_item_user [\d,]+",
      out,
    )
    for out in went_on.lines
  ), went_on.lines


def test_a_config_path_outside_a_checkout_names_the_shipped_configs(tmp_path):
  out = subprocess.run(
    [sys.executable, "-m", "sparsepipe.launch", "--config=configs/dataset.py"],
    env=harness.cpu_env(1),
    cwd=str(tmp_path),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert (out.returncode, out.stderr) == (
    1,
    f"error: --config=configs/dataset.py: no config file 'configs/dataset.py' (from"
    f" {tmp_path}); the shipped configs are criteo, dataset, demo, e.g. --config=demo\n",
  )
  assert os.listdir(tmp_path) == []


def test_the_dataset_config_prints_its_features_and_the_steady_state_rate(tmp_path):
  dataset = _tiny_ratings(tmp_path, 1024, ids=("user", "movie"))
  workdir = str(tmp_path / "job")
  out = _run(
    "sparsepipe.launch",
    "--config=dataset",
    f"--config.data.dir={dataset}",
    f"--workdir={workdir}",
    "--config.num_steps=12",
    "--config.global_batch_size=64",
    "--config.log_every_steps=2",
  )
  assert out.returncode == 0, out.describe()
  assert out.lines[:4] == [
    f"sparsepipe: training 12 batches of 64 (0.75 epochs of 1,024 examples) on 1 device"
    f" (1 process); workdir {workdir}",
    # In the data's column order, not sorted.
    "  feature 'user': vocab 128, 1 id per example, combiner sum, table dim 16",
    "  feature 'movie': vocab 128, 1 id per example, combiner sum, table dim 16",
    "  feature 'genres': vocab 128, up to 2 ids per example (mean 1.33), combiner mean, table"
    " dim 16",
  ]
  assert re.fullmatch(
    r"sparsepipe: done: 12 batches, last loss [0-9.]+, [0-9,]+ examples/s \([0-9,]+ in steady"
    rf" state\); checkpoint 12 in {re.escape(workdir)}/checkpoints; metrics in"
    rf" {re.escape(workdir)}/metrics.jsonl",
    out.lines[-1],
  ), out.lines[-1]


def test_a_config_field_given_as_a_flag_names_its_config_flag(tmp_path):
  """`--num_steps=80` said only absl's "Unknown command line flag 'num_steps'"."""
  for flags, line in [
    (["--num_steps=80"], "--num_steps=80: no such flag; did you mean --config.num_steps=80?"),
    (["--num_steps", "80"], "--num_steps 80: no such flag; did you mean --config.num_steps=80?"),
    (
      ["--eval.every_steps=5"],
      "--eval.every_steps=5: no such flag; did you mean --config.eval.every_steps=5?",
    ),
    (
      ["--features.user.vocab_size=64"],
      "--features.user.vocab_size=64: no such flag; did you mean"
      " --config.features.user.vocab_size=64?",
    ),
    (
      ["--nodata.shuffle"],
      "--nodata.shuffle: no such flag; did you mean --config.data.shuffle=false?",
    ),
    # Any other unknown flag: absl's message, on one line.
    (["--workdri=x"], "Unknown command line flag 'workdri'. Did you mean: workdir ?"),
    (["--nothing_of_the_config=1"], "Unknown command line flag 'nothing_of_the_config'"),
  ]:
    out = _run("sparsepipe.launch", f"--workdir={tmp_path}", *flags)
    assert (out.returncode, out.lines, out.stderr) == (1, [], f"error: {line}\n"), flags
  assert os.listdir(tmp_path) == []


def _tiny_ratings(tmp_path, rows, ids=("userId", "movieId")):
  """A converted CSV of `rows` ratings (MovieLens' columns, the id columns named `ids`),
  its directory."""
  csv = tmp_path / "ratings.csv"
  lines = [f"{ids[0]},{ids[1]},rating,genres"]
  lines += [
    f"{i % 37},{i % 101},{1 + i % 5},{'Comedy|Drama' if i % 3 else ''}" for i in range(rows)
  ]
  csv.write_text("\n".join(lines) + "\n")
  data.convert_csv(
    [str(csv)],
    str(tmp_path / "data"),
    label_column="rating",
    label_threshold=4.0,
    sparse_columns=[*ids, "genres"],
    multivalent_columns=["genres"],
    integer_id_columns=list(ids),
    vocab_sizes=["128"],
  )
  return str(tmp_path / "data")


def test_the_dataset_config_trains_epochs_of_its_data(tmp_path):
  """--config=dataset trained 1,000 batches whatever the data (1,571 epochs of a
  163-example CSV); it trains 10 epochs unless told num_steps or num_epochs."""
  flags = [f"--config.data.dir={_tiny_ratings(tmp_path, 100)}", "--config.global_batch_size=50"]
  workdir = str(tmp_path / "job")
  out = _run("sparsepipe.launch", "--config=dataset", f"--workdir={workdir}", *flags)
  assert out.returncode == 0, out.describe()
  assert out.lines[0] == (
    "sparsepipe: training 20 batches of 50 (10.00 epochs of 100 examples) on 1 device"
    f" (1 process); workdir {workdir}"
  )
  assert launch_testing.events(workdir, "done") == [{"event": "done", "batch": 20}]
  # Rerun: the job keeps its length, and names the field that sets it.
  out = _run("sparsepipe.launch", "--config=dataset", f"--workdir={workdir}", *flags)
  assert (out.returncode, out.lines[-1]) == (
    0,
    f"sparsepipe: the job in {workdir} has trained 20 batches (num_steps 20 saved, from"
    " num_epochs 10; checkpoint 20); this run's num_steps is 20: nothing to train. To train"
    " more, raise --config.num_epochs above 10",
  ), out.describe()
  workdir = str(tmp_path / "by_steps")
  flags += ["--config.num_steps=3"]
  out = _run("sparsepipe.launch", "--config=dataset", f"--workdir={workdir}", *flags)
  assert out.returncode == 0, out.describe()
  assert out.lines[0] == (
    "sparsepipe: training 3 batches of 50 (1.50 epochs of 100 examples) on 1 device"
    f" (1 process); workdir {workdir}"
  )

"""A job's start: the persistent compilation cache and the startup record."""

import json
import os
import re
import subprocess
import sys
import time


import launch_testing
import subprocess_harness as harness


def _start(workdir, cache_dir):
  """The tiny demo job in a fresh process on 1 device: its startup record, and the
  programs JAX's log says it compiled for lack of a cache entry and found in the cache."""
  env = harness.cpu_env(1, JAX_LOG_COMPILES="1", JAX_EXPLAIN_CACHE_MISSES="1")
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the job's own setting, not the harness's
  command = [
    sys.executable,
    "-m",
    "sparsepipe.launch",
    f"--config={launch_testing.DEMO_CONFIG}",
    *launch_testing.flag_overrides(num_steps=4, fdo__every_steps=0, checkpoint__every_steps=4),
    f"--config.compilation_cache_dir={cache_dir}",
    f"--workdir={workdir}",
  ]
  done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
  assert done.returncode == 0, done.stderr[-3000:]
  (record,) = launch_testing.events(str(workdir), "startup")
  misses = re.findall(r"PERSISTENT COMPILATION CACHE MISS for '(\S+)'", done.stderr)
  hits = re.findall(r"Persistent compilation cache hit for '(\S+)'", done.stderr)
  return record, misses, hits


def test_a_second_start_compiles_nothing_new(tmp_path):
  cache = tmp_path / "cache"
  first, first_misses, first_hits = _start(tmp_path / "first", cache)
  # Every program of the first start was compiled and written to the cache.
  assert first["state"] == "init"
  assert first["programs_compiled"] == first["cache_misses"] > 0
  assert first["cache_hits"] == 0
  assert len(first_misses) >= first["programs_compiled"]
  # The same job started again (here in a new workdir: the same programs)
  # loads every one of them, to the end of the job.
  second, second_misses, second_hits = _start(tmp_path / "second", cache)
  assert second_misses == []
  assert set(second_hits) == set(first_misses) | set(first_hits)
  assert second["programs_compiled"] == second["cache_misses"] == 0
  assert second["cache_hits"] == first["cache_misses"]
  for record in (first, second):
    assert record["batch"] == 1
    parts = sum(record[f"{p}_s"] for p in ("data", "state", "input", "compile"))
    assert abs(parts - record["first_batch_s"]) < 0.01
  # The COO passes' numba cache is under the same root.
  numba_files = [f for _, _, files in os.walk(cache / "numba-v2") for f in files]
  assert any(f.startswith("passes.key_pass") and f.endswith(".nbi") for f in numba_files)
  assert sorted(os.listdir(cache)) == ["jax", "numba-v2"]


def test_the_startup_line_names_every_phase(tmp_path, capsys):
  from sparsepipe.launch import train_and_evaluate  # pylint: disable=g-import-not-at-top

  config = launch_testing.tiny_config(num_steps=2, fdo__every_steps=0)
  config.compilation_cache_dir = ""
  train_and_evaluate(config, str(tmp_path))
  out = capsys.readouterr().out
  (line,) = [line for line in out.splitlines() if "first batch after" in line]
  assert re.fullmatch(
    r"sparsepipe: first batch after [\d.]+ s: data [\d.]+ s, state [\d.]+ s, input [\d.]+ s,"
    r" compile [\d.]+ s \(state init; \d+ programs compiled, \d+ from the compilation cache\)",
    line,
  ), line
  with open(tmp_path / "metrics.jsonl") as f:
    records = [json.loads(r) for r in f]
  (startup,) = [r for r in records if r.get("event") == "startup"]
  assert sorted(startup) == sorted(
    [
      "event",
      "batch",
      "first_batch_s",
      "state",
      "data_s",
      "state_s",
      "eval_s",
      "input_s",
      "compile_s",
      "programs_compiled",
      "compile_seconds",
      "cache_hits",
      "cache_misses",
    ]
  )


def test_a_named_phase_is_a_metrics_line_and_a_tensorboard_point(tmp_path):
  from sparsepipe.launch.job.job_output import JobOutput  # pylint: disable=g-import-not-at-top
  from sparsepipe.launch.job.startup import record_phase  # pylint: disable=g-import-not-at-top

  output = JobOutput(str(tmp_path), total_batches=10, enabled=True)
  output.resume_after(0)
  calls = []
  output._tensorboard.scalars = lambda step, values: calls.append((step, dict(values)))
  record_phase(output, "retune_stall", 300, 0.25, limits_changed=True)
  output.close()
  assert launch_testing.events(str(tmp_path), "phase") == [
    {
      "event": "phase",
      "phase": "retune_stall",
      "batch": 300,
      "seconds": 0.25,
      "limits_changed": True,
    }
  ]
  assert calls == [(300, {"time/retune_stall_s": 0.25})]


def test_the_cache_root_of_each_setting(monkeypatch):
  from sparsepipe.core import compile_cache  # pylint: disable=g-import-not-at-top

  monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
  assert compile_cache.cache_root("auto") == "/xdg/sparsepipe"
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", "/home/u")
  assert compile_cache.cache_root("auto") == "/home/u/.cache/sparsepipe"
  assert compile_cache.cache_root("~/c") == "/home/u/c"
  assert compile_cache.cache_root("/abs/c") == "/abs/c"
  assert compile_cache.cache_root("") is None
  assert compile_cache.enable("") is None


def test_the_eval_a_resumed_job_runs_first_is_its_own_phase(tmp_path, capsys, monkeypatch):
  """The eval of the boundary a job resumed at (killed during it) was counted as
  compile time: now the `eval` phase, named in the line when it ran."""
  from sparsepipe.launch import train_and_evaluate  # pylint: disable=g-import-not-at-top
  from sparsepipe.launch.job.evaluation import JobEval  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path)
  config = launch_testing.tiny_config(synthetic__eval_examples=64, eval__every_steps=4)
  train_and_evaluate(config, workdir)
  metrics_file = tmp_path / "metrics.jsonl"
  kept = [
    line
    for line in metrics_file.read_text().splitlines(keepends=True)
    if json.loads(line).get("event") not in ("eval", "done") or json.loads(line)["batch"] != 8
  ]
  metrics_file.write_text("".join(kept))  # as if killed during the final eval
  run = JobEval.run

  def slow(self, *args, **kwargs):
    time.sleep(2.0)
    return run(self, *args, **kwargs)

  monkeypatch.setattr(JobEval, "run", slow)
  capsys.readouterr()
  config.num_steps = 10
  train_and_evaluate(config, workdir)
  (line,) = [line for line in capsys.readouterr().out.splitlines() if "first batch after" in line]
  assert re.fullmatch(
    r"sparsepipe: first batch after [\d.]+ s: data [\d.]+ s, state [\d.]+ s, eval [\d.]+ s,"
    r" input [\d.]+ s, compile [\d.]+ s \(state restore; .*\)",
    line,
  ), line
  *_, startup = launch_testing.events(workdir, "startup")
  assert startup["eval_s"] >= 2.0 and startup["compile_s"] < startup["first_batch_s"] - 2.0
  assert [e["batch"] for e in launch_testing.events(workdir, "eval")] == [4, 8, 10]

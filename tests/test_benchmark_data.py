"""The benchmarks' own datasets are made as the launcher makes a new job's."""

import importlib.util
import os

from sparsepipe import data

import paths  # pylint: disable=g-bad-import-order


def _benchmark(name: str):
  spec = importlib.util.spec_from_file_location(
    name, os.path.join(paths.REPO_ROOT, "benchmarks", f"{name}.py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_main_process_benchmark_packs_its_records_as_a_new_criteo_job(tmp_path):
  """The criteo config's examples_per_record defaults to 0 (resolved by the launcher):
  read as it is, the benchmark's writer refused it."""
  generate = _benchmark("loader_main_process").generate
  manifest = data.read_manifest(generate(str(tmp_path / "criteo"), 512))
  assert manifest.examples_per_record == 128
  assert manifest.num_examples == 512

"""Installing sparsepipe keeps the JAX that an environment already has.

An accelerator image ships its own jax and jaxlib with their CUDA or TPU plugin; `pip
install sparsepipe` there must leave them as they are, which it does when pyproject's ranges
admit them. pip's `--dry-run --report` says what an install would change without changing
anything: the test asks it about this checkout in the environment running the tests (jax
0.10.2 on Python 3.11 for the README's command; jax 0.12.0.1 on Python 3.12 in .ci/run's
second environment, where .ci/run also installs the package for real and compares).
"""

import importlib.metadata
import json
import subprocess
import sys

from paths import REPO_ROOT


def test_pip_install_of_the_checkout_keeps_the_installed_jax(tmp_path):
  report = tmp_path / "report.json"
  command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet"]
  done = subprocess.run(
    command + ["--report", str(report), REPO_ROOT], capture_output=True, text=True, timeout=600
  )
  assert done.returncode == 0, done.stderr
  would_install = {
    item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
    for item in json.loads(report.read_text())["install"]
  }
  installed = {name: importlib.metadata.version(name) for name in ("jax", "jaxlib")}
  assert would_install.get("sparsepipe") == importlib.metadata.version("sparsepipe")
  assert {n: v for n, v in would_install.items() if n.startswith("jax")} == {}, installed

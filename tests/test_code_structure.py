"""The codebase's shape: imports follow the data flow, functions fit a screen, lint is clean."""

import ast
import os
import shutil
import subprocess
import sys
import tomllib

import pytest

import sparsepipe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "sparsepipe")
# Lower layers first: a module may import its own layer and the ones before it.
LAYERS = ("core", "data", "transforms", "pipeline", "checkpointing", "serving", "launch")
MAX_FUNCTION_LINES = 80
# The one file name several modules may share: one converter (and its first pass) per data
# format (data/csv, data/parquet, data/criteo), the same kind of thing in each.
SHARED_MODULE_NAMES = ("convert.py", "scan.py")


def _modules():
  for dirpath, _, filenames in os.walk(PACKAGE):
    for name in sorted(filenames):
      if name.endswith(".py"):
        path = os.path.join(dirpath, name)
        yield os.path.relpath(path, ROOT), ast.parse(open(path).read(), path)


def _layer(dotted: str) -> str | None:
  parts = dotted.split(".")
  return parts[1] if len(parts) > 1 and parts[0] == "sparsepipe" else None


def test_no_subpackage_imports_a_later_one():
  upward = []
  for path, tree in _modules():
    own = path.split(os.sep)[1]
    if own not in LAYERS:
      continue
    for node in ast.walk(tree):
      names = []
      if isinstance(node, ast.ImportFrom) and node.module:
        names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
      elif isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      for name in names:
        layer = _layer(name)
        if layer in LAYERS and LAYERS.index(layer) > LAYERS.index(own):
          upward.append(f"{path}:{node.lineno} imports {name}")
  assert upward == []


def test_no_function_body_is_over_80_lines():
  long = []
  for path, tree in _modules():
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        body = node.body
        if isinstance(body[0], ast.Expr) and isinstance(
          getattr(body[0], "value", None), ast.Constant
        ):
          body = body[1:] or body  # the docstring is not code
        lines = body[-1].end_lineno - body[0].lineno + 1
        if lines > MAX_FUNCTION_LINES:
          long.append(f"{path}:{node.lineno} {node.name}: {lines} lines")
  assert long == []


def test_no_two_modules_share_a_name_but_the_converters():
  # A module's name says what it holds: two modules of one name (two layout.py, two
  # state.py) send a reader of an import to the wrong one.
  paths: dict[str, list[str]] = {}
  for dirpath, _, filenames in os.walk(PACKAGE):
    for name in filenames:
      if name.endswith(".py") and name not in ("__init__.py", "__main__.py"):
        paths.setdefault(name, []).append(os.path.relpath(os.path.join(dirpath, name), ROOT))
  shared = [
    f"{name}: {', '.join(sorted(found))}"
    for name, found in sorted(paths.items())
    if len(found) > 1 and name not in SHARED_MODULE_NAMES
  ]
  assert shared == []


@pytest.mark.skipif(
  shutil.which("ruff") is None and not os.environ.get("CI"),
  reason="ruff is installed by the [test] extra",
)
@pytest.mark.parametrize("command", [["check"], ["format", "--check"]])
def test_ruff_is_clean(command):
  result = subprocess.run(
    [sys.executable, "-m", "ruff", *command, "--no-cache", ROOT],
    capture_output=True,
    text=True,
    check=False,
  )
  assert result.returncode == 0, result.stdout + result.stderr


def test_version_is_the_pyprojects():
  # Regression: sparsepipe.__version__ still said 0.1.0 in 0.2.0.
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    assert sparsepipe.__version__ == tomllib.load(f)["project"]["version"]

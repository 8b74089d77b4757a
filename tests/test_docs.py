"""The user documents: the README's commands run as written, in order, from an empty
folder; every relative link in the documents resolves; the README stays short."""

import glob
import os
import re
import shlex
import subprocess
import sys
import tomllib

import numpy as np
import pytest

from sparsepipe.launch.config.flag import config_name

import launch_testing  # pylint: disable=g-bad-import-order
import paths  # pylint: disable=g-bad-import-order
import subprocess_harness as harness  # pylint: disable=g-bad-import-order

README = os.path.join(paths.REPO_ROOT, "README.md")
MAX_README_LINES = 250
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _text(path: str) -> str:
  with open(path, encoding="utf-8") as f:
    return f.read()


def _documents() -> list[str]:
  found = [README, os.path.join(paths.REPO_ROOT, "CHANGELOG.md")]
  found += sorted(glob.glob(os.path.join(paths.REPO_ROOT, "docs", "**", "*.md"), recursive=True))
  return found + [os.path.join(paths.REPO_ROOT, "benchmarks", "README.md")]


def _slug(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to '-'."""
  heading = re.sub(r"[`*]", "", heading.strip().lower())
  return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def _anchors(path: str) -> set[str]:
  text = re.sub(r"```.*?```", "", _text(path), flags=re.S)
  return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def _section(text: str, heading: str) -> str:
  (section,) = re.findall(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
  return section


def _blocks(text: str) -> list[tuple[str, str]]:
  """The fenced code blocks of `text`: (language, body)."""
  return re.findall(r"^```(\w*)\n(.*?)^```$", text, re.M | re.S)


def test_the_readme_is_a_front_door_of_at_most_250_lines():
  assert len(_text(README).splitlines()) <= MAX_README_LINES


@pytest.mark.parametrize(
  "document", _documents(), ids=lambda p: os.path.relpath(p, paths.REPO_ROOT)
)
def test_every_relative_link_resolves_inside_the_repository(document):
  broken = []
  for target in _LINK.findall(re.sub(r"```.*?```", "", _text(document), flags=re.S)):
    if re.match(r"[a-z]+:", target):
      continue  # a public page
    file_part, _, anchor = target.partition("#")
    resolved = os.path.normpath(os.path.join(os.path.dirname(document), file_part or document))
    if not resolved.startswith(paths.REPO_ROOT + os.sep) or not os.path.exists(resolved):
      broken.append(f"{target}: no such file in the repository")
    elif anchor and resolved.endswith(".md") and anchor not in _anchors(resolved):
      broken.append(f"{target}: no heading #{anchor}")
  assert broken == []


def _quick_start_commands() -> list[str]:
  (block,) = [body for kind, body in _blocks(_section(_text(README), "Quick start")) if kind]
  return [line for line in block.splitlines() if line and not line.startswith("#")]


def _common_tasks() -> list[str]:
  rows = re.findall(r"^\| [^|]+ \| `([^`]+)` \|$", _section(_text(README), "Common tasks"), re.M)
  assert len(rows) >= 10
  return rows


def _masked(line: str) -> str:
  return re.sub(r"\d[\d,.]*", "N", line)


def _shown_demo_lines() -> list[str]:
  (block,) = [body for kind, body in _blocks(_section(_text(README), "Quick start")) if not kind]
  return [line for line in block.splitlines() if line != "..."]


def _run(command: str, cwd: str) -> subprocess.CompletedProcess:
  """`command` through bash, with this interpreter as `python3`, on 1 CPU device."""
  command = re.sub(r"(^|&& )python3 ", rf"\1{shlex.quote(sys.executable)} ", command)
  return subprocess.run(
    ["bash", "-c", command],
    cwd=cwd,
    env=harness.cpu_env(1),
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )


def _written(cwd: str, command: str) -> list[str]:
  """The files and folders a command names as its outputs."""
  return [
    os.path.join(cwd, value) for value in re.findall(r"--(?:output|eval_output)=(\S+)", command)
  ]


def test_the_quick_start_and_every_common_task_work_as_written(tmp_path):
  install, tests = _quick_start_commands()
  # The installs are pip's (tests/test_install_beside_jax.py); the tests are this suite.
  assert install == "python3 -m pip install -e . && python3 -m sparsepipe.launch"
  assert tests == 'python3 -m pip install -e ".[test]" && python3 -m pytest -q tests'
  cwd = str(tmp_path)
  demo = _run(install.split(" && ")[1], cwd)
  assert demo.returncode == 0, demo.stderr
  printed = [_masked(line.replace(cwd + "/", "/home/you/")) for line in demo.stdout.splitlines()]
  shown = iter(printed)
  missing = [line for line in _shown_demo_lines() if _masked(line) not in shown]
  assert missing == [], "\n".join(printed)

  os.makedirs(os.path.join(cwd, "workdir"), exist_ok=True)
  launch_testing.write_movielens_csv(os.path.join(cwd, "workdir", "ratings.csv"))
  for command in _common_tasks():
    done = _run(command, cwd)
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    for output in _written(cwd, command):
      assert os.path.exists(output), f"{command} wrote no {output}"
  assert np.load(os.path.join(cwd, "workdir", "scores_80.npy")).shape == (4096,)
  assert not os.path.exists(os.path.join(cwd, "workdir", "demo"))  # the last task: start over


def test_the_own_model_command_does_not_meet_the_quick_starts_demo_job():
  guide = _text(os.path.join(paths.REPO_ROOT, "docs", "guide", "models.md"))
  (command,) = re.findall(
    r"^PYTHONPATH=\. python3 -m sparsepipe\.launch .*my_model:make.*$", guide, re.M
  )
  # The quick start's `python3 -m sparsepipe.launch` leaves its job in workdir/demo:
  # another model there is refused as another job.
  args = shlex.split(command)
  given = [a.split("=", 1)[1] for a in args if a.startswith("--workdir=")]
  assert config_name(None) == "demo"
  assert given and given[-1] not in ("workdir/demo", "workdir/demo/")


def test_tensorboard_is_an_extra_and_the_docs_say_how_to_install_it():
  with open(os.path.join(paths.REPO_ROOT, "pyproject.toml"), "rb") as f:
    extras = tomllib.load(f)["project"]["optional-dependencies"]
  assert extras["tensorboard"] == ["tensorboard>=2.21,<3"]
  assert '".[tensorboard]"' in _text(os.path.join(paths.REPO_ROOT, "docs", "guide", "jobs.md"))

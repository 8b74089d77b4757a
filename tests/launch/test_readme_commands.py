"""The README's commands as a new user runs them, one after another, from a fresh clone."""

import os
import re
import shlex
import tomllib

from sparsepipe.launch.config.flag import config_name

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _readme() -> str:
  with open(os.path.join(ROOT, "README.md")) as f:
    return f.read()


def _workdir(command: str) -> str:
  """The workdir a launcher command uses (the launcher's rule: --workdir, or
  ./workdir/<config name>)."""
  args = shlex.split(command)
  given = [a.split("=", 1)[1] for a in args if a.startswith("--workdir=")]
  configs = [a.split("=", 1)[1] for a in args if a.startswith("--config=")]
  return (
    given[-1] if given else os.path.join("workdir", config_name(configs[-1] if configs else None))
  )


def test_the_own_model_command_does_not_meet_the_quick_starts_demo_job():
  (command,) = re.findall(r"^PYTHONPATH=\. python3 -m sparsepipe\.launch .*$", _readme(), re.M)
  assert "--config.model.factory=my_model:make" in command
  # The quick start's `python3 -m sparsepipe.launch` leaves its job in workdir/demo:
  # another model there is refused as another job.
  assert _workdir("python3 -m sparsepipe.launch") == "workdir/demo"
  assert _workdir(command) not in ("workdir/demo", "workdir/demo/")


def test_tensorboard_is_an_extra_and_the_readme_says_how_to_install_it():
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    extras = tomllib.load(f)["project"]["optional-dependencies"]
  assert extras["tensorboard"] == ["tensorboard>=2.21,<3"]
  assert "pip install sparsepipe[tensorboard]" in _readme()

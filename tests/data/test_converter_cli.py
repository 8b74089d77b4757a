"""Command lines: a bad input or argument is one line on stderr and a non-zero exit."""

import ast
import paths
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = paths.REPO_ROOT
ENV = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
LINE = "\t".join(["1", *["2"] * 13, *["ab"] * 26])


def _run(*args):
  return subprocess.run(
    [sys.executable, "-m", *args],
    capture_output=True,
    text=True,
    env=ENV,
    check=False,
    timeout=120,
    cwd=ROOT,
  )


def test_converter_error_is_one_line_and_verbose_shows_the_traceback(tmp_path):
  path = tmp_path / "day.tsv"
  path.write_text("x" + LINE[1:] + "\n" + LINE + "\n")
  args = ["sparsepipe.data.criteo", "--input", str(path), "--output", str(tmp_path / "out")]
  out = _run(*args)
  assert (out.returncode, out.stdout) == (1, "")
  assert out.stderr == f"error: '{path}' line 1: column label value 'x' is not a number\n"
  out = _run(*args, "--verbose")
  assert out.returncode == 1 and "Traceback" in out.stderr
  assert out.stderr.rstrip().endswith("line 1: column label value 'x' is not a number")


def _convert_criteo_interrupted(tmp_path, sitecustomize: str):
  """The Criteo converter of one line, run with `sitecustomize` (which interrupts it)."""
  site = tmp_path / "site"
  site.mkdir()
  (site / "sitecustomize.py").write_text(sitecustomize)
  path = tmp_path / "day.tsv"
  path.write_text(LINE + "\n")
  return subprocess.run(
    [sys.executable, "-m", "sparsepipe.data.criteo", "--input", str(path)]
    + ["--output", str(tmp_path / "out")],
    capture_output=True,
    text=True,
    env={**ENV, "PYTHONPATH": os.pathsep.join((str(site), ENV["PYTHONPATH"]))},
    check=False,
    timeout=120,
    cwd=ROOT,
  )


def test_ctrl_c_is_one_line_status_130_and_leaves_no_output(tmp_path):
  # Was a KeyboardInterrupt traceback (every command but the launcher).
  out = _convert_criteo_interrupted(
    tmp_path,
    "from sparsepipe.data.criteo import convert\n"
    "def interrupted(*args, **kwargs):\n"
    "  raise KeyboardInterrupt\n"
    "convert.check_text_files = interrupted\n",
  )
  assert (out.returncode, out.stderr) == (
    130,
    "stopped by Ctrl-C; its output is written whole or not at all: run the same command"
    " again to make it\n",
  )
  assert sorted(os.listdir(tmp_path)) == ["day.tsv", "site"]


def test_a_ctrl_c_python_swallowed_is_still_one_line_and_status_130(tmp_path):
  """Raised inside a gc callback (JAX's, in a user's run), the KeyboardInterrupt
  was only reported ("Exception ignored in ...") and the command finished, status 0."""
  out = _convert_criteo_interrupted(
    tmp_path,
    "import gc, os, signal\n"
    "from sparsepipe.data.criteo import convert\n"
    "check = convert.check_text_files\n"
    "def callback(phase, info):\n"
    "  gc.callbacks.remove(callback)\n"
    "  os.kill(os.getpid(), signal.SIGINT)  # its handler runs here: Python swallows it\n"
    "def swallowed(*args, **kwargs):\n"
    "  gc.callbacks.append(callback)\n"
    "  gc.collect()\n"
    "  return check(*args, **kwargs)\n"
    "convert.check_text_files = swallowed\n",
  )
  assert (out.returncode, out.stderr.splitlines()[1:]) == (
    130,
    [
      "stopped by Ctrl-C; its output is written whole or not at all: run the same command"
      " again to make it"
    ],
  ), out.stderr
  assert out.stderr.startswith("criteo: 1 examples ")  # the progress line, before it
  assert os.path.isfile(tmp_path / "out" / "manifest.json")  # written whole


def test_flag_values_and_missing_inputs_are_one_line(tmp_path):
  out = _run(
    "sparsepipe.data.criteo",
    "--input",
    str(tmp_path / "none.tsv"),
    "--output",
    str(tmp_path / "o"),
    "--vocab_sizes",
    "1e6",
  )
  assert (out.returncode, out.stderr) == (
    1,
    "error: vocab_sizes (--vocab_sizes): '1e6' is not an integer (write 1000000, not 1e6)\n",
  )
  out = _run(
    "sparsepipe.data.csv",
    "--input",
    str(tmp_path / "none.csv"),
    "--output",
    str(tmp_path / "o"),
    "--label_column",
    "y",
  )
  assert (out.returncode, out.stderr) == (
    1,
    f"error: [Errno 2] No such file or directory: '{tmp_path / 'none.csv'}'\n",
  )
  # An input without examples: the error named the output ("no examples were written to").
  (tmp_path / "empty.tsv").write_text("")
  out = _run("sparsepipe.data.criteo", "--input", str(tmp_path / "empty.tsv"), "--output",
             str(tmp_path / "o"))  # fmt: skip
  assert (out.returncode, out.stderr) == (
    1,
    f"error: the input '{tmp_path / 'empty.tsv'}' holds no examples: nothing to write to"
    f" '{tmp_path / 'o'}'\n",
  )
  assert sorted(os.listdir(tmp_path)) == ["empty.tsv"]


def test_eval_split_from_the_command_line(tmp_path):
  path = tmp_path / "day.tsv"
  path.write_text((LINE + "\n") * 300)
  out = _run(
    "sparsepipe.data.criteo",
    "--input",
    str(path),
    "--output",
    str(tmp_path / "t"),
    "--eval_output",
    str(tmp_path / "e"),
    "--eval_fraction",
    "0.2",
    "--vocab_sizes",
    "9",
  )
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  assert len(lines) == 2 and lines[0].endswith(str(tmp_path / "t"))
  assert lines[1].endswith(str(tmp_path / "e"))
  out = _run(
    "sparsepipe.data.criteo",
    "--input",
    str(path),
    "--output",
    str(tmp_path / "t2"),
    "--eval_fraction",
    "0.2",
  )
  assert (out.returncode, out.stderr) == (
    1,
    "error: --eval_fraction needs --eval_output (the directory of the eval split)\n",
  )


def test_launch_config_typo_is_one_line_with_the_suggestion(tmp_path):
  out = _run("sparsepipe.launch", "--config.num_stepz=5", f"--workdir={tmp_path}")
  assert (out.returncode, out.stderr) == (
    1,
    "error: --config.num_stepz: the config has no field 'num_stepz'; did you mean num_steps?\n",
  )
  out = _run("sparsepipe.launch", "--config.data.dirr=x", f"--workdir={tmp_path}")
  assert (out.returncode, out.stderr) == (
    1,
    "error: --config.data.dirr: the config has no field 'dirr'; did you mean dir?\n",
  )
  # A config named on the command line applies the overrides while parsing.
  out = _run(
    "sparsepipe.launch",
    "--config=dataset",
    "--config.checkpoint_every_steps=2",
    f"--workdir={tmp_path}",
  )
  assert (out.returncode, out.stderr) == (
    1,
    "error: --config.checkpoint_every_steps: the config has no field 'checkpoint_every_steps' (a"
    " field of your own goes into a config file: --config=FILE.py, docs/guide/models.md)\n",
  )
  assert os.listdir(tmp_path) == []


def test_launch_errors_are_one_line_and_shipped_configs_go_by_name(tmp_path):
  out = _run(
    "sparsepipe.launch", "--config=criteo", "--config.num_steps=0", f"--workdir={tmp_path}"
  )
  assert (out.returncode, out.stdout, out.stderr) == (1, "", "error: num_steps=0 must be >= 1\n")
  out = _run(
    "sparsepipe.launch",
    "--config=criteo",
    "--config.num_steps=0",
    f"--workdir={tmp_path}",
    "--verbose",
  )
  assert out.returncode == 1 and "Traceback" in out.stderr


@pytest.mark.parametrize("name", ["criteo", "csv", "parquet", "synthetic"])
def test_the_usage_in_help_keeps_one_flag_group_per_line(name):
  """`--help` prints the module docstring; its backslash continuations once joined the
  usage example into one long line."""
  with open(os.path.join(ROOT, "sparsepipe", "data", name, "__main__.py")) as f:
    doc = ast.get_docstring(ast.parse(f.read()), clean=False)
  usage = [line for line in doc.splitlines() if line.startswith("    python -m")]
  assert len(usage) == 1 and usage[0].endswith(" \\"), doc


@pytest.mark.parametrize("name", ["csv", "parquet"])
def test_the_usage_in_help_names_the_readme_movielens_columns(name):
  """The example named user_id,movie_id (and a dense column age) where the README's
  MovieLens CSV has userId,movieId,rating,genres."""
  with open(os.path.join(ROOT, "sparsepipe", "data", name, "__main__.py")) as f:
    doc = ast.get_docstring(ast.parse(f.read()), clean=False)
  words = [w.strip("[]") for w in doc.split("\n\n")[1].replace("\\\n", " ").split()]
  given = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
  assert {flag: value for flag, value in given.items() if "label" in flag or "column" in flag} == {
    "--label_column": "rating",
    "--label_threshold": "4",
    "--sparse_columns": "userId,movieId,genres",
    "--integer_id_columns": "userId,movieId",
    "--dense_columns": "COLUMN,...",
    **({"--multivalent_columns": "genres"} if name == "csv" else {}),
    **({"--weight_columns": "genres=genre_weights"} if name == "parquet" else {}),
  }


def test_a_held_out_file_converted_like_the_train_data_agrees_with_it(tmp_path):
  """With --dense_transform auto, a held-out file whose column stays below 100 got "none"
  where the train data got "log1p": the job refused the pair and no flag converted it
  alike. --like takes the train data's vocabulary sizes and dense transforms."""
  from sparsepipe.data import read_manifest  # pylint: disable=g-import-not-at-top
  from sparsepipe.launch.config.from_manifest import check_manifests_agree  # pylint: disable=g-import-not-at-top

  (tmp_path / "day.tsv").write_text(LINE + "\n")
  header = "label,price,item\n"
  (tmp_path / "train.csv").write_text(header + "1,500,a\n0,3,b\n1,40,c\n0,7,a\n")
  (tmp_path / "held.csv").write_text(header + "0,5,c\n1,60,d\n")
  columns = ["--label_column", "label", "--dense_columns", "price", "--sparse_columns", "item"]

  def convert(name, *more, source="held"):
    out = _run("sparsepipe.data.csv", "--input", str(tmp_path / f"{source}.csv"), *columns,
               "--output", str(tmp_path / name), *more)  # fmt: skip
    return out, str(tmp_path / name)

  train = read_manifest(convert("train", source="train")[1])
  alone = read_manifest(convert("held")[1])
  assert (train.info["dense_transform"], alone.info["dense_transform"]) == (
    {"price": "log1p"},
    {"price": "none"},
  )
  with pytest.raises(ValueError) as refused:
    check_manifests_agree(train, alone)
  assert str(refused.value).endswith(
    f" (convert the eval data with --like={train.directory} to take the train data's"
    " vocabulary sizes and dense transforms)"
  )
  # Before: --output the --like dataset (with --overwrite) replaced the dataset it read.
  manifest_before = (tmp_path / "train" / "manifest.json").read_text()
  out, _ = convert("train", "--like", train.directory, "--overwrite")
  assert (out.returncode, out.stderr) == (
    1,
    f"error: --like '{train.directory}' is the --output: --like reads the dataset this one is"
    " converted like; give another --output\n",
  )
  assert (tmp_path / "train" / "manifest.json").read_text() == manifest_before
  out, like_dir = convert("like", "--like", train.directory)
  assert out.returncode == 0, out.stderr
  like = read_manifest(like_dir)
  assert like.info["dense_transform"] == {"price": "log1p"}
  assert like.info["vocab_sizes"] == train.info["vocab_sizes"] == {"item": 16}
  check_manifests_agree(train, like)
  assert like.info["dense_stats"]["price"]["max"] == pytest.approx(np.log1p(60.0))

  out, _ = convert("other", "--like", train.directory, "--dense_transform", "none")
  assert (out.returncode, out.stderr) == (
    1,
    f"error: --like takes --dense_transform from '{train.directory}': give one of them, not both\n",
  )
  del columns[3]  # --dense_columns '' (the train data has price)
  columns[3:3] = [""]
  out, _ = convert("other", "--like", train.directory)
  assert (out.returncode, out.stderr) == (
    1,
    f"error: --like '{train.directory}' was converted with --dense_columns=['price'], this"
    " command gives []: give the same columns\n",
  )
  assert not os.path.exists(tmp_path / "other")
  criteo = tmp_path / "criteo"
  assert _run("sparsepipe.data.criteo", "--input", str(tmp_path / "day.tsv"), "--output",
              str(criteo)).returncode == 0  # fmt: skip
  out, _ = convert("other", "--like", str(criteo))
  assert (out.returncode, out.stderr) == (
    1,
    f"error: --like '{criteo}' was made by 'sparsepipe.data.criteo', not by the CSV or Parquet"
    " converter: give a dataset converted from columns\n",
  )

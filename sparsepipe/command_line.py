"""What every command shares before its work: flag parsing, --help, one-line errors, Ctrl-C.

This module imports absl and the standard library only, so that a command
(the launcher, evaluate, export, the converters) answers `--help` and a
bad flag before JAX, Orbax, Grain and TensorStore load (seconds): the
commands import those in their main, after the flags are parsed.

Some of those libraries define absl flags of their own when imported
(Grain's `--grain_py_*`, ArrayRecord's, Orbax's `--experimental_orbax_*`).
A command line that names one, lists them all (`--helpfull`, `--helpxml`)
or may hold one (`--flagfile`) imports them before parsing, as every
command once did (`import_library_flags`).
"""

from __future__ import annotations

import functools
import importlib
import signal
import sys
from typing import Any, Callable, Sequence

from absl import app
from absl import flags
from absl import logging

# What a command reports in one line instead of a traceback: bad input
# (ValueError and its subclasses name the file, line, record or flag),
# file-system errors (missing input, existing output) and a training run
# that went non-finite (FloatingPointError).
USER_ERRORS = (ValueError, OSError, FloatingPointError)

# The names of the flags the libraries define when imported (a test checks
# that they define no other), and the flags that list or may hold them.
LIBRARY_FLAG_PREFIXES = ("grain_", "array_record_", "experimental_orbax_")
_ALL_FLAGS = ("helpfull", "helpxml", "flagfile")
# The package whose import defines them: sparsepipe.data imports Grain, and
# with it ArrayRecord's data source and Orbax.
LIBRARY_FLAGS_MODULE = "sparsepipe.data"


def names_library_flags(argv: Sequence[str]) -> bool:
  """Whether `argv` names a library's flag (LIBRARY_FLAG_PREFIXES, also as --noNAME),
  or asks for every flag (--helpfull, --helpxml), or gives a --flagfile."""
  for arg in argv[1:]:
    if arg == "--":
      break
    if not arg.startswith("-"):
      continue
    name = arg.lstrip("-").partition("=")[0]
    bare = name[2:] if name.startswith("no") else name
    if name in _ALL_FLAGS or bare.startswith(LIBRARY_FLAG_PREFIXES):
      return True
  return False


def import_library_flags() -> None:
  """Imports LIBRARY_FLAGS_MODULE (seconds: JAX, Grain, Orbax), defining the libraries' flags."""
  importlib.import_module(LIBRARY_FLAGS_MODULE)


def start_command(argv: Sequence[str]) -> None:
  """For commands without positional arguments: refuses any, and keeps absl at
  WARNING unless --verbosity is given (Orbax and Grain log every save at INFO)."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)


def parse_flags(
  argv: Sequence[str],
  help_epilog: Callable[[], str] | None = None,
  *,
  unknown_flag_line: Callable[[flags.UnrecognizedFlagError, Sequence[str]], str | None]
  | None = None,
  load_library_flags: Callable[[], None] = import_library_flags,
) -> list[str]:
  """app.run's flags_parser for every command: a bad flag is one line (exit 1), and
  --help (--helpshort, --helpfull) exits 0 after absl's usage and `help_epilog()`.

  absl's help flags print the usage and exit with status 1; a request for
  help is not an error, so the exit is turned into 0 here. `unknown_flag_line`
  may give the line for an unknown flag (None: absl's message). A command
  line that names the libraries' flags calls `load_library_flags` first
  (the module docstring).
  """
  if names_library_flags(argv):
    load_library_flags()
  try:
    return flags.FLAGS(list(argv))
  except SystemExit as e:  # only absl's help flags exit while flags parse
    if e.code != 1:
      raise
    if help_epilog is not None:
      print(f"\n{help_epilog()}")
    sys.exit(0)
  except (flags.Error, ValueError) as e:  # ValueError: absl's for `--noverbose=3`
    line = None
    if unknown_flag_line is not None and isinstance(e, flags.UnrecognizedFlagError):
      line = unknown_flag_line(e, argv)
    print(line or f"error: {str(e).removeprefix('flag ')}", file=sys.stderr)
    sys.exit(1)


# A command's Ctrl-C (the shell's status for it). Its outputs are written whole or
# not at all (written_whole, the writers' temporary folders).
INTERRUPTED_EXIT_CODE = 130
INTERRUPTED_LINE = (
  "stopped by Ctrl-C; its output is written whole or not at all: run the same command"
  " again to make it"
)


class _CtrlC:
  """SIGINT of a command: a KeyboardInterrupt, remembered. Raised inside a gc
  callback (JAX's), Python only reports it ("Exception ignored in ...
  _xla_gc_callback") and goes on: the command then finished, status 0."""

  def __init__(self) -> None:
    self.seen = False

  def __call__(self, signum: int, frame: Any) -> None:
    del signum, frame
    self.seen = True
    raise KeyboardInterrupt


_CTRL_C = _CtrlC()


def _drop_swallowed_ctrl_c(unraisable: Any, report: Any = sys.unraisablehook) -> None:
  """sys.unraisablehook: a KeyboardInterrupt of _CTRL_C that Python could only
  report is not reported (the command says it stopped once its main returns)."""
  if not (_CTRL_C.seen and isinstance(unraisable.exc_value, KeyboardInterrupt)):
    report(unraisable)


def reports_errors(
  main: Callable[[Sequence[str]], Any], *, handles_ctrl_c: bool = True
) -> Callable[[Sequence[str]], Any]:
  """Wraps a command's main: USER_ERRORS become one line on stderr (exit_with_error),
  and Ctrl-C one line and status 130 (was Python's KeyboardInterrupt traceback),
  also a Ctrl-C that Python swallowed (_CtrlC). `handles_ctrl_c`: False for a
  command with its own SIGINT handler (the launcher's)."""

  def wrapped(argv: Sequence[str]) -> Any:
    if handles_ctrl_c:
      signal.signal(signal.SIGINT, _CTRL_C)
      if getattr(sys.unraisablehook, "func", None) is not _drop_swallowed_ctrl_c:
        sys.unraisablehook = functools.partial(_drop_swallowed_ctrl_c, report=sys.unraisablehook)
    try:
      result = main(argv)
    except USER_ERRORS as e:
      if flags.FLAGS.verbose:
        raise
      exit_with_error(e)
    except KeyboardInterrupt:
      if flags.FLAGS.verbose:
        raise
      _exit_interrupted()
    if _CTRL_C.seen:  # swallowed: its output is written whole, the status says it stopped
      _exit_interrupted()
    return result

  return wrapped


def _exit_interrupted() -> None:
  print(INTERRUPTED_LINE, file=sys.stderr, flush=True)
  sys.exit(INTERRUPTED_EXIT_CODE)


def exit_with_error(error: BaseException) -> None:
  """Prints `error: <message>` as one line on stderr and exits with status 1."""
  print(error_line(error), file=sys.stderr, flush=True)
  sys.exit(1)


def error_line(error: BaseException) -> str:
  """`error: <message>`, on one line: what a command prints for a user error."""
  # Grain appends a note on its traceback filtering to errors it re-raises.
  message = str(error).split("\n--------------------\n")[0]
  return "error: " + (" ".join(message.split()) or type(error).__name__)

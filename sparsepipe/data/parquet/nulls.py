"""Dense and sparse columns that are null in every row: warned per file, refused overall.

A null dense value is stored as 0.0 and a null sparse value gives no id,
as an empty CSV field does, so a column null in every row converts without
an error into a constant (dense) or a feature without ids (sparse): most
likely a column missing upstream (a failed join, a renamed field). Such a
column in one file of several is a warning naming the column and the file
(e.g. a partition written before the column existed), printed once the
last file is read; such a column in every input is an error instead,
raised after the last batch, so the writer drops what it wrote and the
output is left as it was.
"""

from __future__ import annotations

import sys
from typing import Sequence

import pyarrow as pa

# What a column null in every row becomes, by role.
_BECOMES = {"dense": "the constant 0.0", "sparse": "a feature with no id in any example"}


def _describe(role: str, name: str) -> str:
  return f"{role} column '{name}'"


class NullColumns:
  """Counts the nulls of the dense and sparse columns, per input file and over all."""

  def __init__(self, roles: Sequence[tuple[str, str]]):
    self._roles = {name: role for name, role in roles if role in _BECOMES}
    self._file_rows = 0
    self._file_nulls = dict.fromkeys(self._roles, 0)
    self._rows = 0
    self._nulls = dict.fromkeys(self._roles, 0)
    self._warnings: list[str] = []

  def add(self, batch: pa.RecordBatch) -> None:
    """Counts a record batch of the current file."""
    self._file_rows += batch.num_rows
    for name in self._roles:
      self._file_nulls[name] += batch.column(name).null_count

  def end_file(self, path: str) -> None:
    """Ends the file just read: notes its columns null in every row."""
    for name, role in self._roles.items():
      if self._file_rows and self._file_nulls[name] == self._file_rows:
        self._warnings.append(
          f"{_describe(role, name)} is null in all {self._file_rows:,} rows of '{path}'"
          f" (converted as {_BECOMES[role]} there)"
        )
      self._nulls[name] += self._file_nulls[name]
      self._file_nulls[name] = 0
    self._rows += self._file_rows
    self._file_rows = 0

  def check(self, files: Sequence[str]) -> list[str]:
    """After the last file: ValueError naming the first column null in every row of
    every file; else prints (on stderr) and returns the warnings of the files."""
    for name, role in self._roles.items():
      if self._rows and self._nulls[name] == self._rows:
        shown = ", ".join(f"'{f}'" for f in files[:3]) + (", ..." if len(files) > 3 else "")
        flag = "--dense_columns" if role == "dense" else "--sparse_columns"
        raise ValueError(
          f"{_describe(role, name)} is null in all {self._rows:,} rows of the"
          f" {len(files)} input file(s) ({shown}): it would be {_BECOMES[role]}; check"
          f" the input, or leave the column out of {role}_columns ({flag})"
        )
    for warning in self._warnings:
      print(f"warning: {warning}", file=sys.stderr, flush=True)
    return self._warnings

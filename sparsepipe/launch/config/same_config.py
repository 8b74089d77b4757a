"""Every process of a multi-process job trains with the same config.

Each process builds its config from its own command line. Started with a
learning rate that differed on one process, a 2-process job trained and
exited 0 (the checkpoint recording process 0's); with another batch size,
both died in Gloo's all-to-all. `check_same_config` has every process
publish its config in the coordination service's key-value store and
compare it with every other's before anything is made: each process names
the fields that differ, and the job ends with that line (peer_ends.py).
Fields of one host's own resources may differ (LOCAL_FIELDS).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import jax

# + the job's number in this process (train_and_evaluate may run several) and the
# process index: the process's config, flattened, as JSON.
_KEY = "sparsepipe/config/"
_CALLS = itertools.count()
_WAIT_MS = 300_000  # jax.distributed's own initialization timeout

# Fields a process may set for itself: they do not change what is trained.
LOCAL_FIELDS = ("data.num_workers", "compilation_cache_dir")


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
  out: dict[str, Any] = {}
  for key, value in node.items():
    if isinstance(value, dict):
      out.update(_flat(value, f"{prefix}{key}."))
    elif f"{prefix}{key}" not in LOCAL_FIELDS:
      out[f"{prefix}{key}"] = value
  return out


def _differences(mine: dict[str, Any], theirs: dict[str, Any], process: int) -> list[str]:
  here = jax.process_index()
  return [
    f"config.{field} is {theirs.get(field, '(unset)')!r} on process {process},"
    f" {mine.get(field, '(unset)')!r} on process {here}"
    for field in sorted(set(mine) | set(theirs))
    if mine.get(field) != theirs.get(field)
  ]


def check_same_config(config: Any) -> None:
  """ValueError naming the config fields in which another process's config differs
  (see the module docstring); nothing with one process."""
  if jax.process_count() == 1:
    return
  from jax._src import distributed  # pylint: disable=g-import-not-at-top

  client = distributed.global_state.client
  mine = json.loads(json.dumps(_flat(config.to_dict()), default=str))  # tuples as lists
  key = f"{_KEY}{next(_CALLS)}/"
  client.key_value_set(f"{key}{jax.process_index()}", json.dumps(mine))
  for process in range(jax.process_count()):
    if process == jax.process_index():
      continue
    theirs = json.loads(client.blocking_key_value_get(f"{key}{process}", _WAIT_MS))
    differences = _differences(mine, theirs, process)
    if differences:
      more = f" and {len(differences) - 3} more" if len(differences) > 3 else ""
      raise ValueError(
        "the processes of this job were started with other configs: "
        + "; ".join(differences[:3])
        + f"{more} (start every process with the same --config and --config.* flags)"
      )

"""Every process of a multi-process job trains with the same config, workdir
and number of devices.

Each process builds its config from its own command line. Started with a
learning rate that differed on one process, a 2-process job trained and
exited 0 (the checkpoint recording process 0's); with another batch size,
both died in Gloo's all-to-all. `check_same_config` has every process
publish its config in the coordination service's key-value store and
compare it with every other's before anything is made, as a resume compares
its config with the checkpoint's (checkpointing.metadata.config_differences):
each process names the fields that differ, and the job ends with that line
(peer_ends.py).
Fields of one host's own resources may differ (LOCAL_FIELDS). So are the
workdirs (other ones were found at the first save, "No such file or
directory", or as Orbax's "sync_global_devices name mismatch" when one held
another job) and the device counts (numpy's "cannot reshape array").
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

import jax

from sparsepipe.checkpointing.metadata import config_differences
from sparsepipe.checkpointing.metadata import render_config_value
from sparsepipe.checkpointing.metadata import to_json_value
from sparsepipe.launch.distributed import coordination_client

# + the job's number in this process (train_and_evaluate may run several) and the
# process index: the process's config, as JSON.
_KEY = "sparsepipe/config/"
_CALLS = itertools.count()
_WAIT_MS = 300_000  # jax.distributed's own initialization timeout

# Fields a process may set for itself: they do not change what is trained.
LOCAL_FIELDS = ("config.data.num_workers", "config.compilation_cache_dir")


def check_same_config(config: Any, workdir: str) -> None:
  """ValueError naming the workdir, the device count or the config fields in which
  another process differs (see the module docstring); nothing with one process."""
  if jax.process_count() == 1:
    return
  client, here = coordination_client(), jax.process_index()
  mine = {
    "workdir": os.path.abspath(workdir),
    "devices": jax.local_device_count(),
    "config": to_json_value(config),
  }
  key = f"{_KEY}{next(_CALLS)}/"
  client.key_value_set(f"{key}{here}", json.dumps(mine))
  for process in range(jax.process_count()):
    if process != here:
      theirs = json.loads(client.blocking_key_value_get(f"{key}{process}", _WAIT_MS))
      _compare(theirs, mine, process, here)


def _compare(theirs: dict[str, Any], mine: dict[str, Any], process: int, here: int) -> None:
  """ValueError naming the first way `theirs` (process `process`) differs from `mine`."""
  if theirs["workdir"] != mine["workdir"]:
    raise ValueError(
      f"the processes of this job were started with other workdirs: '{theirs['workdir']}'"
      f" on process {process}, '{mine['workdir']}' on process {here} (give every process"
      " the same --workdir, on a filesystem they share)"
    )
  if theirs["devices"] != mine["devices"]:
    raise ValueError(
      f"the processes of this job have other device counts: {theirs['devices']} on process"
      f" {process}, {mine['devices']} on process {here} (every process needs as many;"
      " --cpu_devices sets them on CPU)"
    )
  differences = [
    f"{field} is {render_config_value(a)} on process {process}, {render_config_value(b)}"
    f" on process {here}"
    for field, a, b in config_differences(theirs["config"], mine["config"], LOCAL_FIELDS)
  ]
  if differences:
    more = f" and {len(differences) - 3} more" if len(differences) > 3 else ""
    raise ValueError(
      "the processes of this job were started with other configs: "
      + "; ".join(differences[:3])
      + f"{more} (start every process with the same --config and --config.* flags)"
    )

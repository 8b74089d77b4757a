"""Every process of a multi-process job trains with the same config.

Each process builds its config from its own command line. Started with a
learning rate that differed on one process, a 2-process job trained and
exited 0 (the checkpoint recording process 0's); with another batch size,
both died in Gloo's all-to-all. `check_same_config` has every process
publish its config in the coordination service's key-value store and
compare it with every other's before anything is made, as a resume compares
its config with the checkpoint's (checkpointing.metadata.config_differences):
each process names the fields that differ, and the job ends with that line
(peer_ends.py).
Fields of one host's own resources may differ (LOCAL_FIELDS).
"""

from __future__ import annotations

import itertools
import json
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


def check_same_config(config: Any) -> None:
  """ValueError naming the config fields in which another process's config differs
  (see the module docstring); nothing with one process."""
  if jax.process_count() == 1:
    return
  client, here = coordination_client(), jax.process_index()
  mine = to_json_value(config)
  key = f"{_KEY}{next(_CALLS)}/"
  client.key_value_set(f"{key}{here}", json.dumps(mine))
  for process in range(jax.process_count()):
    if process == here:
      continue
    theirs = json.loads(client.blocking_key_value_get(f"{key}{process}", _WAIT_MS))
    differences = [
      f"{field} is {render_config_value(a)} on process {process}, {render_config_value(b)}"
      f" on process {here}"
      for field, a, b in config_differences(theirs, mine, LOCAL_FIELDS)
    ]
    if differences:
      more = f" and {len(differences) - 3} more" if len(differences) > 3 else ""
      raise ValueError(
        "the processes of this job were started with other configs: "
        + "; ".join(differences[:3])
        + f"{more} (start every process with the same --config and --config.* flags)"
      )

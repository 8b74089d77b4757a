"""The JSON metadata of a checkpoint step and the checks made before restoring.

`RunInfo` is what must match between the run that wrote a checkpoint and the
run that reads it (config, process count, data worker count, mesh axes);
`LoopPosition` is where the pipeline stood. A mismatch is refused with an
`IncompatibleCheckpointError` naming both values, e.g.
"checkpoint at /x step 40 was written with config.model.embedding_dim=16,
current run has 32".

A change of the device, process or data worker count is allowed: arrays
are re-laid out on restore (manager.py, restore/relayout.py), a PipelineState
too when the caller gives a relayout for it (its buffered batches are made
again from `LoopPosition.in_flight`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import os
from typing import Any, Iterable, Mapping

import jax
import numpy as np

from sparsepipe.checkpointing.checkpoint_errors import ConfigMismatchError
from sparsepipe.checkpointing.checkpoint_errors import CorruptCheckpointError
from sparsepipe.checkpointing.checkpoint_errors import IncompatibleCheckpointError

# Version of the step layout written by this module; bump on any change that
# an older reader would misread.
# 2: array fingerprints as per-process partial sums; 3: the array items in
# one Orbax item (step_items.py); 4: LoopPosition.in_flight, and the launcher's
# steps count batches (launch/job/schedule.py).
CHECKPOINT_FORMAT_VERSION = 4

# {stack name: {limit name: value}}, e.g. transforms.get_stack_limits(specs).
FeatureLimits = Mapping[str, Mapping[str, Any]]


def to_json_value(value: Any, name: str = "config") -> Any:
  """`value` as plain JSON types (dicts with str keys, lists, scalars).

  Accepts ml_collections ConfigDicts, mappings, dataclasses, tuples, numpy
  scalars and arrays. Anything else (a function, an object) raises a
  ValueError naming its dotted key: metadata must survive a JSON round trip
  unchanged, or a resumed run would see spurious config differences.
  """
  if hasattr(value, "to_dict") and callable(value.to_dict):
    value = value.to_dict()  # ml_collections ConfigDict / FrozenConfigDict
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
  if isinstance(value, Mapping):
    out = {}
    for key, item in value.items():
      if not isinstance(key, str):
        raise ValueError(f"{name} has a non-string key {key!r}")
      out[key] = to_json_value(item, f"{name}.{key}")
    return out
  if isinstance(value, (list, tuple)):
    return [to_json_value(v, f"{name}[{i}]") for i, v in enumerate(value)]
  if isinstance(value, np.ndarray):
    return to_json_value(value.tolist(), name)
  if isinstance(value, np.generic):
    return value.item()
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  raise ValueError(
    f"{name} is a {type(value).__name__} ({value!r}); checkpoint metadata"
    " holds JSON values only (dicts, lists, str, int, float, bool, None)"
  )


def flatten_config(config: Mapping[str, Any], prefix: str = "config") -> dict:
  """{'config.model.dim': 16, ...}: nested dicts flattened to dotted keys."""
  out = {}
  for key, value in config.items():
    name = f"{prefix}.{key}"
    if isinstance(value, Mapping) and value:
      out.update(flatten_config(value, name))
    else:
      out[name] = value
  return out


@dataclasses.dataclass(frozen=True)
class RunInfo:
  """What must be equal between the writer and the reader of a checkpoint.

  Attributes:
    config: the run's config as plain JSON values (see `to_json_value`).
    mesh_shape: mesh axis name -> size, e.g. {"data": 8}.
    process_count: JAX processes (one Grain iterator state file each).
    data_worker_count: Grain worker processes per JAX process (0: none);
      recorded for people, not checked (batches do not depend on it).
  """

  config: Mapping[str, Any]
  mesh_shape: Mapping[str, int]
  process_count: int
  data_worker_count: int

  @classmethod
  def create(
    cls,
    config: Any,
    mesh: jax.sharding.Mesh,
    *,
    data_worker_count: int,
    process_count: int | None = None,
  ) -> "RunInfo":
    """RunInfo of the current process (process count from jax by default)."""
    return cls(
      config=to_json_value(config),
      mesh_shape={str(k): int(v) for k, v in mesh.shape.items()},
      process_count=int(jax.process_count() if process_count is None else process_count),
      data_worker_count=int(data_worker_count),
    )

  @property
  def device_count(self) -> int:
    return int(math.prod(self.mesh_shape.values()))


@dataclasses.dataclass(frozen=True)
class LoopPosition:
  """Where the training loop stood when the step was saved.

  Attributes:
    pipeline_step: the pipeline step the loop resumes at.
    batches_consumed: batches taken from the data iterator so far.
    pipeline_drained: True when the PipelineState buffers no inputs (before
      the first step, or after a drain).
    in_flight: the global indices of the batches whose inputs the
      PipelineState buffers (step i-1's, step i-2's; None for none), so a
      restore onto another mesh can make their COO buffers again; None when
      unknown (not given, or format 3 and older: only a drained pipeline
      moves to another mesh then).
  """

  pipeline_step: int
  batches_consumed: int
  pipeline_drained: bool = False
  in_flight: tuple[int | None, int | None] | None = None


@dataclasses.dataclass(frozen=True)
class CheckpointMetadata:
  """Everything in a step's "metadata" item except the integrity section.

  `training_data` is the JSON of the trained dataset's manifest
  (data.Manifest.to_dict), so that a step can be evaluated and exported
  once the data is gone; None where the saver gave none (and in steps
  saved by 0.3 and earlier).
  """

  run: RunInfo
  progress: LoopPosition
  feature_limits: FeatureLimits = dataclasses.field(default_factory=dict)
  format_version: int = CHECKPOINT_FORMAT_VERSION
  training_data: Mapping[str, Any] | None = None

  def to_json(self) -> dict[str, Any]:
    return {
      "format_version": self.format_version,
      "config": to_json_value(self.run.config),
      "mesh_shape": dict(self.run.mesh_shape),
      "process_count": self.run.process_count,
      "data_worker_count": self.run.data_worker_count,
      "pipeline_step": self.progress.pipeline_step,
      "batches_consumed": self.progress.batches_consumed,
      "pipeline_drained": self.progress.pipeline_drained,
      "in_flight": None if self.progress.in_flight is None else list(self.progress.in_flight),
      "feature_limits": to_json_value(self.feature_limits, "feature_limits"),
      "training_data": to_json_value(self.training_data, "training_data"),
    }

  @classmethod
  def from_json(cls, data: Any, where: str) -> "CheckpointMetadata":
    """Parses `to_json` output; a missing or mistyped field is corruption."""
    if not isinstance(data, Mapping):
      raise CorruptCheckpointError(f"{where}: metadata is not a JSON object")

    def field(name: str, kind: type | tuple[type, ...]) -> Any:
      if name not in data:
        raise CorruptCheckpointError(f"{where}: metadata has no '{name}'")
      value = data[name]
      if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CorruptCheckpointError(
          f"{where}: metadata '{name}' is {value!r}, not a {getattr(kind, '__name__', kind)}"
        )
      return value

    version = field("format_version", int)
    if version > CHECKPOINT_FORMAT_VERSION:
      raise IncompatibleCheckpointError(
        f"{where} has format_version {version}; this sparsepipe reads"
        f" format_version {CHECKPOINT_FORMAT_VERSION} and older"
      )
    return cls(
      run=RunInfo(
        config=field("config", dict),
        mesh_shape=field("mesh_shape", dict),
        process_count=field("process_count", int),
        data_worker_count=field("data_worker_count", int),
      ),
      progress=LoopPosition(
        pipeline_step=field("pipeline_step", int),
        batches_consumed=field("batches_consumed", int),
        pipeline_drained=field("pipeline_drained", bool),
        in_flight=_in_flight(data, where) if version >= 4 else None,
      ),
      feature_limits=field("feature_limits", dict),
      format_version=version,
      training_data=_training_data(data, where),
    )


def _training_data(data: Mapping[str, Any], where: str) -> Mapping[str, Any] | None:
  value = data.get("training_data")  # absent from steps saved by 0.3 and earlier
  if value is not None and not isinstance(value, dict):
    raise CorruptCheckpointError(
      f"{where}: metadata 'training_data' is {type(value).__name__}, not a JSON object"
    )
  return value


def _in_flight(data: Mapping[str, Any], where: str) -> tuple[int | None, int | None] | None:
  value = data.get("in_flight")
  if value is None:  # not recorded by the saver
    return None
  ok = isinstance(value, list) and len(value) == 2
  if not ok or not all(v is None or (isinstance(v, int) and v >= 0) for v in value):
    raise CorruptCheckpointError(f"{where}: metadata 'in_flight' is {value!r}, not 2 batch indices")
  return value[0], value[1]


class _Unset:
  """A config key absent on one side (see config_differences)."""

  def __repr__(self) -> str:
    return "UNSET"


UNSET = _Unset()


def render_config_value(value: Any) -> str:
  """A value of `config_differences` for a message: JSON, or "(unset)"."""
  return "(unset)" if value is UNSET else json.dumps(value)


def config_differences(
  saved: Mapping[str, Any],
  current: Mapping[str, Any],
  mutable_keys: Iterable[str] = (),
  added_keys: Mapping[str, Any] | None = None,
  path_keys: Iterable[str] = (),
) -> list[tuple[str, Any, Any]]:
  """[(dotted key, saved value, current value)] for keys that differ.

  `mutable_keys` are fnmatch patterns of dotted keys that may change on
  resume (e.g. "config.num_steps", "config.checkpoint.*"); a key missing
  on one side has the value UNSET there. `added_keys` maps dotted keys
  added to the config after some jobs were saved to the value that means
  what those jobs did: a saved config without the key equals that value.
  `path_keys` are dotted keys of paths, equal when they name the same place
  (a relative one taken from the current directory, as the job takes it).
  """
  added = dict(added_keys or {})
  paths = set(path_keys)
  patterns = tuple(mutable_keys)
  flat_saved = flatten_config(to_json_value(saved))
  flat_current = flatten_config(to_json_value(current))
  out = []
  for key in sorted(set(flat_saved) | set(flat_current)):
    if any(fnmatch.fnmatchcase(key, p) for p in patterns):
      continue
    a = flat_saved.get(key, added.get(key, UNSET))
    b = flat_current.get(key, UNSET)
    if key in paths and _same_place(a, b):
      continue
    if a is UNSET or b is UNSET or json.dumps(a) != json.dumps(b):
      out.append((key, a, b))
  return out


def _same_place(a: Any, b: Any) -> bool:
  """Whether two config values are paths (non-empty) to the same place."""
  if not (isinstance(a, str) and isinstance(b, str) and a and b):
    return False
  return os.path.abspath(a) == os.path.abspath(b)


def check_compatible(
  saved: CheckpointMetadata,
  current: RunInfo,
  *,
  where: str,
  mutable_config_keys: Iterable[str] = (),
  added_config_keys: Mapping[str, Any] | None = None,
  path_config_keys: Iterable[str] = (),
) -> None:
  """Raises IncompatibleCheckpointError naming the first kind of difference.

  Checked in order: mesh axis names, then every differing config key
  (ConfigMismatchError: all of them kept, the first few in the message).
  The device, process and data worker counts may differ.
  """
  run = saved.run
  if tuple(run.mesh_shape) != tuple(current.mesh_shape):
    raise IncompatibleCheckpointError(
      f"{where} was written on a mesh with axes {tuple(run.mesh_shape)},"
      f" current mesh has axes {tuple(current.mesh_shape)}"
    )
  diffs = config_differences(
    run.config, current.config, mutable_config_keys, added_config_keys, path_config_keys
  )
  if diffs:
    raise ConfigMismatchError(
      where, [(key, render_config_value(a), render_config_value(b)) for key, a, b in diffs]
    )

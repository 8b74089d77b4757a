"""From an ml_collections config to feature specs, model and optimizers."""

from __future__ import annotations

import math
from typing import Any

import jax
import optax
from jax.sharding import Mesh

from sparsepipe import core
from sparsepipe import pipeline
from sparsepipe import transforms
from sparsepipe.core.rounding import is_power_of_two, round_up
from sparsepipe.launch.config import packing

_EMBEDDING_OPTIMIZERS = {
  "sgd": core.SGDOptimizerSpec,
  "adagrad": core.AdagradOptimizerSpec,
  "adam": core.AdamOptimizerSpec,
  "adagrad_momentum": core.AdagradMomentumOptimizerSpec,
  "ftrl": core.FTRLOptimizerSpec,
  "laprop": core.LaPropOptimizerSpec,
}
_DENSE_OPTIMIZERS = {"sgd": optax.sgd, "adagrad": optax.adagrad, "adam": optax.adam}


def _choice(table: dict[str, Any], name: str, what: str) -> Any:
  if name not in table:
    raise ValueError(f"{what}.name={name!r} is not one of {sorted(table)}")
  return table[name]


def check_combiners(config: Any) -> None:
  """A ValueError naming the first feature whose combiner is not sum, mean or sqrtn.

  The launcher calls it before any data is made; feature_specs calls it too.
  """
  for name, feature in config.features.items():
    core.check_combiner(feature.combiner, f"config.features.{name}.combiner (feature '{name}')")


def check_stacking(config: Any) -> None:
  """A ValueError unless config.stacking is "auto" or "none"."""
  if config.stacking not in ("auto", "none"):
    raise ValueError(f"config.stacking={config.stacking!r} is not 'auto' or 'none'")


def embedding_optimizer_spec(config: Any) -> Any:
  """config.embedding_optimizer -> an embedding optimizer spec."""
  opt = config.embedding_optimizer
  return _choice(_EMBEDDING_OPTIMIZERS, opt.name, "embedding_optimizer")(
    learning_rate=float(opt.learning_rate)
  )


def dense_optimizer(config: Any, mesh: Mesh) -> optax.GradientTransformation:
  """config.dense_optimizer -> optax optimizer with ZeRO-sharded state."""
  opt = config.dense_optimizer
  make = _choice(_DENSE_OPTIMIZERS, opt.name, "dense_optimizer")
  return pipeline.zero_sharded(make(float(opt.learning_rate)), mesh)


def _batch_fields(config: Any) -> tuple[int, int]:
  global_batch = int(config.get("global_batch_size", 0) or 0)
  per_host = int(config.per_host_batch_size or 0)
  if (global_batch > 0) == (per_host > 0) or min(global_batch, per_host) < 0:
    both = global_batch > 0 and per_host > 0
    raise ValueError(
      f"set exactly one of global_batch_size={global_batch} and"
      f" per_host_batch_size={per_host} (0 means unset"
      f"{': e.g. --config.global_batch_size=0 to use per_host_batch_size' if both else ''})"
    )
  return global_batch, per_host


def per_host_batch_size(config: Any, process_count: int) -> int:
  """Examples per batch on each of `process_count` hosts.

  config.per_host_batch_size, or config.global_batch_size / process_count
  (an error naming both if it does not divide).
  """
  global_batch, per_host = _batch_fields(config)
  if per_host:
    return per_host
  per_host, rest = divmod(global_batch, int(process_count))
  if rest:
    raise ValueError(
      f"global_batch_size={global_batch} does not divide over {process_count} processes"
    )
  return per_host


def global_batch_size(config: Any, process_count: int) -> int:
  """Examples per global batch on `process_count` hosts."""
  return per_host_batch_size(config, process_count) * int(process_count)


# A config whose num_steps is unset (None: the dataset config's) trains a new job
# this many epochs of its data.
NEW_JOB_EPOCHS = 10.0


def resolve_run_length(config: Any, saved: Any) -> None:
  """Sets an unset config.num_steps (None) to the run's length: a resumed job's saved
  num_steps and num_epochs (as it was saved: a job saved with the dataset config's
  former 1,000 batches trains on to them), a new job's NEW_JOB_EPOCHS epochs. A
  num_epochs > 0 given sets num_steps as ever (num_steps_of_epochs, once the data's
  size is known). `saved`: the newest checkpoint's config, None for a new job."""
  if config.num_steps is not None or float(config.num_epochs) > 0:
    return
  if saved is None:
    config.num_epochs = NEW_JOB_EPOCHS
  else:
    config.num_steps = int(saved["num_steps"])
    config.num_epochs = float(saved.get("num_epochs", 0.0))


def num_steps_of_epochs(config: Any, epoch_examples: int) -> int:
  """The batches of config.num_epochs epochs of `epoch_examples` (the last one may be partial)."""
  epochs = float(config.num_epochs)
  batch = global_batch_size(config, jax.process_count())
  return max(1, math.ceil(epochs * epoch_examples / batch))


def worst_case_ids_per_partition(
  config: Any, global_batch_size: int, global_device_count: int
) -> int:
  """A limit no batch can exceed: every id of one SparseCore in one partition.

  One SC gets global_batch / N samples of every feature (N global SCs), each
  with at most max_ids ids. It is the starting point when config.limits are
  0 (automatic); FDO then shrinks the limits to what the data needs.
  """
  num_sc = global_device_count * int(config.num_sc_per_device)
  samples = round_up(global_batch_size, num_sc) // num_sc
  ids = sum(int(f.max_ids) for f in config.features.values())
  return max(8, round_up(samples * ids, 8))


def check_sparsecores_divide(config: Any, global_batch_size: int, global_device_count: int) -> None:
  """Raises ValueError unless the mesh's SparseCores are a power of two (the COO layout
  shards ids over them by MOD) that divides `global_batch_size`; names the device
  counts that would do."""
  num_sc = int(config.num_sc_per_device)
  if num_sc < 1:
    raise ValueError(f"config.num_sc_per_device={num_sc} must be >= 1")
  for_devices = int(config.limits.get("for_devices", 0))
  if for_devices and not is_power_of_two(for_devices * num_sc):
    raise ValueError(
      f"config.limits.for_devices={for_devices}: {for_devices} devices x num_sc_per_device="
      f"{num_sc} is not a power of two of SparseCores, so no mesh has it (0: any)"
    )
  cores = global_device_count * num_sc
  if is_power_of_two(cores) and global_batch_size % cores == 0:
    return
  devices = f"{global_device_count} device{'s' if global_device_count > 1 else ''}"
  fits = [
    d
    for d in range(1, global_batch_size // num_sc + 1)
    if is_power_of_two(d * num_sc) and global_batch_size % (d * num_sc) == 0
  ]
  other_devices = ""
  if fits:  # a resumed job cannot change its batch, only where it runs
    counts = ", ".join(map(str, fits[:8])) + ("" if len(fits) <= 8 else ", ...")
    noun = "device" if fits == [1] else "devices"
    other_devices = f", or run on {counts} {noun} (a resumed job keeps its batch size)"
  if not is_power_of_two(cores):
    raise ValueError(
      f"the mesh ({devices} x num_sc_per_device={num_sc}) has {cores} SparseCores, not a"
      " power of two: ids are sharded over them by MOD, so the device count times"
      f" num_sc_per_device must be 1, 2, 4, 8, ...{other_devices.replace(', or', ':')}"
    )
  raise ValueError(
    f"global_batch_size={global_batch_size} is not a multiple of the"
    f" {cores} SparseCores of the mesh ({devices}"
    f" x num_sc_per_device={num_sc}): each takes an equal share of every batch; choose a"
    f" multiple of {cores}{other_devices}"
  )


def build_feature_specs(
  config: Any,
  *,
  global_batch_size: int,
  global_device_count: int,
  worst_case_limits: bool = False,
) -> dict[str, core.FeatureSpec]:
  """Prepared (and, with config.stacking='auto', stacked) feature specs.

  One table per configured feature, all with model.embedding_dim, initial
  limits from config.limits, 0 meaning the worst case (FDO tunes them later);
  `worst_case_limits` ignores config.limits (the eval step: any batch fits).
  COO buffers are suggested no larger than a batch can fill
  (transforms.bound_coo_buffers_by_the_batch). The table layout does not
  depend on the limits.
  """
  check_sparsecores_divide(config, global_batch_size, global_device_count)
  num_sc = int(config.num_sc_per_device)
  dim = int(config.model.embedding_dim)
  worst = worst_case_ids_per_partition(config, global_batch_size, global_device_count)
  limits = config.limits
  max_ids = (not worst_case_limits and int(limits.max_ids_per_partition)) or worst
  max_unique = (not worst_case_limits and int(limits.max_unique_ids_per_partition)) or worst
  optimizer = embedding_optimizer_spec(config)
  check_combiners(config)
  specs = {}
  for name, feature in config.features.items():
    table = core.TableSpec(
      name=name,
      vocabulary_size=int(feature.vocab_size),
      embedding_dim=dim,
      combiner=str(feature.combiner),
      max_ids_per_partition=max_ids,
      max_unique_ids_per_partition=max_unique,
      optimizer=optimizer,
    )
    specs[name] = core.FeatureSpec(
      name=name,
      table_spec=table,
      input_shape=(global_batch_size, int(feature.max_ids)),
      output_shape=(global_batch_size, dim),
    )
  check_stacking(config)
  if config.stacking == "auto":
    specs = transforms.auto_stack_tables(
      specs,
      global_device_count,
      num_sc,
      stack_to_max_ids_per_partition=lambda *_: max_ids,
      stack_to_max_unique_ids_per_partition=lambda *_: max_unique,
    )
  specs = transforms.prepare_feature_specs_for_training(specs, global_device_count, num_sc)
  if not worst_case_limits:
    for_devices = int(limits.get("for_devices", 0))  # absent in configs of 0.2
    specs = _carried_to_mesh(specs, for_devices, global_device_count, num_sc)
  return transforms.bound_coo_buffers_by_the_batch(specs, num_sc, global_device_count)


def _carried_to_mesh(specs: Any, for_devices: int, global_device_count: int, num_sc: int) -> Any:
  """Limits set for `for_devices` devices made valid on this mesh (as a resize does).

  With fewer devices each partition takes the ids of several: the limits
  grow by the bounds of transforms.carry_stack_limits, at most to the worst
  case; with more they stay. 0 or this device count: unchanged.
  """
  if for_devices in (0, global_device_count):
    return specs
  carried = transforms.carry_stack_limits(
    transforms.get_stack_limits(specs),
    specs,
    saved_global_device_count=for_devices,
    global_device_count=global_device_count,
    num_sc_per_device=num_sc,
  )
  return transforms.apply_stack_limits(specs, carried)


def input_config(
  config: Any, data_dir: str, process_count: int | None = None
) -> transforms.InputConfig:
  """This host's input settings; process_count defaults to jax.process_count()."""
  if process_count is None:
    process_count = jax.process_count()
  return transforms.InputConfig(
    data_dir=data_dir,
    per_host_batch_size=per_host_batch_size(config, process_count),
    seed=int(config.seed),
    shuffle=bool(config.data.shuffle),
    shuffle_window=packing.shuffle_window(config.data.shuffle_window),
    num_workers=int(config.data.num_workers),
    skip_corrupt=bool(config.data.skip_corrupt),
    num_sc_per_device=int(config.num_sc_per_device),
    allow_id_dropping=bool(config.data.allow_id_dropping),
  )

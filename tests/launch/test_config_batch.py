"""global_batch_size or per_host_batch_size: the batch a job reads on any process count."""

import jax
import pytest

from sparsepipe.launch.config import config_specs
from sparsepipe.launch.config.checks import check_config
from sparsepipe.launch.config.shipped import demo


def _config(global_batch, per_host):
  config = demo.get_config()
  config.global_batch_size = global_batch
  config.per_host_batch_size = per_host
  return config


def test_per_host_batch_size_fixes_the_share_of_each_host():
  config = _config(0, 128)
  assert [config_specs.per_host_batch_size(config, n) for n in (1, 2, 4)] == [128] * 3
  assert [config_specs.global_batch_size(config, n) for n in (1, 2, 4)] == [128, 256, 512]


def test_global_batch_size_is_the_same_on_any_process_count():
  config = _config(256, 0)
  assert [config_specs.per_host_batch_size(config, n) for n in (1, 2, 4)] == [256, 128, 64]
  assert [config_specs.global_batch_size(config, n) for n in (1, 2, 4)] == [256] * 3
  assert config_specs.input_config(config, "/data", process_count=4).per_host_batch_size == 64
  # Without process_count: this JAX process's count (1 here).
  assert config_specs.input_config(config, "/data").per_host_batch_size == 256


def test_the_shipped_default_is_global():
  config = demo.get_config()
  assert (config.global_batch_size, config.per_host_batch_size) == (128, 0)
  assert [config_specs.global_batch_size(config, n) for n in (1, 2)] == [128, 128]


@pytest.mark.parametrize("global_batch, per_host", [(256, 128), (0, 0), (-8, 0)])
def test_exactly_one_batch_field_must_be_set(global_batch, per_host):
  with pytest.raises(
    ValueError,
    match=(
      rf"set exactly one of global_batch_size={global_batch} and"
      rf" per_host_batch_size={per_host} \(0 means unset"
    ),
  ):
    config_specs.per_host_batch_size(_config(global_batch, per_host), 1)


def test_both_batch_fields_set_say_how_to_unset_one():
  with pytest.raises(ValueError) as refused:
    config_specs.per_host_batch_size(_config(128, 64), 1)
  assert str(refused.value) == (
    "set exactly one of global_batch_size=128 and per_host_batch_size=64 (0 means unset:"
    " e.g. --config.global_batch_size=0 to use per_host_batch_size)"
  )


def test_a_global_batch_that_does_not_divide_is_refused():
  with pytest.raises(ValueError, match=r"global_batch_size=100 does not divide over 3 processes"):
    config_specs.global_batch_size(_config(100, 0), 3)


def _sparsecore_error(batch: int, devices: int) -> str:
  with pytest.raises(ValueError) as refused:
    config_specs.build_feature_specs(
      _config(batch, 0), global_batch_size=batch, global_device_count=devices
    )
  return str(refused.value)


def test_a_batch_the_sparsecores_cannot_share_names_the_config_fields():
  assert _sparsecore_error(15, 2) == (
    "global_batch_size=15 is not a multiple of the 4 SparseCores of the mesh (2 devices x"
    " num_sc_per_device=2): each takes an equal share of every batch; choose a multiple of 4"
  )
  with pytest.raises(ValueError) as refused:  # one device, before any data (check_config)
    check_config(_config(127, 0), jax.make_mesh((1,), ("data",)))
  assert str(refused.value) == (
    "global_batch_size=127 is not a multiple of the 2 SparseCores of the mesh (1 device x"
    " num_sc_per_device=2): each takes an equal share of every batch; choose a multiple of 2"
  )
  # A job of batch 128 resumed on 3 devices cannot change its batch: the devices it fits.
  assert _sparsecore_error(128, 3) == (
    "the mesh (3 devices x num_sc_per_device=2) has 6 SparseCores, not a power of two: ids are"
    " sharded over them by MOD, so the device count times num_sc_per_device must be 1, 2, 4,"
    " 8, ...: run on 1, 2, 4, 8, 16, 32, 64 devices (a resumed job keeps its batch size)"
  )
  # The device counts named are those that run: 3 and 6 divide 12 but were refused then.
  assert _sparsecore_error(12, 4) == (
    "global_batch_size=12 is not a multiple of the 8 SparseCores of the mesh (4 devices x"
    " num_sc_per_device=2): each takes an equal share of every batch; choose a multiple of 8,"
    " or run on 1, 2 devices (a resumed job keeps its batch size)"
  )
  assert _sparsecore_error(6, 4).endswith(
    ", or run on 1 device (a resumed job keeps its batch size)"
  )


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("num_sc_per_device", 0, "config.num_sc_per_device=0 must be >= 1"),
    (
      "limits.for_devices",
      3,
      "config.limits.for_devices=3: 3 devices x num_sc_per_device=2 is not a power of two of"
      " SparseCores, so no mesh has it (0: any)",
    ),
    ("limits.for_devices", -1, "config.limits.for_devices=-1 must be >= 0 (0: any)"),
    ("seed", -1, "config.seed=-1 must be >= 0"),
    ("fdo.compile_ahead", 2.0, "config.fdo.compile_ahead=2 must be <= 1 (a fraction of a segment)"),
    ("fdo.compile_ahead", float("nan"), "config.fdo.compile_ahead=nan must be a finite number"),
    (
      "fdo.steps_per_doubling",
      -1,
      "config.fdo.steps_per_doubling=-1 must be >= 0 (0: exact limits)",
    ),
    ("log_every_steps", 0, "config.log_every_steps=0 must be >= 1 (batches)"),
    ("eval.every_steps", -1, "config.eval.every_steps=-1 must be >= 0 (0: only at the end)"),
    (
      "synthetic.eval_examples",
      -1,
      "config.synthetic.eval_examples=-1 must be >= 0 (0: no eval split)",
    ),
    ("synthetic.records_per_shard", 0, "config.synthetic.records_per_shard=0 must be >= 1"),
  ],
)
def test_values_the_job_would_refuse_late_are_named_before_anything_is_made(field, value, message):
  """Each of these once failed after the data and job.json were made (num_sc_per_device=0:
  a ZeroDivisionError traceback; steps_per_doubling=-1: at the first retune, after 4
  batches), or named no field (seed=-1: numpy's 'expected non-negative integer')."""
  config = _config(128, 0)
  with config.unlocked():
    node, _, key = field.rpartition(".")
    (config[node] if node else config)[key] = value
  with pytest.raises(ValueError) as refused:
    check_config(config, jax.make_mesh((1,), ("data",)))
  assert str(refused.value) == message


def test_a_nan_zipf_exponent_is_named():
  config = _config(128, 0)
  name = sorted(config.features)[0]
  config.features[name].zipf_exponent = float("nan")
  with pytest.raises(ValueError) as refused:
    check_config(config, jax.make_mesh((1,), ("data",)))
  assert str(refused.value) == f"config.features.{name}.zipf_exponent=nan must be a finite number"

"""carry_stack_limits: FDO limits of G devices made valid for G' devices (issue 9)."""

import numpy as np
import pytest

from sparsepipe import data
from sparsepipe import transforms
from sparsepipe.launch.config import config_specs
from sparsepipe.launch.job import training_data
from sparsepipe.launch.job import fdo as fdo_retune
from sparsepipe.launch.config.shipped import demo

S = 2
GLOBAL_BATCH = 128
TUNED_BATCHES = 4
LATER_BATCHES = 8
STACK = "category_history_item_user"


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory):
  """The demo's features and generator, (4 + 8) global batches of the demo."""
  path = str(tmp_path_factory.mktemp("demo") / "data")
  data.write_synthetic(
    path,
    training_data.synthetic_features(demo.get_config()),
    num_examples=GLOBAL_BATCH * (TUNED_BATCHES + LATER_BATCHES),
    num_dense=4,
    seed=0,
    examples_per_record=1,
    max_records_per_shard=512,
  )
  return path


def _specs(devices):
  return config_specs.build_feature_specs(
    demo.get_config(), global_batch_size=GLOBAL_BATCH, global_device_count=devices
  )


def _pipeline(path, specs, devices, **kw):
  config = transforms.InputConfig(path, GLOBAL_BATCH, num_sc_per_device=S, shuffle=False, **kw)
  return transforms.make_host_input(
    config,
    specs,
    local_device_count=devices,
    global_device_count=devices,
    process_index=0,
    process_count=1,
  )


def _tuned(path, devices):
  """The demo's specs on `devices` after an FDO retune over TUNED_BATCHES batches."""
  specs = _specs(devices)
  it = _pipeline(path, specs, devices)
  for _ in range(TUNED_BATCHES):
    next(it)
  stats = fdo_retune.scale_stats(it.stats_totals().as_stats(), 1.5)
  return transforms.update_preprocessing_parameters(specs, stats, S, devices)


def _observed(path, specs, devices, num_batches):
  """Per stack, the largest M, U and Q any of the first num_batches batches needs."""
  it = _pipeline(path, specs, devices)
  for _ in range(num_batches):
    next(it)
  stats = it.stats_totals().as_stats()
  return {
    stack: (
      int(np.max(stats.max_ids_per_partition[stack])),
      int(np.max(stats.max_unique_ids_per_partition[stack])),
      int(np.max(stats.required_buffer_size_per_sc[stack])) * S,
    )
    for stack in stats.max_ids_per_partition
  }


def test_the_issue_reproduction_fails_with_the_saved_limits(demo_data):
  saved = transforms.get_stack_limits(_tuned(demo_data, 8))
  specs4 = transforms.apply_stack_limits(_specs(4), saved)
  with pytest.raises(
    transforms.PreprocessingError,
    match=(
      rf"stack '{STACK}': suggested_coo_buffer_size_per_device=\d+ exceeds the theoretical"
      r" maximum \d+"
    ),
  ):
    next(_pipeline(demo_data, specs4, 4))


@pytest.mark.parametrize("old, new", [(8, 4), (8, 1), (2, 8), (4, 8)])
def test_carried_limits_preprocess_the_same_data_on_the_new_device_count(demo_data, old, new):
  saved = transforms.get_stack_limits(_tuned(demo_data, old))
  carried = transforms.carry_stack_limits(
    saved, _specs(new), saved_global_device_count=old, global_device_count=new, num_sc_per_device=S
  )
  specs = transforms.apply_stack_limits(_specs(new), carried)
  # Every batch, the tuned ones and later ones, preprocesses within the limits.
  observed = _observed(demo_data, specs, new, TUNED_BATCHES + LATER_BATCHES)
  for stack, (m, u, q) in observed.items():
    limits = carried[stack]
    assert m <= limits["max_ids_per_partition"]
    assert u <= limits["max_unique_ids_per_partition"]
    assert q <= limits["suggested_coo_buffer_size_per_device"]
    assert limits["suggested_coo_buffer_size_per_device"] <= (
      transforms.compute_theoretical_max_coo_buffer_size(limits["max_ids_per_partition"], new, S)
    )


def _limits(m, u, q):
  return {
    "max_ids_per_partition": m,
    "max_unique_ids_per_partition": u,
    "suggested_coo_buffer_size_per_device": q,
  }


def test_fewer_devices_scale_per_partition_limits_by_r_squared_and_the_buffer_by_r():
  # 8 -> 4 devices, N 16 -> 8: r = 2. Worst case per SC: 16 samples x 13 ids = 208.
  carried = transforms.carry_stack_limits(
    {STACK: _limits(24, 20, 464)},
    _specs(4),
    saved_global_device_count=8,
    global_device_count=4,
    num_sc_per_device=S,
  )
  assert carried == {STACK: _limits(96, 80, 928)}


def test_limits_are_bounded_by_the_batch_and_the_theoretical_maximum():
  # 8 -> 1 device, N 16 -> 2: r = 8; 64 samples x 13 ids = 832 ids per SC at most.
  carried = transforms.carry_stack_limits(
    {STACK: _limits(24, 20, 464)},
    _specs(1),
    saved_global_device_count=8,
    global_device_count=1,
    num_sc_per_device=S,
  )
  # M = min(24 * 64, 832); U = min(20 * 64, M); Q = min(464 * 8, round8(832) * 2 * 2).
  assert carried == {STACK: _limits(832, 832, 3328)}


def test_more_devices_keep_per_partition_limits_and_pad_the_buffer():
  # 4 -> 8 devices, N 8 -> 16: per SC 232 + 8 * (16 - 8) = 296, times S.
  carried = transforms.carry_stack_limits(
    {STACK: _limits(24, 20, 464)},
    _specs(8),
    saved_global_device_count=4,
    global_device_count=8,
    num_sc_per_device=S,
  )
  assert carried == {STACK: _limits(24, 20, 592)}
  # Bounded by T = round8(M) * S * N = 8 * 2 * 16 when M is small.
  carried = transforms.carry_stack_limits(
    {STACK: _limits(5, 5, 464)},
    _specs(8),
    saved_global_device_count=4,
    global_device_count=8,
    num_sc_per_device=S,
  )
  assert carried == {STACK: _limits(5, 5, 256)}


def test_same_device_count_and_no_suggested_buffer_keep_the_limits():
  saved = {STACK: _limits(24, 20, 464)}
  assert (
    transforms.carry_stack_limits(
      saved, _specs(8), saved_global_device_count=8, global_device_count=8, num_sc_per_device=S
    )
    == saved
  )
  carried = transforms.carry_stack_limits(
    {STACK: _limits(24, 20, None)},
    _specs(4),
    saved_global_device_count=8,
    global_device_count=4,
    num_sc_per_device=S,
  )
  assert carried == {STACK: _limits(96, 80, None)}


def test_other_stacks_or_bad_device_counts_are_refused():
  with pytest.raises(
    ValueError,
    match=(
      r"saved limits are for stacks \['user'\] but the feature specs for 4 devices have"
      rf" stacks \['{STACK}'\]: the stacking changed, so the limits cannot be carried over"
    ),
  ):
    transforms.carry_stack_limits(
      {"user": _limits(8, 8, None)},
      _specs(4),
      saved_global_device_count=8,
      global_device_count=4,
      num_sc_per_device=S,
    )
  with pytest.raises(
    transforms.PreprocessingError,
    match=(r"global_device_count\*num_sc_per_device=3\*2=6 SparseCores is not a power of two"),
  ):
    transforms.carry_stack_limits(
      {STACK: _limits(8, 8, None)},
      _specs(4),
      saved_global_device_count=3,
      global_device_count=4,
      num_sc_per_device=S,
    )


def _maxima(it):
  """{field: the stack's maximum} of an iterator's FDO totals."""
  return {f: int(v[STACK].max()) for f, v in it.stats_totals().maxima.items()}


@pytest.mark.parametrize("devices", [2, 8])
def test_carried_stats_maxima_bound_the_same_batches_on_the_new_layout(demo_data, devices):
  """The running maxima of 4 devices, carried to 2 or 8: the same batches give no more there."""
  saved = _pipeline(demo_data, _specs(4), 4)
  for _ in range(TUNED_BATCHES):
    next(saved)
  specs = _specs(devices)
  bound = transforms.most_ids_per_sparsecore(specs, devices * S)[STACK]
  carried = _pipeline(demo_data, specs, devices)
  carried.set_state(saved.get_state())  # as a restore does: the saved layout's maxima
  carried.carry_stats_maxima(
    lambda field, stack, value: transforms.carry_stats_maximum(
      field,
      value,
      bound=bound,
      saved_global_device_count=4,
      global_device_count=devices,
      num_sc_per_device=S,
    )
  )
  totals = carried.stats_totals()
  assert totals.batches == TUNED_BATCHES and carried.next_batch == TUNED_BATCHES
  for field, arrays in totals.maxima.items():  # every entry, in this layout's shape
    assert arrays[STACK].shape == getattr(next(carried).stats, field)[STACK].shape
  fresh = _pipeline(demo_data, specs, devices)
  for _ in range(TUNED_BATCHES):
    next(fresh)
  measured, carried_maxima = (
    _maxima(fresh),
    {f: int(v[STACK].max()) for f, v in totals.maxima.items()},
  )
  for field in measured:
    assert measured[field] <= carried_maxima[field], (field, measured, carried_maxima)
  if devices == 8:  # more SCs: partition counts do not grow
    assert carried_maxima["max_ids_per_partition"] == _maxima(saved)["max_ids_per_partition"]


def test_carried_stats_maximum_arithmetic():
  args = dict(bound=1000, saved_global_device_count=8, num_sc_per_device=2)
  # 16 -> 4 SCs: r = 4, partition counts x16, a SC's buffer x4.
  assert (
    transforms.carry_stats_maximum("max_ids_per_partition", 5, global_device_count=2, **args) == 80
  )
  assert (
    transforms.carry_stats_maximum("required_buffer_size_per_sc", 40, global_device_count=2, **args)
    == 160
  )
  # Clamped by what one SC's samples can hold.
  assert (
    transforms.carry_stats_maximum(
      "max_unique_ids_per_partition", 100, global_device_count=2, **args
    )
    == 1000
  )
  # 16 -> 32 SCs: counts stay, a SC's buffer may gain 8 per extra partition.
  assert (
    transforms.carry_stats_maximum("max_ids_per_partition", 5, global_device_count=16, **args) == 5
  )
  assert (
    transforms.carry_stats_maximum(
      "required_buffer_size_per_sc", 40, global_device_count=16, **args
    )
    == 40 + 8 * 16
  )
  assert (
    transforms.carry_stats_maximum("max_ids_per_partition", 5, global_device_count=8, **args) == 5
  )

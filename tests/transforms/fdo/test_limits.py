"""get_stack_limits / apply_stack_limits: the COO limits of every stack."""

import pytest

from sparsepipe import core
from sparsepipe import transforms


def _specs():
  def feature(name, vocab):
    table = core.TableSpec(name=name, vocabulary_size=vocab, embedding_dim=8)
    return core.FeatureSpec(name, table, (64, 2), (64, 8))

  specs = {"a": feature("a", 100), "b": feature("b", 300), "c": feature("c", 50)}
  specs = transforms.stack_tables(specs, ["a", "b"], 2, 2)
  return transforms.prepare_feature_specs_for_training(specs, 2, 2)


def test_get_stack_limits_reads_every_stack():
  limits = transforms.get_stack_limits(_specs())
  assert list(limits) == ["a_b", "c"]
  assert limits["c"] == {
    "max_ids_per_partition": 256,
    "max_unique_ids_per_partition": 256,
    "suggested_coo_buffer_size_per_device": None,
  }


def test_apply_stack_limits_sets_tables_and_stacked_spec_and_keeps_the_rest():
  specs = _specs()
  new_limits = {
    "a_b": {
      "max_ids_per_partition": 40,
      "max_unique_ids_per_partition": 24,
      "suggested_coo_buffer_size_per_device": 512,
    },
    "c": transforms.get_stack_limits(specs)["c"],
  }
  updated = transforms.apply_stack_limits(specs, new_limits)
  assert transforms.get_stack_limits(updated) == new_limits
  for name in ("a", "b"):
    table = updated[name].table_spec
    assert (table.max_ids_per_partition, table.max_unique_ids_per_partition) == (40, 24)
    assert table.suggested_coo_buffer_size_per_device == 512
    # Nothing but the limits changed.
    assert table.setting_in_stack == specs[name].table_spec.setting_in_stack
    assert updated[name].id_transformation == specs[name].id_transformation
  assert updated["c"] == specs["c"]
  # Round trip: the limits read back reproduce equal (hashable) specs.
  assert transforms.apply_stack_limits(specs, transforms.get_stack_limits(specs)) == specs


def test_apply_stack_limits_refuses_limits_of_other_stacks():
  with pytest.raises(
    ValueError,
    match=r"limits are for stacks \['a', 'b', 'c'\] but the feature specs have"
    r" stacks \['a_b', 'c'\]",
  ):
    limit = {
      "max_ids_per_partition": 8,
      "max_unique_ids_per_partition": 8,
      "suggested_coo_buffer_size_per_device": None,
    }
    transforms.apply_stack_limits(_specs(), {"a": limit, "b": limit, "c": limit})


def test_apply_stack_limits_refuses_a_zero_limit():
  limits = transforms.get_stack_limits(_specs())
  limits["c"] = dict(limits["c"], max_ids_per_partition=0)
  with pytest.raises(ValueError, match=r"stack 'c': max_ids_per_partition=0 must be >= 1"):
    transforms.apply_stack_limits(_specs(), limits)


def test_unprepared_specs_are_refused():
  table = core.TableSpec(name="t", vocabulary_size=10, embedding_dim=4)
  with pytest.raises(
    transforms.StackingError,
    match=r"feature 'f' \(table 't'\) is not prepared:"
    r" call prepare_feature_specs_for_training first",
  ):
    transforms.get_stack_limits({"f": core.FeatureSpec("f", table, (8, 1), (8, 4))})

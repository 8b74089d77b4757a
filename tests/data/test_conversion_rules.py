"""manifest_differences: the one wording of what differs between two datasets, which
resume, the eval-data check and serving all use."""

from sparsepipe.data.conversion_rules import manifest_differences
from sparsepipe.data.schema import ExampleSchema, SparseFeatureSchema


def _schema(vocab: dict[str, int], dense=("age",), weighted=()) -> ExampleSchema:
  sparse = tuple(SparseFeatureSchema(n, v, weighted=n in weighted) for n, v in vocab.items())
  return ExampleSchema(num_dense=len(dense), sparse=sparse, dense_names=tuple(dense))


CSV = {"converter": "sparsepipe.data.csv", "dense_transform": "none"}


def test_datasets_made_alike_have_no_differences_and_parquet_has_the_csv_rules():
  schema = _schema({"a": 8, "b": 8})
  parquet = {**CSV, "converter": "sparsepipe.data.parquet"}
  assert manifest_differences((CSV, schema), (CSV, schema), a_name="x", b_name="y") == []
  assert manifest_differences((parquet, schema), (CSV, schema), a_name="x", b_name="y") == []


def test_every_kind_of_difference_is_named_with_both_values_and_vocab_sizes_past_three_counted():
  now = _schema({"a": 9, "b": 9, "c": 9, "d": 9, "w": 4, "x": 4}, weighted=("w",))
  trained = _schema({"a": 8, "b": 8, "c": 8, "d": 8, "w": 4, "y": 4})
  differences = manifest_differences(
    ({**CSV, "converter": "sparsepipe.data.criteo", "hash": "blake2b"}, now),
    (CSV, trained),
    a_name="now",
    b_name="trained on",
  )
  assert differences == [
    "made by: 'sparsepipe.data.criteo' (now), 'sparsepipe.data.csv' (trained on)",
    "features the other lacks: ['x'] (now), ['y'] (trained on)",
    "feature 'a' vocab_size: 9 (now), 8 (trained on)",
    "feature 'b' vocab_size: 9 (now), 8 (trained on)",
    "feature 'c' vocab_size: 9 (now), 8 (trained on)",
    "the vocab_size of 1 more features",
    "feature 'w' weighted: True (now), False (trained on)",
    "dense_transform: 'none' (now), {'age': 'none'} (trained on)",
    "hash: 'blake2b' (now), None (trained on)",
  ]


def test_dense_columns_of_another_count_or_name_are_named_and_their_transforms_compared():
  a, b = _schema({"a": 8}, dense=("age", "price")), _schema({"a": 8}, dense=("age",))
  assert manifest_differences((CSV, a), (CSV, b), a_name="eval", b_name="train") == [
    "dense columns: ['age', 'price'] (eval), ['age'] (train)"
  ]
  log1p = {**CSV, "dense_transform": {"age": "log1p"}}
  assert manifest_differences((log1p, b), (CSV, b), a_name="eval", b_name="train") == [
    "dense_transform: {'age': 'log1p'} (eval), {'age': 'none'} (train)"
  ]

"""What an example holds: a label, dense floats and named sparse id features.

The schema is stored in every dataset manifest (JSON) and is what the record
codec validates records against, so a reader never has to guess sizes.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence

# Ids are stored as int32 (the COO buffers are int32 too).
MAX_VOCAB_SIZE = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class SparseFeatureSchema:
  """One sparse feature: ragged int ids in [0, vocab_size), optional weights."""

  name: str
  vocab_size: int
  weighted: bool = False

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f"sparse feature name must be a non-empty string, got {self.name!r}")
    if not 1 <= int(self.vocab_size) <= MAX_VOCAB_SIZE:
      raise ValueError(
        f"sparse feature '{self.name}': vocab_size={self.vocab_size} must be"
        f" in [1, {MAX_VOCAB_SIZE}]"
      )
    object.__setattr__(self, "vocab_size", int(self.vocab_size))
    object.__setattr__(self, "weighted", bool(self.weighted))

  def to_dict(self) -> dict[str, Any]:
    return {"name": self.name, "vocab_size": self.vocab_size, "weighted": self.weighted}

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> SparseFeatureSchema:
    return cls(name=d["name"], vocab_size=d["vocab_size"], weighted=d.get("weighted", False))


@dataclasses.dataclass(frozen=True)
class ExampleSchema:
  """Names and sizes of an example's parts.

  Attributes:
    num_dense: length of the float32 dense vector (0 allowed).
    sparse: the sparse features, in record order.
    dense_names: optional names of the dense columns (empty, or num_dense names).
    label_name: name of the label column (documentation only).
  """

  num_dense: int
  sparse: tuple[SparseFeatureSchema, ...]
  dense_names: tuple[str, ...] = ()
  label_name: str = "label"

  def __post_init__(self):
    object.__setattr__(self, "sparse", tuple(self.sparse))
    object.__setattr__(self, "dense_names", tuple(self.dense_names))
    if int(self.num_dense) < 0:
      raise ValueError(f"num_dense={self.num_dense} must be >= 0")
    object.__setattr__(self, "num_dense", int(self.num_dense))
    if self.dense_names and len(self.dense_names) != self.num_dense:
      raise ValueError(
        f"dense_names has {len(self.dense_names)} names but num_dense={self.num_dense}"
      )
    for f in self.sparse:
      if not isinstance(f, SparseFeatureSchema):
        raise TypeError(f"sparse features must be SparseFeatureSchema, got {type(f).__name__}")
    names = [f.name for f in self.sparse]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
      raise ValueError(f"duplicate sparse feature names: {dupes}")

  @property
  def feature_names(self) -> tuple[str, ...]:
    return tuple(f.name for f in self.sparse)

  def feature(self, name: str) -> SparseFeatureSchema:
    for f in self.sparse:
      if f.name == name:
        return f
    raise KeyError(f"no sparse feature '{name}' in schema (has {list(self.feature_names)})")

  def to_dict(self) -> dict[str, Any]:
    return {
      "num_dense": self.num_dense,
      "dense_names": list(self.dense_names),
      "label_name": self.label_name,
      "sparse": [f.to_dict() for f in self.sparse],
    }

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> ExampleSchema:
    return cls(
      num_dense=d["num_dense"],
      sparse=tuple(SparseFeatureSchema.from_dict(f) for f in d["sparse"]),
      dense_names=tuple(d.get("dense_names", ())),
      label_name=d.get("label_name", "label"),
    )

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> ExampleSchema:
    return cls.from_dict(json.loads(text))


def make_schema(
  num_dense: int,
  vocab_sizes: Mapping[str, int],
  *,
  weighted: Sequence[str] = (),
  dense_names: Sequence[str] = (),
  label_name: str = "label",
) -> ExampleSchema:
  """Convenience: a schema from {feature name: vocab size} (insertion order kept)."""
  unknown = sorted(set(weighted) - set(vocab_sizes))
  if unknown:
    raise ValueError(f"weighted features {unknown} are not among the sparse features")
  return ExampleSchema(
    num_dense=num_dense,
    sparse=tuple(
      SparseFeatureSchema(name, size, name in weighted) for name, size in vocab_sizes.items()
    ),
    dense_names=tuple(dense_names),
    label_name=label_name,
  )

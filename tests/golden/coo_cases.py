"""Shared COO test cases: JSON configs, their inputs, and the reference oracle.

A case is a JSON-able dict (devices, tables, features, stacking plan, input
forms, weights, limits, id dropping, FDO). `draw_raw` draws its data
(flat ids, row lengths, weights per feature) from the case's seed;
`as_inputs` turns that into our input forms and the reference's;
`run_case` stacks and preprocesses with sparsepipe, `run_reference` (only
with jax-tpu-embedding installed) does the same with the reference. The
golden fixtures (make_golden.py) store case, raw data and the reference's
result, so the normal suite compares without the reference.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np

from sparsepipe import core
from sparsepipe import transforms as T
from sparsepipe.data.ragged import RaggedBatch

INT_MAX = 2**31 - 1
FORMS = ("ragged", "ragged64", "dense", "columnar", "list")
BUFFER_FIELDS = ("lhs_row_pointers", "lhs_embedding_ids", "lhs_sample_ids", "lhs_gains")
STATS_FIELDS = (
  "max_ids_per_partition",
  "max_unique_ids_per_partition",
  "required_buffer_size_per_sc",
)


def random_case(rng: np.random.Generator) -> dict:
  """A random valid case (limits are only exceeded where ids may be dropped)."""
  s = int(rng.choice([2, 4]))
  g = int(rng.choice([1, 2, 4, 8]))
  l = int(rng.choice([d for d in (1, 2, 4, 8) if g % d == 0]))
  n_tables = int(rng.integers(1, 5))
  combiner = str(rng.choice(["sum", "mean", "sqrtn"]))
  tables = []
  for t in range(n_tables):
    tables.append(
      {
        "name": f"t{t}",
        # Large vocabularies need 64-bit sort keys.
        "vocab": int(rng.choice([5, 17, 64, 300, 1000, 5000, 3_000_000, 300_000_000])),
        "dim": int(rng.choice([8, 16])) if rng.random() < 0.3 else 8,
        "combiner": combiner if rng.random() < 0.8 else str(rng.choice(["sum", "mean", "sqrtn"])),
      }
    )
  features = []
  for i in range(int(rng.integers(1, 6))):
    table = f"t{i}" if i < n_tables else f"t{int(rng.integers(0, n_tables))}"
    features.append(
      {
        "name": f"f{i}",
        "table": table,
        "batch": int(rng.integers(1, 5)) * g * s,
        "valency": int(rng.integers(1, 9)),
        "form": str(rng.choice(FORMS)),
      }
    )
  used = {f["table"] for f in features}
  tables = [t for t in tables if t["name"] in used]
  mode = str(rng.choice(["none", "explicit", "auto"]))
  groups = []
  if mode == "explicit":
    # Half the explicit cases stack tables of different dims (padded to the
    # largest, as the reference allows).
    mixed_dims = bool(rng.random() < 0.5)
    by_key: dict = {}
    for t in tables:
      key = t["combiner"] if mixed_dims else (t["dim"], t["combiner"])
      by_key.setdefault(key, []).append(t["name"])
    groups = [[str(x) for x in rng.permutation(v)] for v in by_key.values() if len(v) > 1]
  drop = bool(rng.random() < 0.4)
  # Without dropping the limits exceed any possible count (<= 4*8*5 ids/SC).
  max_ids = int(rng.choice([1, 2, 3, 8, 20])) if drop else 256
  max_unique = int(rng.choice([1, 2, 5, 30])) if drop else 256
  for t in tables:
    t["max_ids"] = max_ids
    t["max_unique"] = max_unique
  return {
    "global_devices": g,
    "local_devices": l,
    "sc_per_device": s,
    "tables": tables,
    "features": features,
    "stacking": {
      "mode": mode,
      "groups": groups,
      "rotation": None if rng.random() < 0.5 else int(rng.integers(0, 9)),
      # Limits of multi-table stacks (the tables' own are ignored there).
      "limits": [max_ids, max_unique],
    },
    "weighted": bool(rng.random() < 0.5),
    "allow_id_dropping": drop,
    "fdo": bool(rng.random() < 0.3) and not drop,
    "skew": float(rng.choice([1.0, 3.0])),
    "seed": int(rng.integers(0, 2**31)),
  }


def _limit_callables(case: dict) -> dict:
  max_ids, max_unique = case["stacking"]["limits"]
  return {
    "stack_to_max_ids_per_partition": lambda name, count: max_ids,
    "stack_to_max_unique_ids_per_partition": lambda name, count: max_unique,
  }


def build_specs(case: dict) -> dict:
  """Our prepared feature specs (dict by feature name) for a case."""
  tables = {
    t["name"]: core.TableSpec(
      name=t["name"],
      vocabulary_size=t["vocab"],
      embedding_dim=t["dim"],
      combiner=t["combiner"],
      max_ids_per_partition=t["max_ids"],
      max_unique_ids_per_partition=t["max_unique"],
      suggested_coo_buffer_size_per_device=t.get("suggested"),
    )
    for t in case["tables"]
  }
  specs = {
    f["name"]: core.FeatureSpec(
      name=f["name"],
      table_spec=tables[f["table"]],
      input_shape=(f["batch"], f["valency"]),
      output_shape=(f["batch"], tables[f["table"]].embedding_dim),
    )
    for f in case["features"]
  }
  g, s = case["global_devices"], case["sc_per_device"]
  st = case["stacking"]
  if st["mode"] == "explicit":
    for group in st["groups"]:
      specs = T.stack_tables(specs, group, g, s, rotation=st["rotation"], **_limit_callables(case))
  elif st["mode"] == "auto":
    specs = T.auto_stack_tables(specs, g, s, rotation=st["rotation"], **_limit_callables(case))
  return T.prepare_feature_specs_for_training(specs, g, s)


def draw_raw(case: dict) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
  """feature -> (int32 ids, int64 row lengths, float32 weights), host-local."""
  rng = np.random.default_rng(case["seed"])
  vocab = {t["name"]: t["vocab"] for t in case["tables"]}
  ratio = case["local_devices"] / case["global_devices"]
  raw = {}
  for f in case["features"]:
    batch = int(f["batch"] * ratio)
    k = f["valency"]
    if f["form"] == "dense":
      lengths = np.full(batch, k, np.int64)
    else:  # FDO cases need ids in every stack (the reference sets M=0).
      lengths = rng.integers(1 if case["fdo"] else 0, k + 1, batch).astype(np.int64)
    total = int(lengths.sum())
    ids = np.floor(vocab[f["table"]] * rng.random(total) ** case["skew"])
    weights = rng.uniform(-0.5, 2.0, total).astype(np.float32)
    raw[f["name"]] = (ids.astype(np.int32), lengths, weights)
  return raw


def _rows(flat: np.ndarray, lengths: np.ndarray) -> np.ndarray:
  rows = np.empty(lengths.shape[0], object)
  rows[:] = list(np.split(flat, np.cumsum(lengths)[:-1])) if lengths.size else []
  return rows


def as_inputs(case: dict, raw: dict) -> tuple[dict, dict | None, dict, dict | None]:
  """(our features, our weights, reference features, reference weights).

  Ours take each feature's form (int64/float64 where the form says so); the
  reference gets int32 ragged object arrays (or the dense array) and float32
  weights with the same values.
  """
  ours, ours_w, ref, ref_w = {}, {}, {}, {}
  for f in case["features"]:
    name, form = f["name"], f["form"]
    ids, lengths, weights = raw[name]
    if form == "dense":
      shape = (lengths.shape[0], f["valency"])
      ref[name], ref_w[name] = ids.reshape(shape), weights.reshape(shape)
      ours[name] = ids.reshape(shape).astype(np.int64)
      ours_w[name] = weights.reshape(shape).astype(np.float64)
      continue
    ref[name], ref_w[name] = _rows(ids, lengths), _rows(weights, lengths)
    if form == "ragged":
      ours[name], ours_w[name] = ref[name], ref_w[name]
    elif form == "ragged64":
      ours[name] = _rows(ids.astype(np.int64), lengths)
      ours_w[name] = _rows(weights.astype(np.float64), lengths)
    elif form == "list":
      ours[name], ours_w[name] = list(ref[name]), list(ref_w[name])
    else:
      ours[name], ours_w[name] = RaggedBatch(ids, lengths), weights
  if not case["weighted"]:
    return ours, None, ref, None
  return ours, ours_w, ref, ref_w


def flatten_result(out, stats) -> dict[str, np.ndarray]:
  """npz-ready arrays '<field>/<stack>' of buffers and statistics."""
  result = {}
  m = out.sparse_dense_matmul_input
  for field in BUFFER_FIELDS:
    for stack, value in getattr(m, field).items():
      result[f"{field}/{stack}"] = np.asarray(value)
  for field in STATS_FIELDS:
    for stack, value in getattr(stats, field).items():
      result[f"{field}/{stack}"] = np.asarray(value)
  for stack, value in stats.id_drop_counters.items():
    result[f"id_drop_counters/{stack}"] = np.asarray(int(value))
  return result


def run_case(case: dict, feats: dict, weights: dict | None) -> dict:
  """Our flattened result (FDO cases: one run updates the limits first)."""
  specs = build_specs(case)

  def run():
    return T.preprocess_sparse_dense_matmul_input(
      feats,
      weights,
      specs,
      case["local_devices"],
      case["global_devices"],
      num_sc_per_device=case["sc_per_device"],
      allow_id_dropping=case["allow_id_dropping"],
    )

  if case["fdo"]:
    _, stats = run()
    specs = T.update_preprocessing_parameters(specs, stats, case["sc_per_device"])
  return flatten_result(*run())


def written_mask(case: dict, row_pointers: np.ndarray, coo_size: int) -> np.ndarray:
  """COO positions the reference writes (it leaves the rest unwritten)."""
  l, g, s = case["local_devices"], case["global_devices"], case["sc_per_device"]
  r = max(g * s, 8)
  seg = coo_size // s
  rp = row_pointers.reshape(l, s, r)
  end = np.minimum((rp[:, :, -1] + 7) // 8 * 8, seg)
  return (np.arange(seg)[None, None, :] < end[:, :, None]).reshape(-1)


def sanitize(case: dict, result: dict) -> dict:
  """The reference's result with its unwritten segment tails set to our fill."""
  result = dict(result)
  for key, value in result.items():
    field, stack = key.split("/", 1)
    if field in BUFFER_FIELDS[1:]:
      coo_size = value.size // case["local_devices"]
      mask = written_mask(case, result[f"lhs_row_pointers/{stack}"], coo_size)
      value = value.copy()
      value.reshape(-1)[~mask] = np.nan if field == "lhs_gains" else INT_MAX
      result[key] = value
  return result


def compare(case: dict, expected: dict, actual: dict) -> None:
  """Asserts `actual` equals `expected` bitwise where the reference writes,
  and that the rest of our buffers holds the (INT_MAX, INT_MAX, NaN) fill."""
  assert sorted(expected) == sorted(actual), (sorted(expected), sorted(actual))
  nan_bits = np.float32(np.nan).view(np.uint32)
  for key, want in expected.items():
    field, stack = key.split("/", 1)
    got = actual[key]
    assert (got.shape, got.dtype) == (want.shape, want.dtype), (
      key,
      got.shape,
      got.dtype,
      want.shape,
      want.dtype,
    )
    if field not in BUFFER_FIELDS[1:]:
      np.testing.assert_array_equal(got, want, err_msg=key)
      continue
    coo_size = want.size // case["local_devices"]
    mask = written_mask(case, expected[f"lhs_row_pointers/{stack}"], coo_size)
    got_bits = got.reshape(-1).view(np.int32 if field != "lhs_gains" else np.uint32)
    want_bits = want.reshape(-1).view(got_bits.dtype)
    diff = np.flatnonzero(got_bits[mask] != want_bits[mask])
    assert diff.size == 0, (key, diff[:10], got_bits[mask][diff[:10]], want_bits[mask][diff[:10]])
    fill = nan_bits if field == "lhs_gains" else INT_MAX
    assert (got_bits[~mask] == fill).all(), key


# ---------------------------------------------------------------------------
# Which sort path of coo_sort a case takes (white-box, for coverage pins).
# ---------------------------------------------------------------------------

# Every stack sorts its keys SC by SC: by sample id ("sample_*", unweighted)
# or by position ("position_*", weighted), with uint32 or uint64 keys, in
# padded rows ("*_rows") or, for uneven SCs, exact regions ("*_regions").
SORT_PATHS = tuple(
  f"{kind}_{dtype}_{layout}"
  for kind in ("sample", "position")
  for dtype in ("uint32", "uint64")
  for layout in ("rows", "regions")
)


@contextlib.contextmanager
def record_sort_paths() -> Iterator[list[str]]:
  """Yields a list that collects the sort path (SORT_PATHS) of every stack.

  Observes coo_sort from outside: which sort and region functions ran and
  the key dtype.
  """
  from sparsepipe.transforms.coo import sort as coo_sort  # pylint: disable=g-import-not-at-top

  paths: list[str] = []
  layouts: list[str] = []
  names = ("sort_by_sample", "sort_by_position", "_sort_rows", "_sort_regions")
  originals = {name: getattr(coo_sort, name) for name in names}

  def observe(kind):
    def run(*args, **kwargs):
      entries = originals[f"sort_by_{kind}"](*args, **kwargs)
      paths.append(f"{kind}_{entries.key.dtype.name}_{layouts.pop()}")
      return entries

    return run

  def sorter(name, layout):
    def run(*args, **kwargs):
      layouts.append(layout)
      return originals[name](*args, **kwargs)

    return run

  patched = {
    "sort_by_sample": observe("sample"),
    "sort_by_position": observe("position"),
    "_sort_rows": sorter("_sort_rows", "rows"),
    "_sort_regions": sorter("_sort_regions", "regions"),
  }
  for name, fn in patched.items():
    setattr(coo_sort, name, fn)
  try:
    yield paths
  finally:
    for name, fn in originals.items():
      setattr(coo_sort, name, fn)


# ---------------------------------------------------------------------------
# The reference (jax-tpu-embedding 0.1.0), imported lazily.
# ---------------------------------------------------------------------------


def reference_specs(case: dict) -> dict:
  """The case's feature specs stacked by the reference's own functions."""
  import jax  # pylint: disable=g-import-not-at-top
  from absl import logging  # pylint: disable=g-import-not-at-top
  from jax_tpu_embedding.sparsecore.lib.nn import embedding  # pylint: disable=g-import-not-at-top
  from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec  # pylint: disable=g-import-not-at-top
  from jax_tpu_embedding.sparsecore.lib.nn import table_stacking  # pylint: disable=g-import-not-at-top

  logging.set_verbosity(logging.ERROR)
  optimizer = embedding_spec.SGDOptimizerSpec(learning_rate=0.001)
  tables = {
    t["name"]: embedding_spec.TableSpec(
      name=t["name"],
      vocabulary_size=t["vocab"],
      embedding_dim=t["dim"],
      initializer=jax.nn.initializers.zeros,
      optimizer=optimizer,
      combiner=t["combiner"],
      max_ids_per_partition=t["max_ids"],
      max_unique_ids_per_partition=t["max_unique"],
      suggested_coo_buffer_size_per_device=t.get("suggested"),
    )
    for t in case["tables"]
  }
  specs = {
    f["name"]: embedding_spec.FeatureSpec(
      name=f["name"],
      table_spec=tables[f["table"]],
      input_shape=[f["batch"], f["valency"]],
      output_shape=[f["batch"], tables[f["table"]].embedding_dim],
    )
    for f in case["features"]
  }
  g, s = case["global_devices"], case["sc_per_device"]
  st = case["stacking"]
  if st["mode"] == "explicit":
    for group in st["groups"]:
      table_stacking.stack_tables(
        specs, group, g, s, rotation=st["rotation"], **_limit_callables(case)
      )
  elif st["mode"] == "auto":
    table_stacking.auto_stack_tables(specs, g, s, rotation=st["rotation"], **_limit_callables(case))
  embedding.prepare_feature_specs_for_training(specs, g, s)
  return specs


def run_reference(case: dict, feats: dict, weights: dict | None) -> dict:
  """The reference's flattened result, same steps as run_case."""
  from jax_tpu_embedding.sparsecore.lib.nn import embedding  # pylint: disable=g-import-not-at-top

  specs = reference_specs(case)

  def run():
    return embedding.preprocess_sparse_dense_matmul_input(
      feats,
      weights,
      specs,
      case["local_devices"],
      case["global_devices"],
      num_sc_per_device=case["sc_per_device"],
      allow_id_dropping=case["allow_id_dropping"],
    )

  if case["fdo"]:
    _, stats = run()
    embedding.update_preprocessing_parameters(specs, stats, case["sc_per_device"])
  return flatten_result(*run())

"""The shipped criteo DLRM trained with TorchRec on this CPU: examples/s to set beside sparsepipe's.

    python benchmarks/torchrec_dlrm.py [--workers 2] [--batches 100] [--warmup 20]
        [--path dmp|fused] [--threads 0] [--json out.json]

Runs in any Python environment with torch, torchrec and fbgemm_gpu (CPU), and
does not import sparsepipe (nor jax): TorchRec is not a sparsepipe
dependency. To make one:

    pip install torchrec fbgemm-gpu-cpu

torchrec requires `fbgemm-gpu`, the CUDA build, so pip installs it beside
fbgemm-gpu-cpu; both write the same `fbgemm_gpu` package, and on a machine
without CUDA the CUDA one's library fails to load (libnvidia-ml.so.1). Remove
it, which deletes the shared files, then put the CPU build back:

    pip uninstall fbgemm-gpu
    pip install --no-deps --force-reinstall fbgemm-gpu-cpu==<the same version>

The model and the training are those of `sparsepipe/launch/config/shipped/criteo.py`
(matched in sparsepipe's code as cited at each constant below):
  - 26 tables C1..C26 of VOCAB_SIZES rows, embedding dim 16, sum pooling, one
    id per feature per example; ids Zipf(1.05), scrambled; 13 dense features.
  - DLRM as sparsepipe/pipeline/models/dlrm.py: bottom MLP 13 -> 512 -> 256
    -> 16 with ReLU after every layer; T = [bottom, e_C1, .., e_C26]; the
    pairwise dots of T below the diagonal (no self-interaction: 351); top MLP
    367 -> 1024 -> 1024 -> 512 -> 256 -> 1 with ReLU between layers, none on
    the logit. torchrec.models.dlrm.DLRM (DenseArch, InteractionArch with
    triu offset 1, OverArch) is that model, with the tables in sparsepipe's
    sorted-name order: the one difference is the order of the 351 dots in the
    top MLP's input (TorchRec's upper triangle row by row, sparsepipe's lower
    one), a fixed permutation of the first top layer's rows (checked: equal
    logits, 2e-7 apart, once permuted).
  - Initialization as sparsepipe's: tables truncated normal (stddev 0.05,
    +-2 stddevs), dense kernels N(0, 2/(in+out)), biases N(0, 1/out).
  - Embeddings: exact (per-element, not row-wise) Adagrad, lr 0.05, initial
    accumulator 0.1, no epsilon (sparsepipe's AdagradOptimizerSpec); dense:
    Adam lr 1e-3, betas (0.9, 0.999), eps 1e-8 (optax.adam's defaults, the
    base config's dense_optimizer). Loss: mean BCE with logits. Batch 4096.
  - The embedding update is fused into the backward: FBGEMM's TBE
    (SplitTableBatchedEmbeddingBagsCodegen) with OptimType EXACT_ADAGRAD on
    the CPU, TorchRec's kernel for trained tables. Path `dmp` (default) is
    TorchRec's standard training setup: an EmbeddingBagCollection on the meta
    device, `apply_optimizer_in_backward(torch.optim.Adagrad, ...)`, and
    DistributedModelParallel with world size 1 on gloo and a plan that puts
    every table table_wise with the "fused" compute kernel (that TBE); DMP
    wraps the dense part in DDP, and its input/output dists and the DDP
    allreduce run on the one rank. The plan is set because the planner, left
    alone, makes every table data_parallel at world size 1: a dense kernel
    whose gradient and Adagrad update cover every row of every table each
    step. Path `fused` is the same TBE without the distributed layer
    (torchrec.modules.fused_embedding_modules.FusedEmbeddingBagCollection
    with torch.optim.Adagrad); both paths give the same losses. A plain
    EmbeddingBagCollection would train nn.EmbeddingBag tables through dense
    full-table gradients: not TorchRec's path. TBE's initial accumulator is
    0, so both set it to 0.1 after construction, and its eps (added to
    sqrt(accumulator)) is 0.
  - Input: a torch DataLoader over an IterableDataset with --workers worker
    processes (0: in the training process) that draw each batch with numpy
    as sparsepipe/data/synthetic/generate.py draws a 4096-example chunk
    (dense log(1 + Exponential(10)), per feature a length then Zipf ids via
    the same inverse CDF and scramble, labels Bernoulli of the planted click
    model of sparsepipe/data/synthetic/click_model.py) and build the
    KeyedJaggedTensor. With --workers 0 and batch 4096 the batches are those
    of sparsepipe's synthetic "train" stream for --seed, bit for bit; worker
    k draws its own stream, of the same distribution.

Differences from the sparsepipe run (1 device, 2 data workers): this GENERATES
its batches (ids, dense values and the planted labels: about 5 ms of worker
CPU a batch on this machine) instead of reading the ArrayRecord records of a
generated dataset (one example a record in the shipped config) and decoding
them; sparsepipe's workers also make the COO buffers and their statistics,
which TorchRec's KeyedJaggedTensor input does not need. So here the input
takes almost no CPU from the training process on 2 cores, where
sparsepipe's takes what benchmarks/loader.py measures. sparsepipe trains on
a fixed 2**20-example dataset, this on a fresh stream of the same
distribution. The labels are learnable, so the loss falls from its first
batches (from about 0.62 to 0.54 over 120 batches).

Reported: examples/s (wall) over --batches batches after --warmup, CPU
seconds per batch of the training process (getrusage RUSAGE_SELF: all its
threads) and of the live workers (/proc/<pid>/stat), the time the training
process waited for batches, torch.get_num_threads(), and the loss at the
start and end. The machine may be shared: compare runs made back to back.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing
import os
import resource
import tempfile
import time
from typing import Any, Iterator

import numpy as np

# Not sparsepipe dependencies: main() names a missing one after the flags (--help needs none).
_MISSING: ImportError | None = None
try:
  import torch
  import torch.distributed as dist
  import torch.nn.functional as F
  import torchrec
  from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    SplitTableBatchedEmbeddingBagsCodegen,
  )
  from torch.utils.data import DataLoader, IterableDataset
  from torchrec.datasets.utils import Batch
  from torchrec.distributed.model_parallel import DistributedModelParallel
  from torchrec.distributed.planner import EmbeddingShardingPlanner
  from torchrec.distributed.planner import ParameterConstraints
  from torchrec.distributed.planner import Topology
  from torchrec.distributed.sharding_plan import get_default_sharders
  from torchrec.models.dlrm import DLRM
  from torchrec.modules.embedding_configs import EmbeddingBagConfig
  from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
  from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
  from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
except ImportError as e:
  _MISSING = e
  IterableDataset = object  # so that this module loads; main() stops before any use

# Per-feature vocabulary sizes of C1..C26: VOCAB_SIZES of
# sparsepipe/launch/config/shipped/criteo.py (the Kaggle cardinalities capped at 2**20).
VOCAB_SIZES = (
  1460,
  583,
  1048576,
  1048576,
  305,
  24,
  12517,
  633,
  3,
  93145,
  5683,
  1048576,
  3194,
  27,
  14992,
  1048576,
  10,
  5652,
  2173,
  4,
  1048576,
  18,
  15,
  286181,
  105,
  142572,
)
# The job draws and stacks features in name order (config.features iterates sorted):
# C1, C10, C11, .., C19, C2, C20, ..
FEATURES = tuple(sorted((f"C{i}", v) for i, v in enumerate(VOCAB_SIZES, start=1)))
NUM_DENSE = 13  # launch/config/base_config.py: synthetic.num_dense
EMBEDDING_DIM = 16  # launch/config/base_config.py: model.embedding_dim
IDS_PER_FEATURE = 1  # launch/config/base_config.py feature(): min_ids = max_ids = 1
ZIPF_EXPONENT = 1.05  # criteo.py: feature(vocab, zipf_exponent=1.05)
BOTTOM_MLP = (512, 256, 16)  # criteo.py: model.bottom_mlp_dims
TOP_MLP = (1024, 1024, 512, 256)  # criteo.py: model.top_mlp_dims (+ the 1-unit logit layer)
EMBEDDING_LR = 0.05  # launch/config/base_config.py: embedding_optimizer adagrad, learning_rate=0.05
INITIAL_ACCUMULATOR = 0.1  # sparsepipe/core/optimizer_specs.py: AdagradOptimizerSpec
DENSE_LR = 1e-3  # launch/config/base_config.py: dense_optimizer adam, learning_rate=1e-3
TABLE_INIT_STDDEV = 0.05  # sparsepipe/core/initializers.py: TruncatedNormalInitializer

# Synthetic data (sparsepipe/data/synthetic/generate.py and click_model.py).
_FLOAT32_VOCAB = 1 << 20  # Zipf inverse CDF in float32 up to this vocabulary size
_SCRAMBLES: dict[int, np.ndarray] = {}
_CLICK_BIAS, _CLICK_SCALE, _SPARSE_SHARE, _DENSE_SHARE = -1.3, 1.15, 0.8, 0.6
_DENSE_MEAN, _DENSE_STD = 2.0147, 0.9115
_HALF_WIDTH = math.sqrt(3.0)


def zipf_ids(rng: np.random.Generator, n: int, vocab_size: int, exponent: float) -> np.ndarray:
  """n int32 ids in [0, vocab_size): generate.py's bounded Zipf ranks by inverse CDF, scrambled."""
  dtype = np.float32 if vocab_size <= _FLOAT32_VOCAB else np.float64
  u = rng.random(n, dtype)
  top = vocab_size + 1.0
  if abs(exponent - 1.0) < 1e-9:
    x = np.exp(u * dtype(math.log(top)), out=u)
  else:
    a = 1.0 - exponent
    u *= dtype(top**a - 1.0)
    u += dtype(1.0)
    x = np.power(u, dtype(1.0 / a), out=u)
  ranks = x.astype(np.int64)
  ranks -= 1
  np.clip(ranks, 0, vocab_size - 1, out=ranks)
  return _scramble_table(vocab_size)[ranks]


def _scramble_table(vocab_size: int) -> np.ndarray:
  """generate.py's bijection k -> (k * m) mod vocab_size as a lookup table (cached)."""
  table = _SCRAMBLES.get(vocab_size)
  if table is None:
    m = 2654435761 % vocab_size or 1
    while math.gcd(m, vocab_size) != 1:
      m += 1
    table = (np.arange(vocab_size, dtype=np.int64) * m % vocab_size).astype(np.int32)
    _SCRAMBLES[vocab_size] = table
  return table


def _hashed_weights(keys: np.ndarray, what: str, seed: int) -> np.ndarray:
  """click_model.py's unit-variance weights: fmix32(key ^ salt) mapped to [-sqrt 3, sqrt 3)."""
  digest = hashlib.blake2b(f"{seed}/{what}".encode(), digest_size=8).digest()
  x = keys.astype(np.uint32) ^ np.uint32(int.from_bytes(digest, "little") & 0xFFFFFFFF)
  x = x ^ (x >> np.uint32(16))
  x *= np.uint32(0x85EBCA6B)
  x ^= x >> np.uint32(13)
  x *= np.uint32(0xC2B2AE35)
  x ^= x >> np.uint32(16)
  return x.astype(np.float64) * (2.0 * _HALF_WIDTH / 2.0**32) - _HALF_WIDTH


def _click_probabilities(dense: np.ndarray, ids: dict[str, np.ndarray], seed: int) -> np.ndarray:
  """click_model.py's planted probabilities for one id per feature (its sums are the weights)."""
  s = np.zeros(dense.shape[0])
  for name, values in ids.items():
    s += _hashed_weights(values, f"sparse/{name}", seed)
  s /= math.sqrt(len(ids))
  v = _hashed_weights(np.arange(NUM_DENSE), "dense", seed)
  d = np.zeros(dense.shape[0])
  for j in range(NUM_DENSE):
    d += (dense[:, j].astype(np.float64) - _DENSE_MEAN) * (v[j] / _DENSE_STD)
  d /= math.sqrt(NUM_DENSE)
  logit = _CLICK_BIAS + _CLICK_SCALE * (_SPARSE_SHARE * s + _DENSE_SHARE * d)
  return 0.5 * (1.0 + np.tanh(0.5 * logit))


def synthetic_batch(rng: np.random.Generator, seed: int, batch_size: int) -> dict[str, Any]:
  """One batch drawn as generate.py draws a chunk: {"dense", "ids": {name: int32}, "labels"}.

  The draws come in generate.py's order (dense, then per feature in name
  order its lengths and ids, then the labels), so with batch_size 4096 (its
  chunk) and rng = train_rng(seed) successive calls give its "train" stream.
  """
  dense = np.log1p(rng.standard_exponential((batch_size, NUM_DENSE), np.float32) * np.float32(10))
  ids = {}
  for name, vocab in FEATURES:
    lengths = rng.integers(IDS_PER_FEATURE, IDS_PER_FEATURE + 1, batch_size, np.int32)
    ids[name] = zipf_ids(rng, int(lengths.sum()), vocab, ZIPF_EXPONENT)
  p = _click_probabilities(dense, ids, seed)
  labels = (rng.random(batch_size) < p).astype(np.float32)
  return {"dense": dense, "ids": ids, "labels": labels}


def train_rng(seed: int, worker: int | None = None) -> np.random.Generator:
  """generate.py's "train" stream generator; worker k of a loader gets its own stream."""
  return np.random.default_rng([seed, 0] if worker is None else [seed, 0, worker + 1])


class SyntheticBatches(IterableDataset):
  """Endless TorchRec Batches (dense, KeyedJaggedTensor, labels), each made in the worker."""

  def __init__(self, seed: int, batch_size: int):
    self.seed = seed
    self.batch_size = batch_size

  def __iter__(self) -> Iterator[Batch]:
    info = torch.utils.data.get_worker_info()
    rng = train_rng(self.seed, None if info is None else info.id)
    keys = [name for name, _ in FEATURES]
    lengths = torch.full((len(keys) * self.batch_size,), IDS_PER_FEATURE, dtype=torch.int32)
    while True:
      b = synthetic_batch(rng, self.seed, self.batch_size)
      values = torch.from_numpy(np.concatenate([b["ids"][k] for k in keys]).astype(np.int64))
      yield Batch(
        dense_features=torch.from_numpy(b["dense"]),
        sparse_features=KeyedJaggedTensor.from_lengths_sync(keys, values, lengths),
        labels=torch.from_numpy(b["labels"]),
      )


def _tables() -> list[EmbeddingBagConfig]:
  return [
    EmbeddingBagConfig(
      name=f"t_{name}", embedding_dim=EMBEDDING_DIM, num_embeddings=vocab, feature_names=[name]
    )
    for name, vocab in FEATURES
  ]


def _init_dense(module: torch.nn.Module, seed: int) -> None:
  """sparsepipe's dense_layer init: kernel N(0, 2/(in+out)), bias N(0, 1/out)."""
  torch.manual_seed(seed)  # the same draws on both paths
  with torch.no_grad():
    for m in module.modules():
      if isinstance(m, torch.nn.Linear):
        m.weight.normal_(0.0, math.sqrt(2.0 / (m.in_features + m.out_features)))
        m.bias.normal_(0.0, math.sqrt(1.0 / m.out_features))


def _all_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
  """modules(), and those held in plain lists, out of modules(): FusedEmbeddingBagCollection's
  _emb_modules, ShardedEmbeddingBagCollection's _lookups."""
  found: dict[int, torch.nn.Module] = {}
  todo = [model]
  while todo:
    for m in todo.pop().modules():
      if id(m) not in found:
        found[id(m)] = m
        for value in vars(m).values():
          if isinstance(value, (list, tuple)):
            todo += [v for v in value if isinstance(v, torch.nn.Module)]
  return list(found.values())


def _init_tables(model: torch.nn.Module, seed: int) -> int:
  """Tables truncated normal, Adagrad accumulators 0.1, in every TBE; returns the TBE count."""
  tbes = [m for m in _all_modules(model) if isinstance(m, SplitTableBatchedEmbeddingBagsCodegen)]
  std = TABLE_INIT_STDDEV
  torch.manual_seed(seed + 1)
  with torch.no_grad():
    for tbe in tbes:
      if tbe.optimizer.name != "EXACT_ADAGRAD":
        raise RuntimeError(f"TBE optimizer is {tbe.optimizer}, expected EXACT_ADAGRAD")
      for w in tbe.split_embedding_weights():
        torch.nn.init.trunc_normal_(w, 0.0, std, -2 * std, 2 * std)
      for states in tbe.split_optimizer_states():
        states[0].fill_(INITIAL_ACCUMULATOR)
  if not tbes:
    raise RuntimeError("no FBGEMM TBE in the model: the embedding optimizer is not fused")
  return len(tbes)


def _plan(dlrm: DLRM) -> Any:
  """Every table table_wise on the one rank with the "fused" kernel (the TBE).

  Left alone, the planner makes every table data_parallel at world size 1
  (no comms to save): a dense-kernel table whose gradient covers all its rows,
  allreduced and then updated by Adagrad in full each step. Not how TorchRec
  trains large tables, nor the update sparsepipe does (touched rows only).
  """
  only = ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"])
  planner = EmbeddingShardingPlanner(
    topology=Topology(local_world_size=1, world_size=1, compute_device="cpu"),
    constraints={t.name: only for t in _tables()},
  )
  return planner.collective_plan(dlrm, get_default_sharders(), dist.GroupMember.WORLD)


def build_model(path: str, tmpdir: str, seed: int) -> tuple[torch.nn.Module, DLRM]:
  """(the module to call, the DLRM inside it) on the CPU for `path` dmp or fused."""
  adagrad = {"lr": EMBEDDING_LR, "eps": 0.0}
  dense_layers = dict(
    dense_in_features=NUM_DENSE,
    dense_arch_layer_sizes=list(BOTTOM_MLP),
    over_arch_layer_sizes=list(TOP_MLP) + [1],
    dense_device=torch.device("cpu"),
  )
  if path == "fused":
    ebc = FusedEmbeddingBagCollection(_tables(), torch.optim.Adagrad, adagrad)
    dlrm = DLRM(embedding_bag_collection=ebc, **dense_layers)
    _init_dense(dlrm, seed)
    model = dlrm
  else:
    store = dist.FileStore(os.path.join(tmpdir, "gloo_store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    ebc = torchrec.EmbeddingBagCollection(tables=_tables(), device=torch.device("meta"))
    dlrm = DLRM(embedding_bag_collection=ebc, **dense_layers)
    _init_dense(dlrm, seed)
    apply_optimizer_in_backward(torch.optim.Adagrad, dlrm.sparse_arch.parameters(), adagrad)
    model = DistributedModelParallel(dlrm, device=torch.device("cpu"), plan=_plan(dlrm))
  num_tbes = _init_tables(model, seed)
  print(f"path {path}: {len(FEATURES)} tables in {num_tbes} FBGEMM TBE(s), EXACT_ADAGRAD fused")
  return model, dlrm


def _worker_cpu_seconds() -> float:
  """User + system CPU seconds of this process's live children (the DataLoader workers)."""
  total = 0.0
  tick = os.sysconf("SC_CLK_TCK")
  for child in multiprocessing.active_children():
    try:
      with open(f"/proc/{child.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
      total += (int(fields[11]) + int(fields[12])) / tick
    except (OSError, IndexError, ValueError):
      pass
  return total


def _main_cpu_seconds() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def train_batches(model, dense_opt, it, n: int, losses: list[float]) -> float:
  """n training steps on batches of `it`; appends the losses, returns the seconds spent waiting."""
  wait = 0.0
  for _ in range(n):
    start = time.perf_counter()
    batch = next(it)
    wait += time.perf_counter() - start
    logits = model(batch.dense_features, batch.sparse_features).squeeze(-1)
    loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
    dense_opt.zero_grad(set_to_none=True)
    loss.backward()  # the TBE applies exact Adagrad to the touched rows here
    dense_opt.step()
    losses.append(loss.item())
  return wait


def run(args: argparse.Namespace) -> dict[str, Any]:
  """Warm-up, then the timed batches; the figures as a dict."""
  if args.threads:
    torch.set_num_threads(args.threads)
  loader = DataLoader(
    SyntheticBatches(args.seed, args.batch_size),
    batch_size=None,
    num_workers=args.workers,
    prefetch_factor=2 if args.workers else None,
  )
  it = iter(loader)  # workers fork before the model and gloo exist
  tmpdir = tempfile.TemporaryDirectory(prefix="torchrec_dlrm_")
  model, dlrm = build_model(args.path, tmpdir.name, args.seed)
  dense_params = list(dlrm.dense_arch.parameters()) + list(dlrm.over_arch.parameters())
  dense_opt = torch.optim.Adam(dense_params, lr=DENSE_LR, betas=(0.9, 0.999), eps=1e-8)
  losses: list[float] = []
  train_batches(model, dense_opt, it, args.warmup, losses)
  wall, main_cpu, workers_cpu = time.perf_counter(), _main_cpu_seconds(), _worker_cpu_seconds()
  wait = train_batches(model, dense_opt, it, args.batches, losses)
  wall = time.perf_counter() - wall
  main_cpu = _main_cpu_seconds() - main_cpu
  workers_cpu = _worker_cpu_seconds() - workers_cpu
  workers_seen = len(multiprocessing.active_children())
  del it
  if dist.is_initialized():
    dist.destroy_process_group()
  tmpdir.cleanup()
  n, k = args.batches, min(10, len(losses))
  return {
    "benchmark": "torchrec_dlrm",
    "path": args.path,
    "batch_size": args.batch_size,
    "workers": args.workers,
    "worker_processes_seen": workers_seen,
    "torch_threads": torch.get_num_threads(),
    "cpu_count": os.cpu_count(),
    "warmup_batches": args.warmup,
    "timed_batches": n,
    "examples_per_s": n * args.batch_size / wall,
    "ms_per_batch": 1e3 * wall / n,
    "main_cpu_s_per_batch": main_cpu / n,
    "workers_cpu_s_per_batch": workers_cpu / n,
    "cores_busy": (main_cpu + workers_cpu) / wall,
    "data_wait_ms_per_batch": 1e3 * wait / n,
    "loss_first_batch": losses[0],
    "loss_first_10_mean": float(np.mean(losses[:k])),
    "loss_last_10_mean": float(np.mean(losses[-k:])),
    "seed": args.seed,
    "torch_version": torch.__version__,
    "torchrec_version": getattr(torchrec, "__version__", "unknown"),
    "load_average_end": os.getloadavg()[0],
  }


def _print(r: dict[str, Any]) -> None:
  print(
    f"TorchRec DLRM, criteo shape, CPU: path {r['path']}, batch {r['batch_size']},"
    f" workers {r['workers']}, torch threads {r['torch_threads']} of {r['cpu_count']} CPUs,"
    f" {r['timed_batches']} timed batches after {r['warmup_batches']}"
  )
  head = ("examples/s", "ms/batch", "main CPU-s/batch", "workers CPU-s/batch", "cores busy")
  print(" ".join(f"{h:>20}" for h in head + ("data wait ms/batch",)))
  values = (
    f"{r['examples_per_s']:,.0f}",
    f"{r['ms_per_batch']:.1f}",
    f"{r['main_cpu_s_per_batch']:.3f}",
    f"{r['workers_cpu_s_per_batch']:.3f}",
    f"{r['cores_busy']:.2f}",
    f"{r['data_wait_ms_per_batch']:.1f}",
  )
  print(" ".join(f"{v:>20}" for v in values))
  print(
    f"loss: first batch {r['loss_first_batch']:.4f}, mean of the first 10"
    f" {r['loss_first_10_mean']:.4f}, of the last 10 {r['loss_last_10_mean']:.4f}"
  )
  print(f"load average at the end: {r['load_average_end']:.1f} (a shared machine: compare runs)")


def _figures_path(path: str) -> str:
  """argparse's type= for --json: a new file in a folder that exists, or the
  figures of an earlier run. This script runs without sparsepipe, so it cannot
  tell saved work (benchmarks/outputs.py) from other files; it replaces
  only what it wrote itself."""
  folder = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(folder):
    raise argparse.ArgumentTypeError(f"'{path}': its folder '{folder}' does not exist")
  if not os.path.lexists(path):
    return path
  try:
    with open(path) as f:
      earlier = json.load(f)
  except (OSError, UnicodeDecodeError, ValueError):
    earlier = None
  if not (isinstance(earlier, dict) and earlier.get("benchmark") == "torchrec_dlrm"):
    raise argparse.ArgumentTypeError(
      f"'{path}' exists and is not this benchmark's figures: give a new file"
    )
  return path


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--path", choices=("dmp", "fused"), default="dmp", help="See the docstring.")
  parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes.")
  parser.add_argument("--batches", type=int, default=100, help="Timed batches.")
  parser.add_argument("--warmup", type=int, default=20, help="Untimed batches first.")
  parser.add_argument("--batch_size", type=int, default=4096, help="Examples per batch.")
  parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default).")
  parser.add_argument("--seed", type=int, default=0, help="Data (and init) seed.")
  parser.add_argument(
    "--json",
    default=None,
    type=_figures_path,
    help="Write the figures to this JSON file (a new one, or this benchmark's own).",
  )
  args = parser.parse_args()
  if args.batches < 1 or args.warmup < 1 or args.workers < 0:
    parser.error("need --batches >= 1, --warmup >= 1 and --workers >= 0")
  if _MISSING is not None:
    raise SystemExit(
      "torchrec_dlrm.py needs torch, torchrec and fbgemm_gpu (CPU build), and"
      f" {_MISSING.name or 'one of them'} does not import ({_MISSING}): install them as the"
      " docstring at the top of benchmarks/torchrec_dlrm.py says (pip install torchrec"
      " fbgemm-gpu-cpu, then swap the CUDA fbgemm-gpu it brings for fbgemm-gpu-cpu)"
    )
  result = run(args)
  _print(result)
  if args.json:  # beside it, then in place: the file is whole, old or new
    tmp = f"{args.json}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
      json.dump(result, f, indent=1)
    os.replace(tmp, args.json)


if __name__ == "__main__":
  main()

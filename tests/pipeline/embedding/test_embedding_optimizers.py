"""Embedding optimizers: update rules against dense numpy references, specs.

Every optimizer runs two update steps of the sharded kernel on one table
(2 devices x 2 SparseCores); the touched rows and slots must match a float64
numpy implementation of the rule written from its formula, untouched rows
stay as they were. The specs' hyperparameters, learning rates and names are
checked exactly, and against jax-tpu-embedding when it is installed.
"""

import functools
import math
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from reference import reference_module
from sparsepipe import core
from sparsepipe.core import data_sharding
from sparsepipe.core import make_mesh
from sparsepipe.launch.config import config_specs
from sparsepipe.pipeline import UnsupportedOptimizerError
from sparsepipe.pipeline import init_embedding_variables
from sparsepipe.pipeline import sparse_dense_matmul_grad
from sparsepipe.pipeline import unstack_embedding_variables
from sparsepipe.transforms import prepare_feature_specs_for_training
from sparsepipe.transforms import preprocess_sparse_dense_matmul_input

G, S, BATCH, VOCAB, DIM = 2, 2, 16, 40, 8


def _adagrad_momentum(opt, lr, step, w, slots, g):
  a, m = slots
  a = a + g * g if opt.beta2 == 1.0 else opt.beta2 * a + (1 - opt.beta2) * g * g
  scaled = (a + opt.epsilon) ** (-1.0 / opt.exponent) * g
  m = opt.momentum * m + scaled
  update = opt.momentum * m + scaled if opt.use_nesterov else m
  return w - lr * update, [a, m]


def _ftrl(opt, lr, step, w, slots, g):
  a, linear = slots
  a_new = a + g * g
  power = -opt.learning_rate_power
  delta = a_new**power - a**power
  l1, l2 = opt.l1_regularization_strength, opt.l2_regularization_strength
  if opt.multiply_linear_by_learning_rate:
    linear = linear + lr * g - delta * w
    l1, denominator = l1 * lr, a_new**power + 2 * lr * l2 + opt.beta
  else:
    linear = linear + g - delta / lr * w
    denominator = (a_new**power + opt.beta) / lr + 2 * l2
  # Closed form of the proximal step: shrink |linear| by l1, zero inside.
  numerator = -np.sign(linear) * np.maximum(np.abs(linear) - l1, 0.0)
  return numerator / denominator, [a_new, linear]


def _laprop(opt, lr, step, w, slots, g):
  mu, nu = slots
  decay = opt.b2 * (1 - opt.b2**step) / (1 - opt.b2 ** (step + 1))
  nu = decay * nu + (1 - decay) * (g * g + opt.eps)
  mu = opt.b1 * mu + math.sqrt(1 - opt.b1**2) * g / np.sqrt(nu)
  return w - lr * mu, [mu, nu]


def _adam(opt, lr, step, w, slots, g):
  m, v = slots
  m = opt.beta_1 * m + (1 - opt.beta_1) * g
  v = opt.beta_2 * v + (1 - opt.beta_2) * g * g
  m_hat = m / (1 - opt.beta_1 ** (step + 1))
  v_hat = v / (1 - opt.beta_2 ** (step + 1))
  return w - lr * m_hat / (np.sqrt(v_hat) + opt.epsilon), [m, v]


def _schedule(step):
  return 0.2 / (1.0 + step)


CASES = {
  "adagrad_momentum": (core.AdagradMomentumOptimizerSpec(0.1), _adagrad_momentum),
  "adagrad_momentum_nesterov_beta2": (
    core.AdagradMomentumOptimizerSpec(
      _schedule,
      momentum=0.5,
      beta2=0.9,
      epsilon=1e-3,
      exponent=3.0,
      use_nesterov=True,
      initial_accumulator_value=0.3,
      initial_momentum_value=0.05,
    ),
    _adagrad_momentum,
  ),
  "ftrl": (core.FTRLOptimizerSpec(0.1), _ftrl),
  "ftrl_l1_l2_beta": (
    core.FTRLOptimizerSpec(
      0.1,
      learning_rate_power=-0.7,
      l1_regularization_strength=0.05,
      l2_regularization_strength=0.2,
      beta=0.3,
      initial_accumulator_value=0.5,
      initial_linear_value=0.01,
    ),
    _ftrl,
  ),
  "ftrl_linear_times_lr": (
    core.FTRLOptimizerSpec(
      _schedule,
      l1_regularization_strength=0.01,
      l2_regularization_strength=0.1,
      beta=0.1,
      multiply_linear_by_learning_rate=True,
    ),
    _ftrl,
  ),
  "laprop": (core.LaPropOptimizerSpec(0.01), _laprop),
  "laprop_slots": (
    core.LaPropOptimizerSpec(lambda: 0.02, b1=0.8, b2=0.9, eps=1e-6, initial_slot_value=0.1),
    _laprop,
  ),
  "adam_lr_without_step": (core.AdamOptimizerSpec(lambda: 0.05), _adam),
}


@functools.lru_cache(maxsize=None)
def _setup(case):
  opt = CASES[case][0]
  table = core.TableSpec(
    "t",
    VOCAB,
    DIM,
    "sum",
    initializer=core.UniformInitializer(0.5),
    optimizer=opt,
    max_ids_per_partition=64,
    max_unique_ids_per_partition=64,
  )
  specs = {"f": core.FeatureSpec("f", table, (BATCH, 3), (BATCH, DIM))}
  specs = prepare_feature_specs_for_training(specs, G, S)
  mesh = make_mesh(jax.devices()[:G])
  update = jax.jit(
    functools.partial(sparse_dense_matmul_grad, feature_specs=specs, mesh=mesh, num_sc_per_device=S)
  )
  return specs, mesh, update


def _learning_rate(opt, step):
  rate = opt.learning_rate
  if not callable(rate):
    return rate
  return rate(step) if rate is _schedule else rate()


@pytest.mark.parametrize("case", sorted(CASES))
def test_update_matches_dense_reference(case):
  opt, rule = CASES[case]
  specs, mesh, update = _setup(case)
  state = init_embedding_variables(jax.random.key(0), specs, mesh, num_sc_per_device=S)
  logical = unstack_embedding_variables(state, specs, num_sc_per_device=S)["t"]
  table = logical.table.astype(np.float64)
  slots = [x.astype(np.float64) for x in logical.slots]
  assert len(slots) == len(opt.slot_names())
  rng = np.random.default_rng(7)
  for step in range(2):
    ids = rng.integers(0, VOCAB, (BATCH, 3)).astype(np.int32)
    ids[0] = [5, 5, 6]  # a row twice in one sample
    grads = rng.normal(size=(BATCH, DIM)).astype(np.float32)
    pre, _ = preprocess_sparse_dense_matmul_input(
      {"f": ids}, None, specs, G, G, num_sc_per_device=S
    )
    sparse = jax.device_put(pre.sparse_dense_matmul_input, data_sharding(mesh))
    state = update({"f": jnp.asarray(grads)}, sparse, state, step=step)
    dense = np.zeros((VOCAB, DIM))
    np.add.at(dense, ids.reshape(-1), np.repeat(grads, 3, axis=0))
    rows = np.unique(ids)
    new_rows, new_slots = rule(
      opt, _learning_rate(opt, step), step, table[rows], [x[rows] for x in slots], dense[rows]
    )
    table[rows] = new_rows
    for x, value in zip(slots, new_slots):
      x[rows] = value
    got = unstack_embedding_variables(state, specs, num_sc_per_device=S)["t"]
    np.testing.assert_allclose(got.table, table, rtol=1e-5, atol=1e-6)
    for got_slot, want in zip(got.slots, slots):
      np.testing.assert_allclose(got_slot, want, rtol=1e-5, atol=1e-6)


def test_hyperparameters_and_names():
  assert [
    o.short_name()
    for o in (
      core.SGDOptimizerSpec(),
      core.AdagradOptimizerSpec(),
      core.AdamOptimizerSpec(),
      core.AdagradMomentumOptimizerSpec(),
      core.FTRLOptimizerSpec(),
      core.LaPropOptimizerSpec(),
    )
  ] == ["sgd", "adagrad", "adam", "adagrad_momentum", "ftrl", "laprop"]
  ftrl = core.FTRLOptimizerSpec(0.5, -0.25, 0.125, 0.75, 2.0)
  assert [float(x) for x in ftrl.get_hyperparameters(3)] == [0.5, -0.25, 0.125, 0.75, 2.0]
  assert ftrl.slot_names() == ("accumulator", "linear")
  assert ftrl.slot_variables_count() == 2
  momentum = core.AdagradMomentumOptimizerSpec(use_nesterov=True)
  assert [x.item() for x in momentum.get_hyperparameters()] == [
    np.float32(0.001),
    np.float32(0.9),
    1.0,
    np.float32(1e-10),
    2.0,
    True,
  ]
  assert momentum.slot_names() == ("accumulator", "momentum")
  laprop = core.LaPropOptimizerSpec(b2=0.5)
  assert float(laprop.get_decay_rate()) == 0.5
  assert float(laprop.get_decay_rate(0)) == 0.0
  assert float(laprop.get_decay_rate(1)) == pytest.approx(0.5 * 0.5 / 0.75)
  alpha, b1, b2, eps = core.AdamOptimizerSpec(0.1).get_hyperparameters(0)
  # float32 throughout, as the reference: not 0.1 * sqrt(0.001) / 0.1 exactly.
  assert float(alpha) == pytest.approx(0.1 * math.sqrt(0.001) / 0.1, rel=1e-5)
  assert float(eps) == pytest.approx(1e-8 * math.sqrt(0.001), rel=1e-5)
  assert (float(b1), float(b2)) == (np.float32(0.9), np.float32(0.999))
  with pytest.raises(ValueError, match="rms_clip_threshold=1.0 is not supported"):
    core.LaPropOptimizerSpec(rms_clip_threshold=1.0)


def _adam_steps(spec, steps):
  """[step][scalar] of get_hyperparameters, eagerly and jitted (as the kernel calls it)."""
  jitted = jax.jit(spec.get_hyperparameters)
  eager = [[np.asarray(x) for x in spec.get_hyperparameters(s)] for s in steps]
  traced = [[np.asarray(x) for x in jitted(jnp.int32(s))] for s in steps if s is not None]
  return eager, traced


def test_adam_hyperparameters_are_the_reference_float32_values():
  spec = core.AdamOptimizerSpec(1.0)
  steps = (None, 0, 1, 999)
  eager, traced = _adam_steps(spec, steps)
  f32 = np.float32
  # alpha_0 = sqrt(1 - f32(0.999)) / (1 - f32(0.9)) in float32: 0.31622565,
  # where the exact sqrt(0.001) / 0.1 is 0.31622777.
  assert [x.dtype for x in eager[0]] == [np.float32] * 4
  assert [x.item() for x in eager[1]] == [
    f32(0.31622565),
    f32(0.9),
    f32(0.999),
    f32(3.1622574e-10),
  ]
  assert [[x.item() for x in h[::3]] for h in eager] == [
    [f32(0.31622565), f32(3.1622574e-10)],
    [f32(0.31622565), f32(3.1622574e-10)],
    [f32(0.23531435), f32(4.4709741e-10)],
    [f32(0.7951709), f32(7.951709e-09)],
  ]
  # Jitted, a traced step goes through pow rather than repeated products.
  assert [[x.item() for x in h[::3]] for h in traced] == [
    [f32(0.31622565), f32(3.1622574e-10)],
    [f32(0.23531435), f32(4.4709741e-10)],
    [f32(0.7951728), f32(7.951728e-09)],
  ]
  schedule = core.AdamOptimizerSpec(lambda step: 0.5 / (1 + step))
  assert schedule.get_hyperparameters()[0].item() == f32(0.15811282)  # no step: step 0
  # The update keeps the exact formula: 1 - beta^t without float32 cancellation.
  from sparsepipe.pipeline.embedding import update as embedding_update  # pylint: disable=g-import-not-at-top

  # Within 1 float32 ulp of the exact values: XLA's float32 expm1 moved by an ulp between
  # jaxlib releases (alpha_0 0.31622776 on 0.10.2, 0.31622773 on 0.12.0.1); the reference's
  # float32 cancellation (0.31622565 above) is 71 ulps away.
  update = [x.item() for x in embedding_update.step_hyperparameters(spec, jnp.int32(0))]
  exact = [math.sqrt(0.001) / 0.1, 0.9, 0.999, 1e-8 * math.sqrt(0.001)]
  np.testing.assert_array_max_ulp(np.float32(update), np.float32(exact), maxulp=1)
  embedding_spec = reference_module("nn.embedding_spec")
  if embedding_spec is None:
    return
  for ours, theirs in (
    (spec, embedding_spec.AdamOptimizerSpec(1.0)),
    (
      core.AdamOptimizerSpec(0.1, 0.8, 0.99, 1e-6),
      embedding_spec.AdamOptimizerSpec(0.1, 0.8, 0.99, 1e-6),
    ),
  ):
    for got, want in zip(_adam_steps(ours, steps), _adam_steps(theirs, steps)):
      for g, w in zip(got, want):
        assert [(x.dtype, x.tobytes()) for x in g] == [(x.dtype, x.tobytes()) for x in w]


def test_array_hyperparameters_and_named_slots():
  spec = core.AdamOptimizerSpec(jnp.float32(0.5), beta_1=np.float64(0.75))
  assert (spec.learning_rate, spec.beta_1) == (0.5, 0.75)
  assert hash(spec) == hash(core.AdamOptimizerSpec(0.5, beta_1=0.75))
  with pytest.raises(
    ValueError, match=re.escape("AdamOptimizerSpec: learning_rate must be a scalar, got shape (2,)")
  ):
    core.AdamOptimizerSpec(np.ones(2))
  slots = core.FTRLOptimizerSpec(initial_accumulator_value=0.3).slot_variables_initializers()
  assert slots._fields == ("accumulator", "linear")
  assert slots.accumulator == core.ConstantInitializer(0.3)
  assert core.SGDOptimizerSpec().slot_variables_initializers() == ()


def test_learning_rate_forms():
  assert float(core.SGDOptimizerSpec(0.25).get_learning_rate()) == 0.25
  assert float(core.SGDOptimizerSpec(lambda: 0.5).get_learning_rate(7)) == 0.5
  assert float(core.SGDOptimizerSpec(lambda s: s / 8).get_learning_rate(2)) == 0.25

  class Schedule:
    def __call__(self, count):
      return count * 2.0

  assert float(core.SGDOptimizerSpec(Schedule()).get_learning_rate(3)) == 6.0
  with pytest.raises(ValueError, match="takes the step, but no step was given"):
    core.SGDOptimizerSpec(_schedule).get_learning_rate()
  with pytest.raises(ValueError, match="takes 2 arguments; it must take no"):
    core.SGDOptimizerSpec(lambda a, b: a).get_learning_rate(1)


def test_launcher_names_and_unsupported_optimizer():
  for name, cls in [
    ("ftrl", core.FTRLOptimizerSpec),
    ("laprop", core.LaPropOptimizerSpec),
    ("adagrad_momentum", core.AdagradMomentumOptimizerSpec),
  ]:
    config = ml_collections.ConfigDict(
      {"embedding_optimizer": {"name": name, "learning_rate": 0.5}}
    )
    assert config_specs.embedding_optimizer_spec(config) == cls(0.5)
  from sparsepipe.pipeline.embedding import update as embedding_update  # pylint: disable=g-import-not-at-top

  with pytest.raises(
    UnsupportedOptimizerError,
    match="embedding optimizer str is not supported: embedding optimizers"
    " derive from sparsepipe.core.OptimizerSpec",
  ):
    embedding_update.step_hyperparameters("sgd", 0)


def test_hyperparameters_match_the_reference():
  ref = pytest.importorskip("jax_tpu_embedding.sparsecore.lib.nn.embedding_spec")
  pairs = [
    (core.AdamOptimizerSpec(0.1, 0.8, 0.99, 1e-6), ref.AdamOptimizerSpec(0.1, 0.8, 0.99, 1e-6)),
    (
      core.FTRLOptimizerSpec(0.1, -0.6, 0.1, 0.2, 0.3),
      ref.FTRLOptimizerSpec(0.1, -0.6, 0.1, 0.2, 0.3),
    ),
    (
      core.AdagradMomentumOptimizerSpec(0.1, 0.5, 0.9, 1e-5, 3.0, True),
      ref.AdagradMomentumOptimizerSpec(0.1, 0.5, 0.9, 1e-5, 3.0, True),
    ),
    (core.LaPropOptimizerSpec(0.1, 0.8, 0.9, 1e-6), ref.LaPropOptimizerSpec(0.1, 0.8, 0.9, 1e-6)),
    (core.SGDOptimizerSpec(lambda: 0.3), ref.SGDOptimizerSpec(lambda: 0.3)),
  ]
  for ours, theirs in pairs:
    assert ours.short_name() == theirs.short_name()
    assert ours.slot_variables_count() == theirs.slot_variables_count()
    for step in (0, 5):
      got = ours.get_hyperparameters(step)
      want = theirs.get_hyperparameters(step)
      assert len(got) == len(want)
      for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-6)
    for init, theirs_init in zip(
      ours.slot_variables_initializers(), theirs.slot_variables_initializers()
    ):
      key = jax.random.key(0)
      np.testing.assert_array_equal(init(key, (2, 3)), theirs_init(key, (2, 3), jnp.float32))


def test_a_zero_beta_updates_as_its_power_gives():
  # Adam with beta_1=0 (no momentum) failed every step with "math domain error" (log 0).
  from sparsepipe.pipeline.embedding import update as embedding_update  # pylint: disable=g-import-not-at-top

  spec = core.AdamOptimizerSpec(1.0, beta_1=0.0)
  for step in (0, 1, 999):
    update = [x.item() for x in embedding_update.step_hyperparameters(spec, jnp.int32(step))]
    c2 = math.sqrt(1 - 0.999 ** (step + 1))
    exact = [c2, 0.0, 0.999, 1e-8 * c2]
    np.testing.assert_array_max_ulp(np.float32(update), np.float32(exact), maxulp=2)
  laprop = core.LaPropOptimizerSpec(0.1, b2=0.0)  # decay b2 (1 - b2^s) / (1 - b2^(s+1)) = 0
  assert [laprop.get_decay_rate(s).item() for s in (0, 1, 5)] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
  "make, message",
  [
    (
      lambda: core.SGDOptimizerSpec(-1.0),
      "SGDOptimizerSpec: learning_rate=-1.0 must be in [0, inf)",
    ),
    (
      lambda: core.AdagradOptimizerSpec(float("nan")),
      "AdagradOptimizerSpec: learning_rate=nan must be in [0, inf)",
    ),
    (lambda: core.AdamOptimizerSpec(beta_1=2.0), "AdamOptimizerSpec: beta_1=2.0 must be in [0, 1)"),
    (lambda: core.AdamOptimizerSpec(beta_2=1.0), "AdamOptimizerSpec: beta_2=1.0 must be in [0, 1)"),
    (
      lambda: core.AdamOptimizerSpec(epsilon=-1e-8),
      "AdamOptimizerSpec: epsilon=-1e-08 must be in [0, inf)",
    ),
    (
      lambda: core.AdagradMomentumOptimizerSpec(exponent=0.0),
      "AdagradMomentumOptimizerSpec: exponent=0.0 must be in (0, inf)",
    ),
    (
      lambda: core.AdagradMomentumOptimizerSpec(beta2=1.5),
      "AdagradMomentumOptimizerSpec: beta2=1.5 must be in [0, 1]",
    ),
    (lambda: core.LaPropOptimizerSpec(b1=1.0), "LaPropOptimizerSpec: b1=1.0 must be in [0, 1)"),
  ],
)
def test_hyperparameters_outside_their_range_are_refused_where_given(make, message):
  # They were taken, and made NaN or infinite rows (or a math domain error) in training.
  with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
    make()

"""Embedding optimizer specs: hyperparameters, slots and the row update rule.

One frozen dataclass per optimizer, all derived from `OptimizerSpec`, with the
hyperparameters, defaults and names of jax-tpu-embedding 0.1.0's specs. Each
class holds everything about its optimizer in one place: the slot variables
and their initial values (`slot_defaults`), the per-step scalars
(`get_hyperparameters` as the reference reports them; `update_hyperparameters`,
computed once per step outside shard_map, for the update) and the
update of the touched rows (`update_rows`, jnp on [n, D] rows). The rules
read the step-dependent scalars from the hyperparameters and the constants
from the spec itself (Python floats: constant expressions such as 1 - beta
stay exact). Adding an optimizer is adding one class here (and its name to
the launcher's list).
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import functools
import inspect
import math
from typing import Any, Callable, ClassVar, Union

import jax
import jax.numpy as jnp
import numpy as np

from sparsepipe.core.initializers import ConstantInitializer

# A learning rate is a float, a callable of no argument (`lambda: 0.1`) or a
# schedule `step -> float` (e.g. an optax schedule). Callables are compared by
# identity, which keeps specs hashable.
LearningRate = Union[float, Callable[..., Any]]
Rows = jax.Array
Slots = tuple[jax.Array, ...]

_POSITIONAL = (
  inspect.Parameter.POSITIONAL_ONLY,
  inspect.Parameter.POSITIONAL_OR_KEYWORD,
)


def _wants_step(rate: Callable[..., Any]) -> bool:
  """Whether a learning-rate callable takes the step (else no argument)."""
  try:
    params = inspect.signature(rate).parameters.values()
  except (TypeError, ValueError):  # builtins without a signature
    return True
  positional = [p for p in params if p.kind in _POSITIONAL]
  required = [p for p in positional if p.default is inspect.Parameter.empty]
  if len(required) > 1:
    raise ValueError(
      f"learning rate callable {rate!r} takes {len(required)} arguments;"
      " it must take no argument or a single step count"
    )
  var = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
  return bool(positional) or var


def _f32(value: Any) -> jax.Array:
  return jnp.asarray(value, jnp.float32)


def _one_minus_power(beta: float, t: Any) -> jax.Array:
  """1 - beta^t as -expm1(t log beta): no cancellation when beta^t ~ 1 (beta 0: 1,
  and 0 at t = 0, as the power gives)."""
  if beta == 0:
    return jnp.where(_f32(t) > 0, 1.0, 0.0).astype(jnp.float32)
  return -jnp.expm1(_f32(t) * math.log(beta))


@functools.lru_cache(maxsize=None)
def _slot_tuple(class_name: str, names: tuple[str, ...]) -> type:
  """The namedtuple type of an optimizer's slots (like the reference's)."""
  return collections.namedtuple(class_name, names)


@dataclasses.dataclass(frozen=True)
class OptimizerSpec(abc.ABC):
  """Base of the embedding optimizer specs (frozen, hashable).

  Scalar numpy or jax values given for hyperparameters (the reference
  accepts jax arrays) are stored as Python numbers, so specs stay hashable.
  """

  learning_rate: LearningRate = 0.001
  # Hyperparameter -> its interval, ("[", low, high, ")") for [low, high): values
  # outside made NaN or infinite updates, or a math domain error at the first step.
  _RANGES: ClassVar[dict[str, tuple[str, float, float, str]]] = {}

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if isinstance(value, (np.ndarray, np.generic, jax.Array)):
        if np.ndim(value) != 0:
          raise ValueError(
            f"{type(self).__name__}: {field.name} must be a scalar, got shape {np.shape(value)}"
          )
        object.__setattr__(self, field.name, np.asarray(value).item())
      elif isinstance(value, (str, bytes)) or value is None and field.name == "learning_rate":
        # A number written as text would fail in the first step, far from here.
        raise TypeError(
          f"{type(self).__name__}: {field.name} must be a number"
          + (" or a schedule (a callable)" if field.name == "learning_rate" else "")
          + f", got {type(value).__name__} {value!r}"
        )
    self._check_ranges()

  def _check_ranges(self) -> None:
    ranges = dict(self._RANGES)
    if not callable(self.learning_rate):
      ranges["learning_rate"] = ("[", 0, math.inf, ")")
    for name, (opening, low, high, closing) in ranges.items():
      value = getattr(self, name)
      above = low <= value if opening == "[" else low < value
      below = value <= high if closing == "]" else value < high
      if not (above and below):  # also NaN
        raise ValueError(
          f"{type(self).__name__}: {name}={value!r} must be in {opening}{low}, {high}{closing}"
        )

  def get_learning_rate(self, step: Any = None) -> jax.Array:
    """The learning rate (float32) at `step`; a schedule needs the step."""
    rate = self.learning_rate
    if not callable(rate):
      return _f32(rate)
    if not _wants_step(rate):
      return _f32(rate())
    if step is None:
      raise ValueError(f"learning rate callable {rate!r} takes the step, but no step was given")
    return _f32(rate(step))

  def get_hyperparameters(self, step: Any = None) -> tuple[jax.Array, ...]:
    """The per-step scalars, the reference's values in the reference's order."""
    return (self.get_learning_rate(step),)

  def update_hyperparameters(self, step: Any = None) -> tuple[jax.Array, ...]:
    """The per-step scalars `update_rows` reads: `get_hyperparameters` unless
    an optimizer computes them more exactly (Adam)."""
    return self.get_hyperparameters(step)

  def slot_defaults(self) -> dict[str, float]:
    """Slot variable name -> initial value, in slot order."""
    return {}

  def slot_names(self) -> tuple[str, ...]:
    return tuple(self.slot_defaults())

  def slot_initializers(self) -> tuple[ConstantInitializer, ...]:
    return tuple(ConstantInitializer(v) for v in self.slot_defaults().values())

  def slot_variables_initializers(self) -> tuple[ConstantInitializer, ...]:
    """`slot_initializers` as a namedtuple by slot name, as the reference."""
    names = self.slot_names()
    slot_type = _slot_tuple(type(self).__name__ + "Slots", names)
    return slot_type(*self.slot_initializers())

  def slot_variables_count(self) -> int:
    return len(self.slot_defaults())

  @abc.abstractmethod
  def short_name(self) -> str:
    """Short name of the optimizer (launcher configs, variable names)."""

  @abc.abstractmethod
  def update_rows(
    self, hyper: tuple[jax.Array, ...], rows: Rows, slots: Slots, grads: Rows
  ) -> tuple[Rows, Slots]:
    """New (rows, slots) of touched rows [n, D] given their gradients [n, D]."""


@dataclasses.dataclass(frozen=True)
class SGDOptimizerSpec(OptimizerSpec):
  """Plain SGD on the touched rows: w -= lr * g."""

  def short_name(self) -> str:
    return "sgd"

  def update_rows(self, hyper, rows, slots, grads):
    return rows - hyper[0] * grads, ()


@dataclasses.dataclass(frozen=True)
class AdagradOptimizerSpec(OptimizerSpec):
  """Adagrad: a += g^2; w -= lr * g / sqrt(a)."""

  initial_accumulator_value: float = 0.1

  def slot_defaults(self) -> dict[str, float]:
    return {"accumulator": self.initial_accumulator_value}

  def short_name(self) -> str:
    return "adagrad"

  def update_rows(self, hyper, rows, slots, grads):
    (accumulator,) = slots
    accumulator = accumulator + grads * grads
    return rows - hyper[0] * grads / jnp.sqrt(accumulator), (accumulator,)


@dataclasses.dataclass(frozen=True)
class AdamOptimizerSpec(OptimizerSpec):
  """Lazy Adam (moments decay only on the steps a row is touched).

  m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= alpha_t m / (sqrt(v) +
  eps_hat) with alpha_t = lr sqrt(1-b2^t) / (1-b1^t), eps_hat = eps
  sqrt(1-b2^t), t = step + 1: the bias-corrected form the reference uses.
  The update computes 1 - beta^t as -expm1(t log beta) from the Python
  float betas (`update_hyperparameters`); `get_hyperparameters` reports the
  reference's float32 values, up to 1e-5 relative away from those.
  """

  beta_1: float = 0.9
  beta_2: float = 0.999
  epsilon: float = 1e-8
  _RANGES: ClassVar[dict[str, tuple[str, float, float, str]]] = {
    "beta_1": ("[", 0, 1, ")"),
    "beta_2": ("[", 0, 1, ")"),
    "epsilon": ("[", 0, math.inf, ")"),
  }

  def slot_defaults(self) -> dict[str, float]:
    return {"momentum": 0.0, "velocity": 0.0}

  def get_hyperparameters(self, step: Any = None) -> tuple[jax.Array, ...]:
    """(alpha_t, beta_1, beta_2, epsilon_hat), bit for bit the reference's.

    The betas are rounded to float32 first and every operation is float32
    (1 - b2^t included), as jax-tpu-embedding does, so lr=1 gives alpha_0 =
    0.31622565 where the formula gives 0.31622776. No step counts as step 0
    (also for the learning rate), as in the reference.
    """
    step = 0 if step is None else step
    beta_1, beta_2 = _f32(self.beta_1), _f32(self.beta_2)
    c2 = jnp.sqrt(1.0 - jnp.power(beta_2, step + 1))
    alpha = self.get_learning_rate(step) * c2 / (1.0 - jnp.power(beta_1, step + 1))
    return alpha, beta_1, beta_2, _f32(self.epsilon) * c2

  def update_hyperparameters(self, step: Any = None) -> tuple[jax.Array, ...]:
    """(alpha_t, beta_1, beta_2, epsilon_hat) without float32 cancellation
    (lr=1, step 0: alpha_0 = 0.31622776, to the ulp of XLA's float32 expm1), for the update."""
    t = (0 if step is None else step) + 1
    c2 = jnp.sqrt(_one_minus_power(self.beta_2, t))
    alpha = self.get_learning_rate(step) * c2 / _one_minus_power(self.beta_1, t)
    return alpha, _f32(self.beta_1), _f32(self.beta_2), _f32(self.epsilon) * c2

  def short_name(self) -> str:
    return "adam"

  def update_rows(self, hyper, rows, slots, grads):
    alpha, _, _, eps = hyper
    b1, b2 = self.beta_1, self.beta_2
    momentum, velocity = slots
    momentum = b1 * momentum + (1.0 - b1) * grads
    velocity = b2 * velocity + (1.0 - b2) * grads * grads
    rows = rows - alpha * momentum / (jnp.sqrt(velocity) + eps)
    return rows, (momentum, velocity)


@dataclasses.dataclass(frozen=True)
class AdagradMomentumOptimizerSpec(OptimizerSpec):
  """Adagrad with momentum.

  a = a + g^2 if beta2 == 1 else beta2 a + (1-beta2) g^2;
  s = (a + eps)^(-1/exponent) g; m = momentum m + s;
  w -= lr (momentum m + s if use_nesterov else m).
  """

  momentum: float = 0.9
  beta2: float = 1.0
  epsilon: float = 1e-10
  exponent: float = 2.0
  use_nesterov: bool = False
  initial_accumulator_value: float = 0.1
  initial_momentum_value: float = 0.0
  _RANGES: ClassVar[dict[str, tuple[str, float, float, str]]] = {
    "beta2": ("[", 0, 1, "]"),
    "epsilon": ("[", 0, math.inf, ")"),
    "exponent": ("(", 0, math.inf, ")"),
  }

  def slot_defaults(self) -> dict[str, float]:
    return {
      "accumulator": self.initial_accumulator_value,
      "momentum": self.initial_momentum_value,
    }

  def get_hyperparameters(self, step: Any = None) -> tuple[jax.Array, ...]:
    """(lr, momentum, beta2, epsilon, exponent, use_nesterov)."""
    return (
      self.get_learning_rate(step),
      _f32(self.momentum),
      _f32(self.beta2),
      _f32(self.epsilon),
      _f32(self.exponent),
      jnp.asarray(self.use_nesterov, jnp.bool_),
    )

  def short_name(self) -> str:
    return "adagrad_momentum"

  def update_rows(self, hyper, rows, slots, grads):
    lr, k = hyper[0], self.momentum
    accumulator, momentum = slots
    squared = grads * grads
    if self.beta2 == 1.0:
      accumulator = accumulator + squared
    else:
      accumulator = self.beta2 * accumulator + (1.0 - self.beta2) * squared
    scaled = jnp.power(accumulator + self.epsilon, -1.0 / self.exponent) * grads
    momentum = k * momentum + scaled
    step = k * momentum + scaled if self.use_nesterov else momentum
    return rows - lr * step, (accumulator, momentum)


@dataclasses.dataclass(frozen=True)
class FTRLOptimizerSpec(OptimizerSpec):
  """Follow The Regularized Leader (McMahan et al.), the classic CTR optimizer.

  a' = a + g^2; p = a^(-lr_power) (p' of a'); linear += g - (p' - p) / lr * w
  (with multiply_linear_by_learning_rate: += lr g - (p' - p) w);
  w = (clip(linear, -l1', l1') - linear) / ((p' + beta) / lr + 2 l2)
  (resp. / (p' + 2 lr l2 + beta), and l1' = lr l1).
  """

  learning_rate: LearningRate = 0.01
  learning_rate_power: float = -0.5
  l1_regularization_strength: float = 0.0
  l2_regularization_strength: float = 0.0
  beta: float = 0.0
  initial_accumulator_value: float = 0.1
  initial_linear_value: float = 0.0
  multiply_linear_by_learning_rate: bool = False

  def slot_defaults(self) -> dict[str, float]:
    return {
      "accumulator": self.initial_accumulator_value,
      "linear": self.initial_linear_value,
    }

  def get_hyperparameters(self, step: Any = None) -> tuple[jax.Array, ...]:
    """(lr, learning_rate_power, l1, l2, beta)."""
    return (
      self.get_learning_rate(step),
      _f32(self.learning_rate_power),
      _f32(self.l1_regularization_strength),
      _f32(self.l2_regularization_strength),
      _f32(self.beta),
    )

  def short_name(self) -> str:
    return "ftrl"

  def update_rows(self, hyper, rows, slots, grads):
    lr, power = hyper[0], self.learning_rate_power
    l1 = self.l1_regularization_strength
    l2, beta = self.l2_regularization_strength, self.beta
    accumulator, linear = slots
    new_accumulator = accumulator + grads * grads
    p_new = jnp.power(new_accumulator, -power)
    delta = p_new - jnp.power(accumulator, -power)
    if self.multiply_linear_by_learning_rate:
      linear = linear + lr * grads - delta * rows
      l1_scaled = l1 * lr
      denominator = p_new + 2.0 * lr * l2 + beta
    else:
      linear = linear + grads - delta / lr * rows
      l1_scaled = l1
      denominator = (p_new + beta) / lr + 2.0 * l2
    if l1 == 0.0:
      numerator = -linear
    else:
      numerator = jnp.clip(linear, -l1_scaled, l1_scaled) - linear
    return numerator / denominator, (new_accumulator, linear)


@dataclasses.dataclass(frozen=True)
class LaPropOptimizerSpec(OptimizerSpec):
  """LaProp (Ziyin et al. 2020): Adam with momentum after normalisation.

  d = b2 (1 - b2^step) / (1 - b2^(step+1)); nu = d nu + (1-d) (g^2 + eps);
  mu = b1 mu + sqrt(1 - b1^2) g / sqrt(nu); w -= lr mu.
  """

  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-30
  rms_clip_threshold: float | None = None
  initial_slot_value: float = 0.0
  _RANGES: ClassVar[dict[str, tuple[str, float, float, str]]] = {
    "b1": ("[", 0, 1, ")"),
    "b2": ("[", 0, 1, ")"),
    "eps": ("[", 0, math.inf, ")"),
  }

  def __post_init__(self):
    super().__post_init__()
    if self.rms_clip_threshold is not None:
      raise ValueError(
        f"LaPropOptimizerSpec: rms_clip_threshold={self.rms_clip_threshold}"
        " is not supported (as in jax-tpu-embedding 0.1.0); leave it None"
      )

  def slot_defaults(self) -> dict[str, float]:
    return {"mu": self.initial_slot_value, "nu": self.initial_slot_value}

  def get_decay_rate(self, step: Any = None) -> jax.Array:
    """b2 without a step, else b2 (1 - b2^step) / (1 - b2^(step+1))."""
    if step is None:
      return _f32(self.b2)
    return self.b2 * _one_minus_power(self.b2, step) / _one_minus_power(self.b2, _f32(step) + 1.0)

  def get_hyperparameters(self, step: Any = None) -> tuple[jax.Array, ...]:
    """(lr, b1, decay_rate, eps)."""
    return (
      self.get_learning_rate(step),
      _f32(self.b1),
      self.get_decay_rate(step),
      _f32(self.eps),
    )

  def short_name(self) -> str:
    return "laprop"

  def update_rows(self, hyper, rows, slots, grads):
    lr, _, decay, _ = hyper
    b1 = self.b1
    mu, nu = slots
    nu = decay * nu + (1.0 - decay) * (grads * grads + self.eps)
    mu = b1 * mu + math.sqrt(1.0 - b1 * b1) * (grads / jnp.sqrt(nu))
    return rows - lr * mu, (mu, nu)

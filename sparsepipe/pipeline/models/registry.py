"""Models by name (`config.model.name`) or by factory (`config.model.factory`).

`make_model(model_config)` returns the model of a job's `config.model`:
a built-in by name ("dlrm", "dcn_v2"), or, when `factory` is set, what
`package.module:function` returns when called with `model_config` itself
(so a user's model reads its own fields). Anything with `init` and `apply`
(models/model_protocol.py) is a model; nothing in sparsepipe needs to change for it.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from sparsepipe.pipeline.models.model_protocol import Model
from sparsepipe.pipeline.models.dcn_v2 import DCNv2
from sparsepipe.pipeline.models.dlrm import DLRM


def _field(model_config: Any, name: str, model: str) -> Any:
  try:
    return model_config[name]
  except (KeyError, AttributeError):
    raise ValueError(f"config.model has no field '{name}', which model '{model}' needs") from None


def dlrm_from_config(model_config: Any) -> DLRM:
  """DLRM(bottom_mlp_dims, top_mlp_dims) from config.model."""
  return DLRM(
    bottom_mlp_dims=tuple(_field(model_config, "bottom_mlp_dims", "dlrm")),
    top_mlp_dims=tuple(_field(model_config, "top_mlp_dims", "dlrm")),
  )


def dcn_v2_from_config(model_config: Any) -> DCNv2:
  """DCNv2(cross_layers, cross_rank, mlp_dims=top_mlp_dims) from config.model."""
  return DCNv2(
    cross_layers=int(_field(model_config, "cross_layers", "dcn_v2")),
    cross_rank=int(_field(model_config, "cross_rank", "dcn_v2")),
    mlp_dims=tuple(_field(model_config, "top_mlp_dims", "dcn_v2")),
  )


BUILTIN_MODELS: dict[str, Callable[[Any], Model]] = {
  "dlrm": dlrm_from_config,
  "dcn_v2": dcn_v2_from_config,
}


def load_factory(spec: str) -> Callable[[Any], Any]:
  """The function named by 'package.module:function' (imported now)."""
  module_name, sep, attr = spec.partition(":")
  where = f"config.model.factory='{spec}'"
  if not sep or not module_name or not attr.isidentifier():
    raise ValueError(f"{where} is not of the form 'package.module:function'")
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise ValueError(
      f"{where}: cannot import module '{module_name}' ({type(e).__name__}: {e}); it must be"
      " importable where the job runs (e.g. a file in the working directory, or installed)"
    ) from e
  factory = getattr(module, attr, None)
  if not callable(factory):
    raise ValueError(f"{where}: module '{module_name}' has no function '{attr}'")
  return factory


def make_model(model_config: Any) -> Model:
  """The model of `config.model` (a built-in name, or a user factory)."""
  factory = str(model_config.get("factory", "") or "")
  if factory:
    model, what = load_factory(factory)(model_config), f"config.model.factory='{factory}'"
  else:
    name = str(model_config.get("name", "dlrm"))
    if name not in BUILTIN_MODELS:
      raise ValueError(
        f"config.model.name='{name}' is not a built-in model {sorted(BUILTIN_MODELS)};"
        " give your own with config.model.factory='package.module:function'"
      )
    model, what = BUILTIN_MODELS[name](model_config), f"config.model.name='{name}'"
  missing = [m for m in ("init", "apply") if not callable(getattr(model, m, None))]
  if missing:
    raise ValueError(
      f"{what} made a {type(model).__name__}, which has no {' or '.join(missing)}: a model is"
      " an object with init(rng, dense_dim, feature_dims) and apply(params, dense, embeddings)"
    )
  return model


def model_name(model_config: Any) -> str:
  """What names the model in messages and exports: the factory, else the built-in name."""
  return str(model_config.get("factory", "") or model_config.get("name", "dlrm"))

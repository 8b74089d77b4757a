"""The generic pipelining API, tested with small toy stages.

The toy SC stages look up rows of a replicated table by ids (weights 0 mean
"no id", so zero inputs touch nothing) and update the touched rows with
Adagrad; the toy TC stage is a linear model trained with optax Adam. Aux
values carry batch ids so the schedule can be read off the outputs.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from sparsepipe import pipeline
from sparsepipe.core.mesh import DATA_AXIS, make_mesh

# The buffered inputs of step i-2 are donated but have no output to alias.
pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")

B, V, D, K, ND = 16, 32, 4, 3, 5
_OPT = optax.adam(0.05)


class Sparse(NamedTuple):
  ids: jax.Array  # [B, K] int32
  weights: jax.Array  # [B, K] float32; 0 = no id
  batch_id: jax.Array  # int32 scalar


class Dense(NamedTuple):
  x: jax.Array  # [B, ND]
  y: jax.Array  # [B]


def sc_fwd(sparse, emb):
  act = jnp.einsum("bk,bkd->bd", sparse.weights, emb["table"][sparse.ids])
  return act, sparse.batch_id


def tc(act, dense, state, sc_fwd_aux):
  def loss_fn(params, act):
    h = jnp.concatenate([act, dense.x], axis=1) @ params["w"]
    return jnp.mean((h[:, 0] - dense.y) ** 2)

  loss, (gp, ga) = jax.value_and_grad(loss_fn, argnums=(0, 1))(state["params"], act)
  updates, opt = _OPT.update(gp, state["opt"], state["params"])
  new_state = {
    "params": optax.apply_updates(state["params"], updates),
    "opt": opt,
    "step": state["step"] + 1,
  }
  return ga, {"loss": loss, "batch_id": sc_fwd_aux}, new_state, state["step"]


def sc_bwd(sparse, grads, emb, tc_aux):
  contrib = sparse.weights[..., None] * grads[:, None, :]
  g = jnp.zeros_like(emb["table"]).at[sparse.ids].add(contrib)
  acc = emb["acc"] + g * g
  return {"table": emb["table"] - 0.1 * g / jnp.sqrt(acc), "acc": acc}, tc_aux


def make_batch(i: int) -> pipeline.CurrentStepInput:
  r = np.random.default_rng(i)
  return pipeline.CurrentStepInput(
    sparse_inputs=Sparse(
      jnp.asarray(r.integers(0, V, (B, K)), jnp.int32),
      jnp.asarray(r.uniform(0.5, 1.5, (B, K)), jnp.float32),
      jnp.int32(i),
    ),
    dense_inputs=Dense(
      jnp.asarray(r.normal(size=(B, ND)), jnp.float32),
      jnp.asarray(r.normal(size=(B,)), jnp.float32),
    ),
  )


def initial_states():
  params = {"w": 0.3 * jax.random.normal(jax.random.key(0), (D + ND, 1))}
  state = {"params": params, "opt": _OPT.init(params), "step": jnp.int32(0)}
  emb = {
    "table": jax.random.normal(jax.random.key(1), (V, D)),
    "acc": jnp.full((V, D), 0.1, jnp.float32),
  }
  return state, emb


def copy(tree):
  return jax.tree.map(jnp.copy, tree)


class Runner:
  """A jitted pipelined train step over the toy stages, counting traces."""

  def __init__(self, mesh, multiplier=False, stages=(sc_fwd, tc, sc_bwd)):
    self.mesh, self.multiplier, self.stages = mesh, multiplier, stages
    self.traces = []
    state, emb = initial_states()
    abstract = pipeline.get_abstract_pipeline_state(make_batch(0), state, emb, stages[0], stages[1])
    self.sharding = pipeline.get_pipeline_state_sharding(abstract, mesh)
    self.input_sharding = pipeline.pipeline_input_sharding(self.sharding)
    rep = NamedSharding(mesh, PartitionSpec())

    def train_step(inp, state, emb, pstate, num_steps, fake_tc_step):
      self.traces.append(fake_tc_step)
      return pipeline.step(
        inp,
        state,
        emb,
        pstate,
        *stages,
        fake_tc_step=fake_tc_step,
        num_steps=num_steps if multiplier else None,
      )

    self.jitted = jax.jit(
      train_step,
      static_argnums=(5,),
      donate_argnums=(0, 1, 2, 3),
      in_shardings=(self.input_sharding, rep, rep, self.sharding, rep),
      out_shardings=(rep, rep, rep, rep, self.sharding),
    )

  def run(self, n, batches=None):
    state, emb = initial_states()
    batches = batches or [make_batch(i) for i in range(n)]
    pstate = pipeline.get_initial_state(
      batches[0],
      state,
      emb,
      self.stages[0],
      self.stages[1],
      sharding=self.sharding,
    )
    rep = NamedSharding(self.mesh, PartitionSpec())
    state, emb = jax.device_put(copy((state, emb)), rep)
    outputs = []
    for i in range(pipeline.get_pipeline_train_steps(n)):
      if i < n:
        inp = jax.device_put(copy(batches[i]), self.input_sharding)
      else:
        inp = pipeline.get_dummy_input(pstate)
      fake = pipeline.is_fake_tc_step(i, n) and not self.multiplier
      out, aux, state, emb, pstate = self.jitted(inp, state, emb, pstate, jnp.int32(n), fake)
      outputs.append((out, aux))
    return state, emb, pstate, outputs


def delayed_sequential(n, stages=(sc_fwd, tc, sc_bwd)):
  """Plain loop whose embedding update of batch k lands before batch k+2."""
  fwd, tcf, bwd = (jax.jit(f) for f in stages)
  state, emb = initial_states()
  batches = [make_batch(i) for i in range(n)]
  grads, losses = [], []
  for k in range(n):
    if k >= 2:
      emb, _ = bwd(batches[k - 2].sparse_inputs, grads[k - 2], emb, jnp.int32(k - 2))
    act, aux = fwd(batches[k].sparse_inputs, emb)
    g, out, state, _ = tcf(act, batches[k].dense_inputs, state, aux)
    grads.append(g)
    losses.append(out["loss"])
  for k in range(max(n - 2, 0), n):
    emb, _ = bwd(batches[k].sparse_inputs, grads[k], emb, jnp.int32(k))
  return state, emb, losses


@pytest.fixture(scope="module")
def mesh():
  return make_mesh()


@pytest.fixture(scope="module")
def fake_run(mesh):
  runner = Runner(mesh)
  return runner, runner.run(5)


def assert_close(actual, expected):
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(actual), jax.tree.leaves(expected)):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype, jax.tree_util.keystr(path)
    if np.issubdtype(a.dtype, np.integer):
      np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
    else:
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=jax.tree_util.keystr(path))


def test_steps_and_validity():
  assert pipeline.get_pipeline_train_steps(5) == 7
  assert [pipeline.is_output_valid(i, 3) for i in range(5)] == [
    False,
    True,
    True,
    True,
    False,
  ]
  assert [pipeline.is_fake_tc_step(i, 3) for i in range(5)] == [
    True,
    False,
    False,
    False,
    True,
  ]
  with pytest.raises(ValueError, match="num_steps=-1 must be >= 0"):
    pipeline.get_pipeline_train_steps(-1)


def test_schedule_and_aux_flow(fake_run):
  _, (_, _, pstate, outputs) = fake_run
  # Output of step i belongs to batch i-1; zeros in the fill/drain steps.
  assert [int(o["batch_id"]) for o, _ in outputs] == [0, 0, 1, 2, 3, 4, 0]
  assert float(outputs[0][0]["loss"]) == 0.0
  assert float(outputs[6][0]["loss"]) == 0.0
  # SC bwd of step i sees the TC aux (train step) of batch i-2.
  assert [int(a) for _, a in outputs] == [0, 0, 0, 1, 2, 3, 4]
  assert int(pstate.pipeline_step) == 7


def test_matches_delayed_sequential_loop(fake_run):
  _, (state, emb, _, outputs) = fake_run
  ref_state, ref_emb, ref_losses = delayed_sequential(5)
  assert_close((state, emb), (ref_state, ref_emb))
  np.testing.assert_allclose(
    [float(o["loss"]) for o, _ in outputs[1:6]],
    [float(l) for l in ref_losses],
    rtol=1e-6,
  )
  assert int(state["step"]) == 5


def test_no_retrace_after_step_one(fake_run):
  runner, _ = fake_run
  # One fill program (step 0, reused by the drain) and one steady program.
  assert runner.traces == [True, False]
  runner.run(3)
  assert runner.traces == [True, False]


def test_gradient_multiplier_mode_one_program_same_result(mesh, fake_run):
  _, (state, emb, _, outputs) = fake_run
  runner = Runner(mesh, multiplier=True)
  m_state, m_emb, _, m_outputs = runner.run(5)
  assert runner.traces == [False]
  assert_close((m_state, m_emb), (state, emb))
  assert [int(o["batch_id"]) for o, _ in m_outputs] == [0, 0, 1, 2, 3, 4, 0]
  assert float(m_outputs[0][0]["loss"]) == 0.0


def test_gradient_multiplier_mode_blocks_nans_of_dummy_steps(mesh):
  def nan_tc(act, dense, state, aux):
    # Normalising by the batch's norm gives NaN on the zero dummy batches.
    act = act / jnp.linalg.norm(dense.x)
    return tc(act, dense, state, aux)

  runner = Runner(mesh, multiplier=True, stages=(sc_fwd, nan_tc, sc_bwd))
  state, emb, _, outputs = runner.run(3)
  for leaf in jax.tree.leaves((state, emb)):
    assert np.all(np.isfinite(np.asarray(leaf)))
  assert float(outputs[0][0]["loss"]) == 0.0
  assert np.isfinite(float(outputs[1][0]["loss"]))


def test_donation_updates_state_in_place(mesh):
  runner = Runner(mesh)
  state, emb = jax.device_put(copy(initial_states()), NamedSharding(mesh, PartitionSpec()))
  batches = [make_batch(i) for i in range(4)]
  pstate = pipeline.get_initial_state(batches[0], state, emb, sc_fwd, tc, sharding=runner.sharding)
  pointer = lambda x: [s.data.unsafe_buffer_pointer() for s in x.addressable_shards]
  for i in range(4):
    inp = jax.device_put(copy(batches[i]), runner.input_sharding)
    before = (pointer(emb["table"]), pointer(state["opt"][0].mu["w"]))
    old_table = emb["table"]
    _, _, state, emb, pstate = runner.jitted(inp, state, emb, pstate, jnp.int32(4), i == 0)
    assert old_table.is_deleted()
    assert (pointer(emb["table"]), pointer(state["opt"][0].mu["w"])) == before


def test_initial_state_zeros_with_shardings(mesh):
  state, emb = initial_states()
  abstract = pipeline.get_abstract_pipeline_state(make_batch(0), state, emb, sc_fwd, tc)
  sharding = pipeline.get_pipeline_state_sharding(abstract, mesh)
  init = pipeline.get_initial_state(make_batch(0), state, emb, sc_fwd, tc, sharding=sharding)
  data = NamedSharding(mesh, PartitionSpec(DATA_AXIS))
  assert init.last_step_inputs.sparse_inputs.ids.sharding == data
  assert init.last_step_inputs.embedding_activations.sharding == data
  assert init.step_before_last_step_inputs.tc_aux.sharding.spec == PartitionSpec()
  assert int(init.pipeline_step) == 0
  for leaf in jax.tree.leaves(init):
    assert not np.any(np.asarray(leaf))
  with_sharding = pipeline.get_abstract_pipeline_state(
    make_batch(0), state, emb, sc_fwd, tc, sharding=sharding
  )
  assert jax.tree.map(lambda x: (x.shape, x.dtype, x.sharding), with_sharding) == (
    jax.tree.map(lambda x: (x.shape, x.dtype, x.sharding), init)
  )
  act = with_sharding.last_step_inputs.embedding_activations
  assert (act.shape, act.dtype) == ((B, D), jnp.float32)


def test_sharding_overrides_and_errors(mesh):
  state, emb = initial_states()
  abstract = pipeline.get_abstract_pipeline_state(make_batch(0), state, emb, sc_fwd, tc)
  rep = NamedSharding(mesh, PartitionSpec())
  sharding = pipeline.get_pipeline_state_sharding(abstract, mesh, dense_input_sharding=rep)
  assert sharding.last_step_inputs.dense_inputs.x == rep
  bad = abstract.replace(
    last_step_inputs=abstract.last_step_inputs.replace(
      embedding_activations=jax.ShapeDtypeStruct((12, D), jnp.float32)
    )
  )
  with pytest.raises(
    ValueError,
    match=r"pipeline state embedding_activations: leading dimension 12 is not"
    r" divisible by the 8 devices of mesh axis 'data'",
  ):
    pipeline.get_pipeline_state_sharding(bad, mesh)
  with pytest.raises(ValueError, match="pipeline state tc_aux: sharding tree"):
    pipeline.get_pipeline_state_sharding(abstract, mesh, tc_aux_sharding=[rep, rep])


def test_dummy_input_from_state_keeps_shapes_and_shardings(fake_run):
  runner, _ = fake_run
  state, emb = initial_states()
  pstate = pipeline.get_initial_state(
    make_batch(0), state, emb, sc_fwd, tc, sharding=runner.sharding
  )
  dummy = pipeline.get_dummy_input(pstate)
  expected = pipeline.pipeline_input_sharding(runner.sharding)
  assert jax.tree.map(lambda x: x.sharding, dummy) == expected
  assert dummy.sparse_inputs.ids.shape == (B, K)
  assert not np.any(np.asarray(dummy.dense_inputs.x))


def test_stage_changing_dtype_is_an_error():
  state, emb = initial_states()
  batch = make_batch(0)
  pstate = pipeline.get_initial_state(batch, state, emb, sc_fwd, tc)

  def bad_fwd(sparse, emb):
    act, aux = sc_fwd(sparse, emb)
    return act.astype(jnp.float16), aux

  with pytest.raises(
    ValueError,
    match=r"pipeline step: the pipeline state\.last_step_inputs\."
    r"embedding_activations came out as float16\[16, 4\] but went in as"
    r" float32\[16, 4\]",
  ):
    pipeline.step(batch, state, emb, pstate, bad_fwd, tc, sc_bwd, fake_tc_step=False)


def test_fake_tc_step_with_multiplier_is_an_error():
  state, emb = initial_states()
  batch = make_batch(0)
  pstate = pipeline.get_initial_state(batch, state, emb, sc_fwd, tc)
  with pytest.raises(ValueError, match="fake_tc_step=True cannot be combined"):
    pipeline.step(
      batch,
      state,
      emb,
      pstate,
      sc_fwd,
      tc,
      sc_bwd,
      fake_tc_step=True,
      num_steps=jnp.int32(3),
    )

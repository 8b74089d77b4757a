"""The training loop with the real embedding kernels, DLRM and ZeRO.

Two tables (Adam; SGD of dim 4, projected by the DLRM) on 8 CPU devices
with 2 SparseCores each, 5 batches of 32 examples.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from sparsepipe import pipeline
from sparsepipe.pipeline.input import device_buffer
from sparsepipe.pipeline.training import train_state as train_state_lib
from sparsepipe.pipeline.embedding.variables import abstract_embedding_variables
from sparsepipe.pipeline.embedding.variables import init_embedding_variables
from sparsepipe.core.mesh import data_sharding, make_mesh
from sparsepipe.core import specs
from sparsepipe.core import TrainBatch
from sparsepipe import transforms
from sparsepipe.transforms import prepare_feature_specs_for_training
from sparsepipe.transforms import preprocess_sparse_dense_matmul_input

pytestmark = pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")

G, S, B, ND, N = 8, 2, 32, 5, 5
_TABLES = (
  ("t0", 64, 8, specs.AdamOptimizerSpec(0.01)),
  ("t2", 48, 4, specs.SGDOptimizerSpec(0.1)),
)


class Setup:
  """Specs, batches, model and a shared trainer (its programs compile once)."""

  def __init__(self):
    self.mesh = make_mesh()
    tables = [
      specs.TableSpec(
        name=name,
        vocabulary_size=vocab,
        embedding_dim=dim,
        combiner="mean",
        max_ids_per_partition=8,
        max_unique_ids_per_partition=8,
        optimizer=opt,
      )
      for name, vocab, dim, opt in _TABLES
    ]
    raw = {
      f"f{i}": specs.FeatureSpec(f"f{i}", t, (B, 3), (B, t.embedding_dim))
      for i, t in enumerate(tables)
    }
    self.feature_specs = prepare_feature_specs_for_training(raw, G, S)
    self.host_batches = [self._host_batch(i) for i in range(N)]
    self.model = pipeline.DLRM(bottom_mlp_dims=(16, 8), top_mlp_dims=(16,))
    self.feature_dims = pipeline.feature_dims_of(self.feature_specs)
    self.optimizer = pipeline.zero_sharded(optax.adam(0.01), self.mesh)
    self.tc = pipeline.make_tc_stage(self.model, self.optimizer, self.mesh, self.feature_specs)
    params = self.model.init(jax.random.key(0), ND, self.feature_dims)
    emb = init_embedding_variables(
      jax.random.key(1), self.feature_specs, self.mesh, num_sc_per_device=S
    )
    state = train_state_lib.create_train_state(self.optimizer, params, self.mesh, emb)
    self.state_sharding = jax.tree.map(lambda x: x.sharding, state)
    self.host_state = host(state)
    self.trainer = self.make_trainer()

  def make_trainer(self, feature_specs=None, batch=None, **options):
    """A trainer of this setup's model (for other limits: their specs and a batch of them)."""
    return pipeline.make_trainer(
      self.mesh,
      self.fresh_state(),
      self.batch(0) if batch is None else batch,
      self.tc,
      feature_specs=feature_specs or self.feature_specs,
      num_sc_per_device=S,
      **options,
    )

  def _host_batch(self, i, feature_specs=None):
    r = np.random.default_rng(i)
    feats = {
      f"f{j}": r.integers(0, vocab, (B, 3)).astype(np.int32)
      for j, (_, vocab, _, _) in enumerate(_TABLES)
    }
    pre, _ = preprocess_sparse_dense_matmul_input(
      feats, None, feature_specs or self.feature_specs, G, G, num_sc_per_device=S
    )
    return TrainBatch(
      labels=r.integers(0, 2, (B,)).astype(np.float32),
      dense=r.normal(size=(B, ND)).astype(np.float32),
      sparse=pre.sparse_dense_matmul_input,
    )

  def batch(self, i):
    """A fresh device copy of batch i (the step donates its input)."""
    return jax.device_put(self.host_batches[i], data_sharding(self.mesh))

  def batches(self, start=0):
    return (self.batch(i) for i in range(start, N))

  def fresh_state(self):
    """The initial TrainState (made once; fresh device copies each call)."""
    return jax.device_put(self.host_state, self.state_sharding)


@pytest.fixture(scope="module")
def setup():
  return Setup()


@pytest.fixture(scope="module")
def full_run(setup):
  return pipeline.train(setup.trainer, setup.fresh_state(), setup.batches(), N)


def host(tree):
  return jax.tree.map(np.asarray, tree)


def reference_run(setup, *, delayed=True):
  """Non-pipelined loop; with `delayed` the embedding updates land one step late.

  Run (and compiled) once per mode: the tests only read its state and losses."""
  runs = setup.__dict__.setdefault("reference_runs", {})
  if delayed not in runs:
    runs[delayed] = _reference_run(setup, delayed=delayed)
  return runs[delayed]


def _reference_run(setup, *, delayed):
  fwd = jax.jit(
    pipeline.get_default_sc_fwd_function(setup.feature_specs, setup.mesh, num_sc_per_device=S)
  )
  bwd = jax.jit(
    pipeline.get_default_sc_bwd_function(setup.feature_specs, setup.mesh, num_sc_per_device=S)
  )
  tc = jax.jit(setup.tc)
  state = setup.fresh_state()
  tc_state, emb = state.replace(embedding_variables=None), state.embedding_variables
  grads, losses = [], []
  for k in range(N):
    if delayed and k >= 2:
      emb, _ = bwd(setup.batch(k - 2).sparse, grads[k - 2], emb, jnp.int32(k - 2))
    batch = setup.batch(k)
    act, aux = fwd(batch.sparse, emb)
    g, out, tc_state, _ = tc(act, pipeline.DenseInputs(batch.labels, batch.dense), tc_state, aux)
    grads.append(g)
    losses.append(float(out["loss"]))
    if not delayed:
      emb, _ = bwd(batch.sparse, g, emb, jnp.int32(k))
  for k in (N - 2, N - 1) if delayed else ():
    emb, _ = bwd(setup.batch(k).sparse, grads[k], emb, jnp.int32(k))
  return tc_state.replace(embedding_variables=emb), losses


def assert_trees(actual, expected, exact):
  a_leaves = jax.tree_util.tree_leaves_with_path(actual)
  e_leaves = jax.tree.leaves(expected)
  assert len(a_leaves) == len(e_leaves)
  for (path, a), b in zip(a_leaves, e_leaves):
    a, b = np.asarray(a), np.asarray(b)
    msg = jax.tree_util.keystr(path)
    if exact or np.issubdtype(a.dtype, np.integer):
      np.testing.assert_array_equal(a, b, err_msg=msg)
    else:
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=msg)


def test_sequential_mode_updates_the_tables_before_the_next_lookup(setup):
  """pipelining=False: each batch's lookup, dense step and update in one step."""
  trainer = setup.make_trainer(pipelining=False)
  seen = []
  state, pstate, metrics = pipeline.train(
    trainer,
    setup.fresh_state(),
    setup.batches(),
    N,
    hooks=(lambda result: seen.append((result.next_pipeline_step, result.batch_index)),),
  )
  assert seen == [(k + 1, k) for k in range(N)]  # no fill or drain steps
  assert metrics.batch_indices == tuple(range(N)) and metrics.finished
  assert trainer.traced_programs == (False,)
  ref_state, ref_losses = reference_run(setup, delayed=False)
  assert_trees(state, ref_state, exact=False)
  np.testing.assert_allclose(metrics.losses, ref_losses, rtol=1e-6)
  assert int(state.step) == N and int(pstate.pipeline_step) == N
  # The delay is real: with it, batch 1 is looked up before batch 0's update.
  delayed_losses = reference_run(setup, delayed=True)[1]
  assert delayed_losses[0] == pytest.approx(ref_losses[0], rel=1e-6)
  for delayed, sequential in zip(delayed_losses[1:], ref_losses[1:]):
    assert delayed != pytest.approx(sequential, rel=1e-6)


def test_pipelined_training_equals_delayed_sequential(setup, full_run):
  state, pstate, metrics = full_run
  ref_state, ref_losses = reference_run(setup)
  assert_trees(state, ref_state, exact=False)
  np.testing.assert_allclose(metrics.losses, ref_losses, rtol=1e-6)
  assert int(state.step) == N
  assert int(pstate.pipeline_step) == N + 2


def test_metrics(full_run):
  _, _, metrics = full_run
  assert metrics.batch_indices == (0, 1, 2, 3, 4)
  assert len(metrics.losses) == N
  assert (metrics.first_pipeline_step, metrics.next_pipeline_step) == (0, N + 2)
  assert metrics.finished
  assert metrics.examples == N * B
  assert metrics.examples_per_second > 0


def test_hooks_see_every_step_and_a_true_return_stops(setup, full_run):
  _, _, full_metrics = full_run
  seen = []

  def record(result):
    loss = None if result.output is None else float(result.output["loss"])
    seen.append(
      (
        result.next_pipeline_step,
        result.batch_index,
        loss,
        result.finished,
        int(result.train_state.step),
        int(result.pipeline_state.pipeline_step),
      )
    )

  def stop_at_three(result):
    return result.next_pipeline_step == 3

  _, pstate, metrics = pipeline.train(
    setup.trainer, setup.fresh_state(), setup.batches(), N, hooks=(stop_at_three, record)
  )
  # The hook after the stopping one still ran for that step.
  assert seen == [
    (1, None, None, False, 0, 1),
    (2, 0, full_metrics.losses[0], False, 1, 2),
    (3, 1, full_metrics.losses[1], False, 2, 3),
  ]
  assert metrics.next_pipeline_step == 3 and int(pstate.pipeline_step) == 3


def checkpoint_roundtrip(setup, state, pstate):
  """What a checkpoint does: host copies, then arrays with the same shardings."""
  put = lambda tree, sharding: jax.tree.map(lambda x, s: jax.device_put(x, s), host(tree), sharding)
  return (
    put(state, setup.trainer.train_state_sharding),
    put(pstate, setup.trainer.pipeline_state_sharding),
  )


@pytest.mark.parametrize("stop_after", [1, 3, 6])
def test_stop_and_resume_is_bit_identical(setup, full_run, stop_after):
  full_state, full_pstate, full_metrics = full_run
  iterator = setup.batches()
  state, pstate, first = pipeline.train(
    setup.trainer,
    setup.fresh_state(),
    iterator,
    N,
    max_pipeline_steps=stop_after,
  )
  assert first.next_pipeline_step == stop_after and not first.finished
  consumed = min(stop_after, N)
  state, pstate = checkpoint_roundtrip(setup, state, pstate)
  state, pstate, second = pipeline.train(
    setup.trainer, state, setup.batches(consumed), N, pipeline_state=pstate
  )
  assert second.first_pipeline_step == stop_after and second.finished
  assert first.batch_indices + second.batch_indices == full_metrics.batch_indices
  assert first.losses + second.losses == full_metrics.losses
  assert_trees((state, pstate), (full_state, full_pstate), exact=True)


def test_gradient_multiplier_trainer_matches(setup, full_run):
  trainer = setup.make_trainer(gradient_multiplier=True)
  state, _, metrics = pipeline.train(trainer, setup.fresh_state(), setup.batches(), N)
  assert trainer.traced_programs == (False,)
  assert_trees(state, full_run[0], exact=False)
  np.testing.assert_allclose(metrics.losses, full_run[2].losses, rtol=1e-6)
  with pytest.raises(ValueError, match="fake_tc_step must be False"):
    trainer.run_pipeline_step(state, None, None, True, num_batches=N)


def test_two_programs_only(setup, full_run):
  del full_run
  # Every run in this module (full, resumed, stopped) reused them.
  assert setup.trainer.traced_programs == (True, False)


def test_abstract_states_match_the_real_ones(setup, full_run):
  state, pstate, _ = full_run
  abstract_ts = train_state_lib.abstract_train_state(
    setup.optimizer,
    jax.eval_shape(lambda k: setup.model.init(k, ND, setup.feature_dims), jax.random.key(0)),
    setup.mesh,
    abstract_embedding_variables(setup.feature_specs, setup.mesh, num_sc_per_device=S),
  )
  describe = lambda t: jax.tree.map(lambda x: (x.shape, x.dtype, x.sharding), t)
  assert describe(abstract_ts) == describe(state)
  assert describe(setup.trainer.abstract_pipeline_state) == describe(pstate)


def test_short_iterator_and_bad_state_are_errors(setup):
  with pytest.raises(ValueError, match="data iterator ended at batch 3; num_batches=5"):
    pipeline.train(setup.trainer, setup.fresh_state(), (setup.batch(i) for i in range(3)), N)
  pstate = setup.trainer.initial_pipeline_state()
  pstate = pstate.replace(pipeline_step=jnp.int32(9))
  with pytest.raises(ValueError, match=r"pipeline step 9, outside 0\.\.7 for num_batches=5"):
    pipeline.train(
      setup.trainer,
      setup.fresh_state(),
      setup.batches(),
      N,
      pipeline_state=pstate,
    )


def test_default_sc_bwd_on_dummy_inputs_is_a_no_op(setup):
  """Zero COO buffers (fill/drain) leave tables and Adam slots untouched."""
  bwd = pipeline.get_default_sc_bwd_function(setup.feature_specs, setup.mesh, num_sc_per_device=S)
  state = setup.fresh_state()
  dummy = pipeline.get_dummy_input(setup.trainer.abstract_input, setup.trainer.input_sharding)
  grads = jax.tree.map(lambda f: jnp.ones(f.output_shape, jnp.float32), setup.feature_specs)
  before = host(state.embedding_variables)
  after, aux = jax.jit(bwd)(dummy.sparse_inputs, grads, state.embedding_variables, jnp.int32(7))
  assert aux is None
  assert_trees(after, before, exact=True)
  with pytest.raises(ValueError, match="tc_aux must be the int32 scalar count"):
    jax.eval_shape(bwd, dummy.sparse_inputs, grads, state.embedding_variables, None)


def _bytes_on_first_device(tree):
  device = jax.devices()[0]
  return sum(
    s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards if s.device == device
  )


def test_step_keeps_the_states_in_their_donated_buffers(setup):
  """A table or slot left out of the donation would be held twice during a step."""
  state = setup.fresh_state()
  kept = _bytes_on_first_device((state, setup.trainer.initial_pipeline_state()))
  steady = setup.trainer.lower_step(state).compile().memory_analysis()
  # Every state buffer is reused but the TC aux (an int32 scalar, kept: see
  # trainer._order); the TC output ({"loss", "finite"}) is new.
  assert kept - steady.alias_size_in_bytes == 4
  assert steady.output_size_in_bytes - steady.alias_size_in_bytes < 1024
  fill = setup.trainer.lower_step(state, fake_tc_step=True).compile().memory_analysis()
  assert fill.output_size_in_bytes - fill.alias_size_in_bytes < 1024


@pytest.mark.parametrize("pipelining", [True, False])
def test_no_donated_buffer_goes_unused(setup, pipelining):
  """Every buffer a step donates becomes an output's: jax warns of none it could not use.

  Fill, steady state and drain (pipelined), and the sequential step. A
  donated buffer no output takes is freed late and tells of an argument
  the step should have kept.
  """
  trainer = setup.make_trainer(pipelining=pipelining)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    pipeline.train(trainer, setup.fresh_state(), setup.batches(), N)
  assert [str(w.message) for w in caught if "donated buffers" in str(w.message)] == []


def placed(setup, i):
  """Batch i as make_train_input places it: one packed buffer on the mesh."""
  return device_buffer.place_packed(device_buffer.pack_batch(setup.host_batches[i], G), setup.mesh)


@pytest.mark.parametrize("pipelining", [True, False])
def test_a_packed_trainer_splits_the_placed_batch_in_its_step_bit_for_bit(
  setup, full_run, pipelining
):
  """A trainer built from `abstract_packed_batch` takes the one buffer a batch is
  placed in and splits it inside its own programs (none of its own per batch):
  the same states, buffered batches and losses as the trainer of TrainBatches,
  the same programs, no donated buffer unused; a TrainBatch is refused by name."""
  example = pipeline.abstract_packed_batch(setup.batch(0), setup.mesh)
  assert example.words.shape == (G * example.layout.words,)
  trainer = setup.make_trainer(batch=example, pipelining=pipelining)
  assert trainer.packed_input
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    got = pipeline.train(trainer, setup.fresh_state(), (placed(setup, i) for i in range(N)), N)
  assert [str(w.message) for w in caught if "donated buffers" in str(w.message)] == []
  if pipelining:
    want = full_run
  else:
    want = pipeline.train(
      setup.make_trainer(pipelining=False), setup.fresh_state(), setup.batches(), N
    )
  assert_trees(got[0], want[0], exact=True)
  assert_trees(got[1], want[1], exact=True)
  assert got[2].losses == want[2].losses
  assert trainer.traced_programs == ((True, False) if pipelining else (False,))
  state, pstate = got[0], got[1]
  with pytest.raises(
    TypeError,
    match=r"^this trainer was built for packed batches \(make_train_input's\), got a"
    r" TrainBatch: pass make_train_input's batches, or build the trainer from a TrainBatch"
    r" \(e\.g\. abstract_train_batch\) to take TrainBatches$",
  ):
    trainer.run_pipeline_step(state, pstate, setup.batch(0), False)
  other = setup._host_batch(0, with_limits(setup.feature_specs, 3, 192))
  other = device_buffer.place_packed(device_buffer.pack_batch(other, G), setup.mesh)
  with pytest.raises(ValueError) as error:
    trainer.run_pipeline_step(state, pstate, other, False)
  other_arrays = "; ".join(
    f"sparse.{field}.{stack} (192,) {dtype} where the trainer has (256,) {dtype}"
    for field, dtype in (
      ("lhs_embedding_ids", "int32"),
      ("lhs_gains", "float32"),
      ("lhs_sample_ids", "int32"),
    )
    for stack in ("t0", "t2")
  )
  assert str(error.value) == (
    f"a batch of other arrays than this trainer's (per device: {other_arrays}): were its"
    " COO buffers made for other limits than the trainer's feature specs?"
  )


def test_a_trainer_of_train_batches_takes_placed_batches_too(setup, full_run):
  """A DevicePackedBatch given to a trainer built from a TrainBatch is split first."""
  got = pipeline.train(setup.trainer, setup.fresh_state(), (placed(setup, i) for i in range(N)), N)
  assert not setup.trainer.packed_input
  for g, w in zip(got, full_run[:2]):
    assert_trees(g, w, exact=True)
  assert got[2].losses == full_run[2].losses


def with_limits(feature_specs, max_ids, buffer_size=None):
  """The specs with every stack's max_ids (and max_unique_ids) and COO buffer size set."""
  limits = {
    stack: {
      "max_ids_per_partition": max_ids,
      "max_unique_ids_per_partition": max_ids,
      "suggested_coo_buffer_size_per_device": buffer_size,
    }
    for stack in transforms.get_stack_limits(feature_specs)
  }
  return transforms.apply_stack_limits(feature_specs, limits)


# (max_ids_per_partition, COO buffer per device): the batches have at most 3 ids
# in a partition and 64 entries (padding included) in a SparseCore's segment.
OTHER_LIMITS = {"same limits": (8, None), "larger": (16, None), "smaller": (3, 192)}


@pytest.mark.parametrize("limits", OTHER_LIMITS.values(), ids=OTHER_LIMITS.keys())
def test_a_run_handed_over_trains_on_as_one_run_for_any_limits_that_hold_it(
  setup, full_run, limits
):
  """3 batches without a drain, handed over to a run of 2 batches with other COO
  limits: the same losses and state as one run of 5, bit for bit."""
  specs = with_limits(setup.feature_specs, *limits)
  later = [jax.device_put(setup._host_batch(i, specs), data_sharding(setup.mesh)) for i in (3, 4)]
  trainer = setup.trainer if limits == (8, None) else setup.make_trainer(specs, later[0])
  seen = []
  state, pstate, first = pipeline.train(
    setup.trainer, setup.fresh_state(), setup.batches(), 3, drain=False
  )
  assert first.batch_indices == (0, 1) and first.finished and int(pstate.pipeline_step) == 3
  handed = trainer.hand_over(pstate)
  assert int(handed.pipeline_step) == 0
  state, pstate, second = pipeline.train(
    trainer,
    state,
    iter(later),
    2,
    pipeline_state=handed,
    carried_in=True,
    hooks=(lambda result: seen.append(result.batch_index),),
  )
  assert seen == [-1, 0, 1, None] and second.batch_indices == (-1, 0, 1)
  np.testing.assert_array_equal(first.losses + second.losses, full_run[2].losses)
  assert_trees(state, full_run[0], exact=True)
  assert int(state.step) == N


def test_handed_over_buffers_are_what_the_preprocessing_writes_for_the_new_limits(setup):
  for limits in OTHER_LIMITS.values():
    specs = with_limits(setup.feature_specs, *limits)
    expected = setup._host_batch(2, specs).sparse
    got = pipeline.relayout_coo_buffers(
      setup.batch(2).sparse, specs, setup.mesh, num_sc_per_device=S
    )
    assert_trees(got, expected, exact=True)


def test_handing_over_to_limits_too_small_for_the_batches_in_flight_is_refused(setup):
  _, pstate, _ = pipeline.train(setup.trainer, setup.fresh_state(), setup.batches(), 2, drain=False)
  tight = with_limits(setup.feature_specs, 8, buffer_size=32)  # 16 entries per SC
  with pytest.raises(pipeline.CooRelayoutError) as e:
    pipeline.relayout_coo_buffers(
      pstate.last_step_inputs.sparse_inputs, tight, setup.mesh, num_sc_per_device=S
    )
  assert str(e.value).startswith("stack '")
  assert "entries (padding included), more than the 16 of the new limits" in str(e.value)
  sparse = setup.batch(2).sparse
  cut = sparse._replace(lhs_row_pointers={k: v[:16] for k, v in sparse.lhs_row_pointers.items()})
  with pytest.raises(pipeline.CooRelayoutError) as e:
    pipeline.relayout_coo_buffers(cut, tight, setup.mesh, num_sc_per_device=S)
  assert str(e.value) == (
    "stack 't0': COO buffers of shapes (16,) and (2048,) were not made for 8 devices with"
    " 2 SparseCores each"
  )


def test_carried_in_needs_a_handed_over_state_of_its_shapes_and_the_pipelined_step(setup):
  _, pstate, _ = pipeline.train(setup.trainer, setup.fresh_state(), setup.batches(), 2, drain=False)
  last = pstate.last_step_inputs
  half = pipeline.DenseInputs(last.dense_inputs.labels[:16], last.dense_inputs.dense[:16])
  other_batch = pstate.replace(last_step_inputs=last.replace(dense_inputs=half))
  with pytest.raises(ValueError) as e:
    setup.trainer.hand_over(other_batch)
  assert str(e.value) == (
    "hand_over: the PipelineState's .last_step_inputs.dense_inputs.labels is float32[16],"
    " the next run's float32[32]: a run hands its batches over only to a run of the same"
    " model and batch shapes (drain it instead)"
  )
  with pytest.raises(ValueError, match="carried_in needs the pipeline_state handed over"):
    pipeline.train(setup.trainer, setup.fresh_state(), setup.batches(), 2, carried_in=True)
  multiplier = setup.make_trainer(gradient_multiplier=True)
  with pytest.raises(ValueError, match="carried_in and drain=False need the pipelined step"):
    pipeline.train(multiplier, setup.fresh_state(), setup.batches(), 2, drain=False)


def test_a_mesh_of_explicit_axes_is_refused_with_how_to_make_one(setup):
  """jax.make_mesh's default Explicit axes failed deep in ZeRO's first program
  ("...can only refer to Auto axes of the mesh...")."""
  explicit = jax.make_mesh((G,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
  message = (
    "the mesh's axis 'data' is Explicit (jax.make_mesh's default): sparsepipe gives its"
    " shardings by NamedSharding and shard_map, on an Auto axis; make the mesh with"
    " sparsepipe.core.make_mesh(), or jax.make_mesh(...,"
    " axis_types=(jax.sharding.AxisType.Auto,))"
  )
  state = setup.fresh_state()
  with pytest.raises(ValueError) as refused:
    pipeline.make_trainer(explicit, state, setup.batch(0), setup.tc)
  assert str(refused.value) == message
  with pytest.raises(ValueError) as refused:
    pipeline.create_train_state(setup.optimizer, {}, explicit, {})
  assert str(refused.value) == message
  other = jax.make_mesh((G,), ("batch",), axis_types=(jax.sharding.AxisType.Auto,))
  with pytest.raises(ValueError) as refused:
    pipeline.make_trainer(other, state, setup.batch(0), setup.tc)
  assert str(refused.value) == (
    "the mesh has axes ('batch',): sparsepipe needs one axis 'data' over every device"
    " (sparsepipe.core.make_mesh())"
  )


def test_a_mesh_of_no_devices_is_refused():
  # Was jax's IndexError.
  with pytest.raises(ValueError, match=r"^make_mesh was given no devices \(None: all of"):
    make_mesh([])

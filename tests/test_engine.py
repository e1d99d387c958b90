"""The engine (models/engine/): each kernel against the formula it replaces, measured choices, the replay graph, the
stored steps, the fallback where a kernel cannot run, and the engine against the port alone (plain)."""
import json, os, pathlib, subprocess, sys
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, UOp, Device, Context, dtypes, nn
from tinygrad.engine.realize import get_graph_runtime
from tinygrad.uop.ops import Ops
from tinygrad.codegen import to_program_cache
import models, spec
from models import GPT2, GPT2Config, engine
from models.engine import attention, lanes, matvec, measure, norm, replay, store
from conftest import TINY, dtype, load, np_gpt2_logits, random_weights, shared_dir, tolerance, write_checkpoint

def logits(model, tokens, start_pos=0) -> np.ndarray:
  return model.forward(Tensor([tokens], dtype=dtypes.int32), start_pos).numpy()

def assert_close(actual, expected):
  """Agreement relative to the logit scale, within the suite's dtype's tolerance."""
  err = np.abs(actual - expected).max() / np.abs(expected).max()
  assert err < tolerance(), f"max error {err:.2e} of the logit scale"

@pytest.fixture
def disk(monkeypatch):
  """tinygrad's disk cache of measured choices, empty and this test's own."""
  table = {}
  monkeypatch.setattr(measure, "diskcache_get", lambda kind, key: table.get((kind, key)))
  monkeypatch.setattr(measure, "diskcache_put", lambda kind, key, val: table.setdefault((kind, key), val))
  return table

def layer(H:int, P:int, D:int, cache:Tensor|None=None) -> models.gpt2.Attention:
  """An attention layer of H heads of D over P positions, its cache given."""
  attn = models.gpt2.Attention(GPT2Config(n_layer=1, n_head=H, n_embd=H * D, n_positions=P), dtypes.float32)
  if cache is not None: attn.cache_kv = cache
  return attn

@pytest.mark.backend
def test_steps_replay_their_kernels_as_tinygrads_executor_runs_them(tiny_dir):
  """A captured step on a device without a graph of its own runs as models/engine/replay.py's batches, and computes what
  tinygrad's own executor computes (JIT=2: no graph) to the bit, as its input buffer, start position and widths change."""
  ours, theirs = load(tiny_dir / "target"), load(tiny_dir / "target")
  seq = [int(t) for t in np.random.default_rng(9).integers(0, 64, 40)]
  def run(model, jit:int) -> list[np.ndarray]:
    with Context(JIT=jit):
      model.prefill(seq[:4])
      return [model(seq[p:p+w], p).numpy() for p, w in ((4, 1), (5, 5), (10, 1), (11, 3), (14, 1), (30, 5), (35, 1))]
  expected, got = run(theirs, 2), run(ours, 1)
  for a, b in zip(got, expected): np.testing.assert_array_equal(a, b)
  calls = lambda model: [call.src[0] for step in model.jits.values() for call in step.captured.linear.src]
  graphs = [c for c in calls(ours) if c.op is Ops.CUSTOM_FUNCTION and c.arg == "graph"]
  assert graphs and not any(c.op is Ops.CUSTOM_FUNCTION for c in calls(theirs))
  if Device[Device.DEFAULT].graph is None:   # replay.py's device
    assert all(isinstance(get_graph_runtime(g), replay.Replay) for g in graphs)

def lanes_programs() -> set[str]: return {p.arg.name for p in to_program_cache.values() if p.arg.name.startswith("lanes_")}

@pytest.mark.backend
@pytest.mark.parametrize("T", [pytest.param(1, marks=pytest.mark.gpu), 2, 3, pytest.param(5, marks=pytest.mark.gpu), 9, 16])
def test_lanes_kernel_computes_the_matmul(T):
  """The lanes kernel is x @ w.T for every width a step may run (its rows in chunks: 9 = 3 x 3, 16 = 2 x 8), in the
  suite's dtype: inputs in it, float32 inside, the result in the output dtype."""
  rng = np.random.default_rng(T)
  for N, C in ((96, 32), (64, 64), (256, 128)):
    x, w = (Tensor(rng.standard_normal(shape).astype(np.float32)).cast(dtype()).realize() for shape in ((1, T, C), (N, C)))
    expected = x.float().numpy().astype(np.float64) @ w.float().numpy().astype(np.float64).T
    for out in (None, dtypes.float32):
      got = lanes.linear(x, w, out, lanes=True)
      assert got.shape == (1, T, N) and got.dtype == (out or x.dtype)
      assert np.abs(got.float().numpy() - expected).max() / np.abs(expected).max() < tolerance()
    assert f"lanes_{T}_{N}_{C}" in lanes_programs()
  assert not lanes.fits(98, 32) and not lanes.fits(96, 48) and lanes.fits(96, 64) and not lanes.fits(100, 64)

def test_choose_measures_once_per_machine(monkeypatch, disk):
  """choose() times both kernels on the weights given, keeps the faster, and asks tinygrad's disk cache first: a second
  process (an empty use_lanes) measures nothing. Shapes the lanes kernel does not fit are never measured."""
  timed = []
  monkeypatch.setattr(lanes, "use_lanes", {})
  monkeypatch.setattr(lanes, "seconds", lambda x, weights, lanes: timed.append((x.shape, lanes)) or (1.0 if lanes else 2.0))
  weights = [Tensor.empty(64, 32) for _ in range(3)]
  assert lanes.choose(3, weights, dtypes.float32) is True and timed == [((3, 32), True), ((3, 32), False)]
  assert lanes.use_lanes == {(3, 64, 32, dtypes.float32, dtypes.float32): True}
  monkeypatch.setattr(lanes, "use_lanes", {})
  assert lanes.choose(3, weights, dtypes.float32) is True and len(timed) == 2, "measured again"
  assert lanes.choose(3, [Tensor.empty(66, 32)], dtypes.float32) is False and len(timed) == 2
  monkeypatch.setattr(lanes, "seconds", lambda x, weights, lanes: 2.0 if lanes else 1.0)
  assert lanes.choose(5, weights, dtypes.float32) is False and lanes.use_lanes[(5, 64, 32, dtypes.float32, dtypes.float32)] is False

def np_attention(qkv:np.ndarray, cache:np.ndarray, start:int) -> np.ndarray:
  """Causal attention of rows start..start+T-1 over the cache's first start+T positions, in float64: (T, C)."""
  _, T, C3 = qkv.shape
  _, _, H, _, D = cache.shape
  q = qkv[0, :, :C3 // 3].reshape(T, H, D).transpose(1, 0, 2)                        # (H, T, D)
  keys, values = cache[0, 0, :, :start + T], cache[1, 0, :, :start + T]             # (H, S, D)
  scores = q @ keys.transpose(0, 2, 1) / np.sqrt(D)                                 # (H, T, S)
  scores[:, np.arange(T)[:, None] < np.arange(start + T)[None, :] - start] = -np.inf
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  return (probs / probs.sum(-1, keepdims=True) @ values).transpose(1, 0, 2).reshape(T, C3 // 3)

def attention_programs() -> set[str]: return {p.arg.name for p in to_program_cache.values() if p.arg.name.startswith(("scores_", "values_", "chunks_", "combine_"))}

@pytest.mark.backend
@pytest.mark.parametrize("T", [pytest.param(1, marks=pytest.mark.gpu), 2, 3, pytest.param(5, marks=pytest.mark.gpu), 9, 16])
def test_attention_kernels_compute_attention(T):
  """attention.py's kernels, its chunked kernels (a candidate on devices with work-groups only, but they run anywhere)
  and the port's formula compute causal attention over the cache, for every width a step may run (rows in chunks: 9 =
  3 x 3, 16 = 2 x 8), at the first positions and deep in the cache (chunks empty, short and clamped), with the position a
  bound variable (a captured step: one compile for every position), an expression of one (a draft's later steps run at
  start_pos + 1, ...) or a Python int (an eager pass: at 0, T = 1 is a range of one position)."""
  rng = np.random.default_rng(T)
  H, P, D = 3, 64, 32
  qkv, cache = (Tensor(rng.standard_normal(shape).astype(np.float32)).cast(dtype()).realize() for shape in ((1, T, 3 * H * D), (2, 1, H, P, D)))
  attn = layer(H, P, D, cache)
  start_pos, earlier_pos = UOp.variable("start_pos", 0, P - T), UOp.variable("start_pos", 0, P - T - 2)
  for way in ({"use": True}, {"use": False}, {"chunks": True}):
    step = TinyJit(lambda qkv, pos: attention.attend(attn, qkv, pos, **way).realize())
    later = TinyJit(lambda qkv, pos: attention.attend(attn, qkv, pos + 2, **way).realize())
    for start in (0, 2, P - T - 7, P - T):
      expected = np_attention(qkv.float().numpy().astype(np.float64), cache.float().numpy().astype(np.float64), start)
      results = [step(qkv, start_pos.bind(start))] + ([later(qkv, earlier_pos.bind(start - 2))] if start >= 2 else [])
      for got in results + ([attention.attend(attn, qkv, start, **way)] if start == 0 else []):
        assert got.shape == (1, T, H * D) and got.dtype == qkv.dtype
        assert np.abs(got.float().numpy()[0] - expected).max() / np.abs(expected).max() < tolerance(), (way, start)
  assert {f"{k}_{T}_{H}_{D}" for k in ("scores", "values", "chunks", "combine")} <= attention_programs()

def test_attention_choose_measures_once_per_machine(monkeypatch, disk):
  """attention.choose() times its kernels and tinygrad's broadcasts over the caches given, keeps the faster, and asks
  tinygrad's disk cache first; a head dimension the kernels do not split is never measured."""
  timed = []
  monkeypatch.setattr(attention, "use_kernels", {})
  monkeypatch.setattr(attention, "seconds", lambda T, caches, dtype, kernels: timed.append((T, kernels)) or (1.0 if kernels else 2.0))
  caches = [layer(4, 128, 64) for _ in range(2)]
  assert attention.choose(5, caches, dtypes.float32) is True and timed == [(5, True), (5, False)]
  assert attention.use_kernels == {(5, 4, 128, 64, dtypes.float32): True}
  monkeypatch.setattr(attention, "use_kernels", {})
  assert attention.choose(5, caches, dtypes.float32) is True and len(timed) == 2, "measured again"
  assert attention.choose(5, [layer(4, 128, 30)], dtypes.float32) is False and len(timed) == 2
  monkeypatch.setattr(attention, "seconds", lambda T, caches, dtype, kernels: 2.0 if kernels else 1.0)
  assert attention.choose(1, caches, dtypes.float32) is False and attention.use_kernels[(1, 4, 128, 64, dtypes.float32)] is False

def test_attention_choose_chunks_measures_against_what_choose_left(monkeypatch, disk):
  """attention.choose_chunks() times the chunked kernels and what choose() left (use None), keeps the faster, once per
  machine; where they are no candidate (no work-groups, a head dimension the kernels do not split) it measures nothing."""
  timed = []
  monkeypatch.setattr(attention, "use_chunks", {})
  monkeypatch.setattr(attention, "chunks_fit", lambda D: D % 4 == 0)
  monkeypatch.setattr(attention, "seconds", lambda T, caches, dtype, use, chunks: timed.append((T, use, chunks)) or (1.0 if chunks else 2.0))
  caches = [layer(4, 128, 64) for _ in range(2)]
  assert attention.choose_chunks(5, caches, dtypes.float32) is True and timed == [(5, None, True), (5, None, False)]
  monkeypatch.setattr(attention, "use_chunks", {})
  assert attention.choose_chunks(5, caches, dtypes.float32) is True and len(timed) == 2, "measured again"
  assert attention.choose_chunks(5, [layer(4, 128, 30)], dtypes.float32) is False and len(timed) == 2
  monkeypatch.setattr(attention, "seconds", lambda T, caches, dtype, use, chunks: 2.0 if chunks else 1.0)
  assert attention.choose_chunks(1, caches, dtypes.float32) is False and attention.use_chunks[(1, 4, 128, 64, dtypes.float32)] is False

@pytest.mark.backend
@pytest.mark.parametrize("T", [pytest.param(1, marks=pytest.mark.gpu), 2, pytest.param(5, marks=pytest.mark.gpu), 16])
def test_norm_kernel_computes_layer_norm(T):
  """norm.py's kernels (a work-item per row; where the device has work-groups, the stats kernel with each work-group
  size measured) and tinygrad's compute nn.LayerNorm over each row, for every width a step may run, in the suite's
  dtype, on rows whose mean is far from 0 (a mean taken carelessly would cancel)."""
  rng = np.random.default_rng(T)
  for C in (32, 768):
    x = Tensor((rng.standard_normal((1, T, C)) * 3 + 20).astype(np.float32)).cast(dtype()).realize()
    w, b = (Tensor(rng.standard_normal(C).astype(np.float32)).cast(dtype()).realize() for _ in range(2))
    xs = x.float().numpy().astype(np.float64)
    expected = (xs - xs.mean(-1, keepdims=True)) / np.sqrt(xs.var(-1, keepdims=True) + 1e-5) * w.float().numpy() + b.float().numpy()
    for way in ({"kernel": True}, {"kernel": False}, *({"group": g} for g in norm.groups(C))):
      got = norm.layer_norm(x, w, b, 1e-5, **way)
      assert got.shape == x.shape and got.dtype == x.dtype
      assert np.abs(got.float().numpy() - expected).max() / np.abs(expected).max() < tolerance(), (C, way)
    names = {p.arg.name for p in to_program_cache.values()}
    assert f"norm_{T}_{C}" in names and (f"stats_{T}_{C}" in names) == bool(norm.groups(C))
    assert bool(norm.groups(C)) == Device[Device.DEFAULT].renderer.has_local

def test_norm_choose_measures_once_per_machine(monkeypatch, disk):
  """norm.choose() times its kernel and tinygrad's over the norms given, keeps the faster, and asks tinygrad's disk cache
  first: a second process (an empty use_kernel) measures nothing."""
  timed = []
  monkeypatch.setattr(norm, "use_kernel", {})
  monkeypatch.setattr(norm, "seconds", lambda T, norms, dtype, kernel: timed.append((T, kernel)) or (1.0 if kernel else 2.0))
  norms = [norm.LayerNorm(nn.LayerNorm(48)) for _ in range(3)]
  assert norm.choose(5, norms, dtypes.float32) is True and timed == [(5, True), (5, False)]
  assert norm.use_kernel == {(5, 48, dtypes.float32): True}
  monkeypatch.setattr(norm, "use_kernel", {})
  assert norm.choose(5, norms, dtypes.float32) is True and len(timed) == 2, "measured again"
  monkeypatch.setattr(norm, "seconds", lambda T, norms, dtype, kernel: 2.0 if kernel else 1.0)
  assert norm.choose(1, norms, dtypes.float32) is False and norm.use_kernel[(1, 48, dtypes.float32)] is False

def test_norm_choose_group_measures_every_size_against_what_choose_left(monkeypatch, disk):
  """norm.choose_group() times what choose() left (None) and the stats kernel at each work-group size, keeps the
  fastest (None where nothing beats it), once per machine; where the device has no work-groups it measures nothing."""
  monkeypatch.setattr(norm, "use_group", {})
  monkeypatch.setattr(norm, "groups", lambda C: [32, 64])
  costs, timed = {None: 2.0, 32: 1.0, 64: 1.5}, []
  monkeypatch.setattr(norm, "seconds", lambda T, norms, dtype, kernel, group: timed.append((T, kernel, group)) or costs[group])
  norms = [norm.LayerNorm(nn.LayerNorm(256)) for _ in range(2)]
  assert norm.choose_group(3, norms, dtypes.float32) == 32 and timed == [(3, None, g) for g in costs]
  monkeypatch.setattr(norm, "use_group", {})
  assert norm.choose_group(3, norms, dtypes.float32) == 32 and len(timed) == 3, "measured again"
  costs[None] = 0.5
  assert norm.choose_group(1, norms, dtypes.float32) is None and norm.use_group == {(3, 256, dtypes.float32): 32, (1, 256, dtypes.float32): None}
  monkeypatch.setattr(norm, "groups", lambda C: [])
  assert norm.choose_group(2, norms, dtypes.float32) is None and len(timed) == 6 and (2, 256, dtypes.float32) not in norm.use_group

def test_auto_dtype_is_half_where_half_measures_faster(monkeypatch, disk):
  """--dtype auto asks a measurement, not the device's name: half where a half matrix-vector product is clearly faster
  (timed once per machine, then read from tinygrad's disk cache), float32 where it is not or the device has no half;
  with plain=True nothing is measured and auto is float32."""
  timed = []
  renderer = Device[Device.DEFAULT].renderer
  monkeypatch.setattr(type(renderer), "supported_dtypes", lambda self: [dtypes.float32, dtypes.half])
  class Fake:   # what half_pays() builds, without kernels for a half the device may not have
    def __init__(self, dtype=dtypes.float32): self.dtype = dtype
    @staticmethod
    def ones(*shape, dtype=dtypes.float32): return Fake(dtype)
    def cast(self, dtype): return Fake(dtype)
    def contiguous(self): return self
    def realize(self): return self
  monkeypatch.setattr(measure, "Tensor", Fake)
  def seconds(cost): return lambda fn, x: timed.append(x.dtype) or cost[x.dtype]
  monkeypatch.setattr(measure, "captured_seconds", seconds({dtypes.half: 1.0, dtypes.float32: 2.0}))
  assert models.resolve_dtype("auto", plain=True) == dtypes.float32 and timed == []
  assert models.resolve_dtype("auto") == dtypes.half and timed == [dtypes.half, dtypes.float32]
  assert models.resolve_dtype("auto") == dtypes.half and len(timed) == 2, "measured again"
  assert models.resolve_dtype("float32") == dtypes.float32 and len(timed) == 2
  disk.clear()
  monkeypatch.setattr(measure, "captured_seconds", seconds({dtypes.half: 1.0, dtypes.float32: 1.2}))   # not clearly
  assert models.resolve_dtype("auto") == dtypes.float32
  disk.clear()
  monkeypatch.setattr(type(renderer), "supported_dtypes", lambda self: [dtypes.float32])
  monkeypatch.setattr(measure, "captured_seconds", lambda *a: pytest.fail("measured a dtype the device does not have"))
  assert models.resolve_dtype("auto") == dtypes.float32

@pytest.mark.backend
def test_a_model_on_its_own_kernels(tiny_dir, monkeypatch):
  """Where the choices pick this project's kernels, every linear layer and the lm_head of a pass run the matvec kernel
  (a device with work-groups) or the lanes kernel, every layer's attention the attention kernels and every layer norm
  a norm kernel (the stats kernel at 5 rows where it fits): the logits of a plain forward and of captured steps (a
  decode and a 5-token verify pass) are the numpy GPT-2's."""
  everywhere(monkeypatch)
  monkeypatch.setenv("SPEC_STEP_CACHE", "")                       # steps captured here, none loaded
  weights = random_weights(TINY, seed=1)
  model = load(tiny_dir / "target")
  seq = [int(t) for t in np.random.default_rng(9).integers(0, 64, 11)]
  expected = np_gpt2_logits(weights, TINY["n_head"], seq)
  assert_close(logits(model, seq[:5]), expected[:5])
  model.prefill(seq[:5])
  five = [model(seq[5:10], 5).numpy() for _ in range(2)][-1]
  one = [model(seq[10:], 10).numpy() for _ in range(2)][-1]
  assert_close(np.concatenate([five, one]), expected[5:])
  names = {p.arg.name for p in to_program_cache.values()}
  linear = lambda T, N, C: f"{'matvec' if matvec.fits(N, C) else 'lanes'}_{T}_{N}_{C}"
  assert {linear(5, 96, 32), linear(1, 32, 32), linear(1, 128, 32), linear(5, 32, 128), linear(1, 64, 32)} <= names
  five = ["chunks_5_2_16", "combine_5_2_16"] if attention.chunks_fit(16) else ["values_5_2_16"]
  assert {"scores_5_2_16", *five, "scores_1_2_16", "values_1_2_16"} <= attention_programs()
  assert {"stats_5_32" if norm.groups(32) else "norm_5_32", "norm_1_32"} <= names

@pytest.mark.long
def test_steps_choose_their_linear_kernels_and_search_the_rest(tiny_dir, monkeypatch):
  """Every step pass (at most STEP_WIDTH tokens) has the kernels of its linear layers, attention and layer norms chosen by
  measurement (models/engine/lanes.py, attention.py, norm.py) for its width and for one token, whatever the
  search; with search > 0 its other kernels come from tinygrad's BEAM search (which caches its result on disk: a machine
  searches a kernel once). A prefill chooses and searches nothing. The logits do not change."""
  import tinygrad.codegen.opt.search as tinygrad_search
  beams, beam_search = [], tinygrad_search.beam_search  # the beam width of every kernel search
  monkeypatch.setattr(tinygrad_search, "beam_search", lambda *a, **kw: beams.append(a[3]) or beam_search(*a, **kw))
  monkeypatch.setattr(lanes, "use_lanes", {})
  monkeypatch.setattr(attention, "use_kernels", {})
  monkeypatch.setattr(norm, "use_kernel", {})
  unsearched, searched = load(tiny_dir / "target"), load(tiny_dir / "target", search=1)
  seq = [int(t) for t in np.random.default_rng(6).integers(0, 64, 7)]
  searched.prefill(seq[:-1])
  assert beams == [] and lanes.use_lanes == attention.use_kernels == norm.use_kernel == {}, "a prefill searched or chose"
  assert searched.jit(GPT2.forward, engine.STEP_WIDTH + 1).search == 0 and lanes.use_lanes == attention.use_kernels == norm.use_kernel == {}
  step = [searched(seq[-1:], len(seq) - 1).numpy() for _ in range(3)]    # captured on the first call
  assert beams and set(beams) == {1}
  assert {(T, N, C) for T, N, C, *_ in lanes.use_lanes} == {(1, 96, 32), (1, 32, 32), (1, 128, 32), (1, 32, 128), (1, 64, 32)}
  assert set(attention.use_kernels) == {(1, 2, 256, 16, searched.dtype)} and set(norm.use_kernel) == {(1, 32, searched.dtype)}
  unsearched.prefill(seq[:-1])
  beams.clear()
  expected = unsearched(seq[-2:], len(seq) - 2).numpy()
  assert beams == [] and {T for T, *_ in lanes.use_lanes} == {T for T, *_ in attention.use_kernels} == {T for T, *_ in norm.use_kernel} == {1, 2}, \
    "search 0 searched, or did not choose"
  two = [searched(seq[-2:], len(seq) - 2).numpy() for _ in range(3)]
  assert beams and set(beams) == {1}
  np.testing.assert_allclose(np.concatenate([step[-1], two[-1]]), np.concatenate([expected[-1:], expected]),
                             atol=tolerance() * np.abs(expected).max())

@pytest.mark.backend
def test_captured_steps_are_stored_and_run_on_the_loading_models_weights(tiny_dir, tmp_path, monkeypatch):
  """A captured step is stored (engine.Step, store.step_file) and a later instance of the same shape loads it instead of capturing:
  it runs on that instance's own weights and KV cache (stored by name), exactly as a step it captured itself would. An
  unreadable file is captured again and rewritten; SPEC_STEP_CACHE="" stores nothing."""
  monkeypatch.setenv("SPEC_STEP_CACHE", str(tmp_path / "steps"))
  seq = [int(t) for t in np.random.default_rng(7).integers(0, 64, 9)]
  def decode(model):  # a prefill's pass of 8 tokens, then a one-token step, each captured on its first call
    model.prefill(seq[:-1])
    return [model(seq[-1:], len(seq) - 1).numpy() for _ in range(3)][-1]
  step = lambda model: model.jit(GPT2.forward, 1)
  prefill = lambda model: model.jit(GPT2.fill, 8)
  captured = decode(load(tiny_dir / "target"))
  stored = sorted((tmp_path / "steps").iterdir())
  assert [f.suffix for f in stored] == [".pkl", ".pkl"], "the step and the prefill's pass"
  other = load(tiny_dir / "other")                                  # same shape, other weights
  assert step(other).captured is not None and prefill(other).captured is not None, "not loaded"
  loaded = decode(other)
  monkeypatch.setenv("SPEC_STEP_CACHE", "")
  fresh = load(tiny_dir / "other")
  assert step(fresh).path is None and step(fresh).captured is None
  np.testing.assert_array_equal(loaded, decode(fresh))              # the same kernels on the same weights: bit for bit
  assert_close(loaded, logits(fresh, seq)[-1:])
  assert not np.allclose(loaded, captured)
  assert sorted((tmp_path / "steps").iterdir()) == stored, "SPEC_STEP_CACHE='' wrote a file"
  monkeypatch.setenv("SPEC_STEP_CACHE", str(tmp_path / "steps"))
  for f in stored: f.write_bytes(f.read_bytes()[:1000])              # interrupted writes
  again = load(tiny_dir / "other")
  assert step(again).captured is None and prefill(again).captured is None
  np.testing.assert_array_equal(decode(again), loaded)
  assert step(load(tiny_dir / "other")).captured is not None, "not rewritten"

@pytest.mark.backend
@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 3, 16])
def test_matvec_kernel_computes_the_formula(T, monkeypatch):
  """The matvec kernel is x @ w.T + b (and x @ w.T in float32, the lm_head's) for every width a step may run, the
  three widths together covering every option of each shape, where the device has work-groups (a GPU; CI's GPU suite,
  DEV=PYTHON::sm_80). Where it has none (tinygrad's CPU backend) the kernel is no candidate: choose() measures nothing."""
  rng, i = np.random.default_rng(T), [1, 3, 16].index(T)
  for N, C in ((24, 32), (40, 256)):
    x, w, b = (Tensor(rng.standard_normal(s).astype(np.float32)).cast(models.DTYPES[dtype()]).realize()
                 for s in ((T, C), (N, C), (N,)))
    expected = x.float().numpy() @ w.float().numpy().T
    if not matvec.fits(N, C):
      assert not Device[Device.DEFAULT].renderer.has_local
      monkeypatch.setattr(matvec, "seconds", lambda *a: pytest.fail("measured where it cannot run"))
      assert matvec.choose(T, [w], [b], x.dtype) is None
      continue
    for group, outputs in matvec.options(N, C)[i::3]:
      got = matvec.linear(x, w, b, kernel=(group, outputs)).float().numpy()
      assert np.abs(got - expected - b.float().numpy()).max() < tolerance() * np.abs(expected).max() + 1e-6
      got = matvec.linear(x, w, dtype=dtypes.float32, kernel=(group, outputs)).numpy()
      assert np.abs(got - expected).max() < tolerance() * np.abs(expected).max() + 1e-6
    assert f"matvec_{T}_{N}_{C}" in {p.arg.name for p in to_program_cache.values()}

def test_matvec_options_fit_the_shape():
  """Work-groups near 32, 64 and 128 threads that share the reduction's 4-wide vectors evenly, outputs dividing N."""
  assert matvec.options(4800, 1600) == [(g, o) for g in (25, 50, 100) for o in (1, 2, 4)]   # gpt2-xl: 400 vectors
  assert matvec.options(2304, 768) == [(g, o) for g in (32, 64, 96) for o in (1, 2, 4)]
  assert matvec.options(50257, 768) == [(32, 1), (64, 1), (96, 1)] and matvec.options(24, 30) == []

def test_matvec_choose_measures_every_option_against_what_lanes_left(monkeypatch, disk):
  """choose() times what lanes.py left (None) and every option, keeps the fastest (None where nothing beats it), once
  per machine: a new process finds it in the disk cache."""
  monkeypatch.setattr(matvec, "use_matvec", {})
  monkeypatch.setattr(matvec, "fits", lambda N, C: True)
  costs, timed = {None: 2.0, (8, 1): 3.0, (8, 2): 1.0, (8, 4): 1.5}, []
  monkeypatch.setattr(matvec, "seconds", lambda x, ws, bs, o: timed.append((x.shape, o)) or costs[o])
  weights, biases = [Tensor.empty(24, 32)] * 2, [Tensor.empty(24)] * 2
  assert matvec.choose(3, weights, biases, dtypes.float32) == (8, 2)
  key = (3, 24, 32, dtypes.float32, dtypes.float32, True)
  assert timed == [((3, 32), o) for o in costs] and matvec.use_matvec == {key: (8, 2)}
  monkeypatch.setattr(matvec, "use_matvec", {})
  assert matvec.choose(3, weights, biases, dtypes.float32) == (8, 2) and len(timed) == 4, "measured again"
  costs[None] = 0.5
  assert matvec.choose(3, weights, None, dtypes.float32) is None and matvec.use_matvec[(*key[:5], False)] is None

def test_a_matvec_option_that_cannot_run_drops_out_with_one_line(monkeypatch, capfd, disk):
  """An option that fails to compile or run is not measured and not cached as a loss of the others: one line on stderr
  names it and the error, and the fastest of the rest is kept; when all fail, what lanes.py left runs."""
  monkeypatch.setattr(matvec, "use_matvec", {})
  monkeypatch.setattr(matvec, "fits", lambda N, C: True)
  def seconds(x, ws, bs, o):
    if o == (8, 2): raise RuntimeError("too many resources requested for launch")
    return {None: 2.0, (8, 1): 1.0, (8, 4): 1.5}[o]
  monkeypatch.setattr(matvec, "seconds", seconds)
  assert matvec.choose(1, [Tensor.empty(24, 32)], None, dtypes.float32) == (8, 1)
  lines = [l for l in capfd.readouterr().err.splitlines() if "cannot run" in l]
  assert len(lines) == 1 and "matvec kernel" in lines[0] and "(8, 2)" in lines[0] and "too many resources" in lines[0]

# a gpt2 decode (float16, CUDA sm_90): the kernels it launches, engine and plain; more is a regression, fewer a new pin
DECODE_KERNELS = {"engine": 202, "plain": 202}

def test_a_gpt2_decode_launches_its_pinned_kernel_count(tmp_path):
  """tests/gpu_profile.py's capture of gpt2's decode on tinygrad's NULL device for CUDA sm_90 (NVRTC from pip's
  nvidia-cuda-nvrtc, which .ci/run installs): its kernel count pinned, and the engine's predicted time below the port's."""
  try: import nvidia   # noqa: F401
  except ImportError:
    if os.environ.get("CI") == "true": pytest.fail("CI must have pip's nvidia-cuda-nvrtc")
    pytest.skip("NVIDIA's compiler from pip (nvidia-cuda-nvrtc) is not installed")
  root, out = pathlib.Path(__file__).resolve().parent.parent, tmp_path / "profile.json"
  run = subprocess.run([sys.executable, str(root / "tests" / "gpu_profile.py"), "--models", "gpt2", "--widths", "1",
                        "--dtypes", "float16", "--json", str(out)], env={**os.environ, "DEV": "NULL:CUDA:sm_90"},
                       capture_output=True, text=True, cwd=root)
  assert run.returncode == 0, run.stderr[-2000:]
  passes = {layer: p["1"] for layer, p in json.loads(out.read_text())["gpt2"]["float16"].items()}
  assert {layer: p["kernels"] for layer, p in passes.items()} == DECODE_KERNELS
  assert passes["engine"]["predicted_ms"] < passes["plain"]["predicted_ms"]
  assert all(p["floor_ms"] == pytest.approx(p["weight_bytes"] / 3.35e12 * 1e3) for p in passes.values())

# ***** the engine against the port alone *****

def everywhere(monkeypatch):
  """Every pass runs the engine's kernels wherever they fit, not where they measure faster; nothing is measured."""
  class Fits(dict):
    def __init__(self, fits): super().__init__(); self.fits = fits
    def get(self, key, default=None): return self.fits(key)
  monkeypatch.setattr(lanes, "use_lanes", Fits(lambda key: lanes.fits(*key[1:3])))
  monkeypatch.setattr(matvec, "use_matvec", Fits(lambda key: matvec.fits(*key[1:3]) and matvec.options(*key[1:3])[0] or None))
  monkeypatch.setattr(attention, "use_kernels", Fits(lambda key: attention.fits(key[3])))
  monkeypatch.setattr(attention, "use_chunks", Fits(lambda key: key[0] > 1 and attention.chunks_fit(key[3])))
  monkeypatch.setattr(norm, "use_kernel", Fits(lambda key: True))
  # the stats kernel for passes of several rows where it fits, the row kernel for one: both run
  monkeypatch.setattr(norm, "use_group", Fits(lambda key: key[0] > 1 and (norm.groups(key[1]) or [None])[0] or None))
  monkeypatch.setattr(engine, "choose_kernels", lambda model, widths: None)

@pytest.mark.backend
@pytest.mark.parametrize("kernel", ["lanes", "attention", "norm"])
def test_a_kernel_that_cannot_run_falls_back_with_one_line(tiny_dir, monkeypatch, capfd, disk, kernel):
  """A kernel that fails to compile (here: its UOp graph raises as tinygrad builds it) loses its measurement: the pass
  runs tinygrad's kernels, one line on stderr names the kernel and the error, and the logits are the port's."""
  module, fn = {"lanes": (lanes, "lanes_kernel"), "attention": (attention, "scores_kernel"), "norm": (norm, "norm_kernel")}[kernel]
  def broken(*args, **kwargs): raise RuntimeError("no such instruction on this device")
  monkeypatch.setattr(module, fn, broken)
  tables = ((lanes, "use_lanes"), (matvec, "use_matvec"), (attention, "use_kernels"), (attention, "use_chunks"),
            (norm, "use_kernel"), (norm, "use_group"))
  for table, name in tables: monkeypatch.setattr(table, name, {})   # earlier tests' choices: measured here afresh
  monkeypatch.setenv("SPEC_STEP_CACHE", "")
  model, plain = load(tiny_dir / "target"), load(tiny_dir / "target", plain=True)
  seq = [int(t) for t in np.random.default_rng(4).integers(0, 64, 6)]
  for m in (model, plain): m.prefill(seq[:-1])
  got, expected = model(seq[-1:], 5).numpy(), plain(seq[-1:], 5).numpy()
  lines = [l for l in capfd.readouterr().err.splitlines() if "cannot run" in l]
  assert lines and all("no such instruction on this device" in l and "tinygrad's kernels run instead" in l for l in lines)
  assert all({"lanes": "lanes kernel", "attention": "attention kernels", "norm": "layer norm kernel"}[kernel] in l for l in lines)
  table = {"lanes": lanes.use_lanes, "attention": attention.use_kernels, "norm": norm.use_kernel}[kernel]
  assert table and not any(table.values()) and not disk.get(kernel), "a failure was taken as a measurement"
  assert_close(got, expected)

def test_plain_runs_the_port_on_tinygrad_alone(tiny_dir, tmp_path, monkeypatch):
  """plain=True: the port's own modules, tinygrad's TinyJit and executor (no replay graph), nothing measured, stored or
  loaded, and every kernel tinygrad's own."""
  monkeypatch.setenv("SPEC_STEP_CACHE", str(tmp_path))
  monkeypatch.setattr(measure, "faster", lambda *a: pytest.fail("measured under plain"))
  monkeypatch.setattr(measure, "half_pays", lambda: pytest.fail("measured under plain"))
  model = load(tiny_dir / "target", plain=True)
  assert type(model.h[0].attn.c_attn) is nn.Linear and type(model.ln_f) is models.gpt2.LayerNorm and "attend" not in vars(model.h[0].attn)
  before = set(to_program_cache)
  spec.speculative_generate(model, load(tiny_dir / "draft", plain=True), [5, 6, 7], 2, 12, spec.Sampling(1.0), eos=None)
  assert all(type(step) is type(TinyJit(lambda: None)) for step in model.jits.values())
  calls = [call.src[0] for step in model.jits.values() if step.captured for call in step.captured.linear.src]
  assert calls and not any(c.op is Ops.CUSTOM_FUNCTION for c in calls) or Device[Device.DEFAULT].graph is not None
  names = {p.arg.name for k, p in to_program_cache.items() if k not in before}
  assert names and not any(n.startswith(("lanes_", "scores_", "values_", "norm_")) for n in names)
  assert list(tmp_path.iterdir()) == [], "a plain run stored a step"

def generations(target, draft, prompt, Ks=(1, 4), n=40) -> list:
  """Greedy, sampled and filtered generations at a fixed seed for each K, and the target alone (K 0)."""
  samplings = (spec.Sampling(0.0), spec.Sampling(1.0), spec.Sampling(0.8, 20, 0.9))
  return [(K, s, spec.speculative_generate(target, draft, prompt, K, n, s, seed=5, eos=None)[0]) for K in Ks for s in samplings] \
    + [(0, s, spec.autoregressive_generate(target, prompt, n, s, seed=5, eos=None)[0]) for s in samplings[:2]]

@pytest.mark.backend
@pytest.mark.long
def test_the_engine_generates_what_the_port_alone_generates(tiny_dir, monkeypatch):
  """With the engine's kernels wherever they fit (not only where they measure faster) and with plain=True, the same
  tokens: greedy, sampled at a fixed seed, filtered, the target alone; and a (K+1)-wide pass's logits within the
  dtype's tolerance (the kernels sum in another order)."""
  everywhere(monkeypatch)
  monkeypatch.setenv("SPEC_STEP_CACHE", "")
  pairs = [(load(tiny_dir / "target", plain=p), load(tiny_dir / "draft", plain=p)) for p in (False, True)]
  assert generations(*pairs[0], [5, 9, 2]) == generations(*pairs[1], [5, 9, 2])
  block = [int(t) for t in np.random.default_rng(3).integers(0, 64, 5)]
  assert_close(*[target(block, 0).numpy() for target, _ in pairs])
  assert {"lanes_5_96_32", "scores_5_2_16", "norm_5_32"} <= {p.arg.name for p in to_program_cache.values()}

@pytest.mark.backend
@pytest.mark.long
def test_the_engine_generates_what_the_port_alone_generates_on_the_shared_pair(enc):
  """The shared pair, the engine's measured choices against plain=True: the same tokens, greedy and sampled."""
  pairs = [(load(shared_dir() / "docs-target", plain=p), load(shared_dir() / "docs-draft", plain=p)) for p in (False, True)]
  prompt = enc.encode("The Python interpreter")
  runs = [generations(target, draft, prompt, (4,), 24) for target, draft in pairs]
  for (K, sampling, ours), (_, _, port) in zip(*runs):
    if ours != port: assert_rounding_apart(*pairs, prompt, ours, port, f"K {K}, {sampling}")

def assert_rounding_apart(engine_pair, plain_pair, prompt, ours, port, what):
  """float32: no difference at all. float16: at the first difference, the engine's and the port's next-token logits (the
  target's and the draft's) agree within the dtype's tolerance: a choice can flip where the two round differently, and
  nothing else may differ."""
  i = next(i for i, (a, b) in enumerate(zip(ours + [None], port + [None])) if a != b)
  assert dtype() == "float16", f"{what}: the engine's tokens differ from the port's at {i}"
  context = prompt + ours[:i]
  for model, reference in zip(engine_pair, plain_pair):
    assert_close(model(context, 0)[-1].numpy(), reference(context, 0)[-1].numpy())

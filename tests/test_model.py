"""The GPT-2 port: parity with an independent numpy GPT-2, KV cache and rollback, JIT, loading errors."""
import collections, json
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, UOp, Device, Context, dtypes
from tinygrad.engine.realize import get_graph_runtime
from tinygrad.nn.state import get_state_dict
from tinygrad.uop.ops import Ops
from tinygrad.codegen import to_program_cache
import models
from models import attention, gpt2, linear, norm, replay
from conftest import TINY, dtype, load, np_gpt2_logits, random_weights, read_safetensors, shared_dir, tolerance, write_checkpoint, write_safetensors

def logits(model, tokens, start_pos=0) -> np.ndarray:
  return model.forward(Tensor([tokens], dtype=dtypes.int32), start_pos).numpy()

def assert_close(actual, expected):
  """Agreement relative to the logit scale, within the suite's dtype's tolerance."""
  err = np.abs(actual - expected).max() / np.abs(expected).max()
  assert err < tolerance(), f"max error {err:.2e} of the logit scale"

@pytest.mark.backend
@pytest.mark.parametrize("prefixed", [False, True], ids=["hf-original-keys", "transformer-prefixed-keys"])
def test_parity_tiny_random(tmp_path, prefixed):
  weights = random_weights(TINY, seed=11)
  model = load(write_checkpoint(tmp_path / "ckpt", TINY, weights, prefixed))
  tokens = list(np.random.default_rng(0).integers(0, TINY["vocab_size"], 20))
  assert_close(logits(model, tokens), np_gpt2_logits(weights, TINY["n_head"], tokens))

@pytest.mark.backend
def test_padded_lm_head(tmp_path):
  """A vocabulary that is no multiple of 64 runs its lm_head over zero rows up to one; the logits are the vocabulary's."""
  cfg = dict(TINY, vocab_size=50)
  weights = random_weights(cfg, seed=12)
  model = load(write_checkpoint(tmp_path / "ckpt", cfg, weights))
  assert model.wte.weight.shape == (64, TINY["n_embd"]) and not model.wte.weight[50:].numpy().any()
  tokens = list(np.random.default_rng(2).integers(0, 50, 20))
  out = logits(model, tokens)
  assert out.shape == (20, 50)
  assert_close(out, np_gpt2_logits(weights, TINY["n_head"], tokens))
  assert_close(model(Tensor([tokens[:5]], dtype=dtypes.int32), 0).numpy(), out[:5])  # the JIT-compiled path

@pytest.mark.backend
def test_loaded_weights_are_buffers_in_the_models_layout(tmp_path):
  """The file's Conv1D weights (stored (in, out)) and its unpadded wte become buffers in the model's own layout, not
  transposed or padded views of the file's (as a float32 load left them): a checkpoint then runs the same kernels as
  random weights, and its lm_head reads no masked rows (the shared target, default kernels: decode 9.3 ms, was 11.2)."""
  model = load(write_checkpoint(tmp_path / "ckpt", dict(TINY, vocab_size=50), random_weights(dict(TINY, vocab_size=50), seed=13)))
  def own_buffer(t:Tensor) -> bool:
    u = t.uop
    while u.op is Ops.RESHAPE: u = u.src[0]
    return u.op is Ops.BUFFER and u.shape == (t.numel(),)
  views = [k for k, t in get_state_dict(model).items() if not k.startswith("jits.") and not own_buffer(t)]
  assert views == [], f"views of the file's layout: {views}"

@pytest.mark.backend
@pytest.mark.parametrize("name", ["docs-target", "docs-draft"])
def test_parity_shared_checkpoints(name, enc):
  path = shared_dir() / name
  model, cfg = load(path), json.loads((path / "config.json").read_text())
  tokens = enc.encode("The Python interpreter reads a dictionary of names and values.")
  assert_close(logits(model, tokens), np_gpt2_logits(read_safetensors(path / "model.safetensors"), cfg["n_head"], tokens))

@pytest.fixture(scope="module")
def tiny(tiny_dir): return load(tiny_dir / "target")

@pytest.mark.backend
def test_incremental_decode_equals_full_forward_and_rollback(tiny):
  rng = np.random.default_rng(1)
  tokens = [int(t) for t in rng.integers(0, 64, 24)]
  full = logits(tiny, tokens)
  tiny.prefill(tokens[:4])
  steps = [tiny(Tensor([[t]], dtype=dtypes.int32), i).numpy()[0] for i, t in enumerate(tokens[4:], start=4)]
  np.testing.assert_allclose(np.stack(steps), full[4:], atol=tolerance() * np.abs(full).max())
  # roll back r positions and feed other tokens: the same as a fresh forward over the new sequence
  for r in (1, 5, 12):
    other = [int(t) for t in rng.integers(0, 64, r)]
    new_seq = tokens[:-r] + other
    got = [tiny(Tensor([[t]], dtype=dtypes.int32), i).numpy()[0] for i, t in enumerate(other, start=len(tokens) - r)]
    np.testing.assert_allclose(np.stack(got), logits(tiny, new_seq)[-r:], atol=tolerance() * np.abs(full).max())
    tiny.prefill(tokens)  # restore the original sequence for the next r

@pytest.mark.backend
@pytest.mark.parametrize("K", [1, 4, 8])
def test_verify_pass_equals_single_steps(tiny, K):
  rng = np.random.default_rng(K)
  prefix, block = [int(t) for t in rng.integers(0, 64, 7)], [int(t) for t in rng.integers(0, 64, K + 1)]
  tiny.prefill(prefix)
  verify = tiny(Tensor([block], dtype=dtypes.int32), len(prefix)).numpy()
  tiny.prefill(prefix)
  steps = np.stack([tiny(Tensor([[t]], dtype=dtypes.int32), len(prefix) + i).numpy()[0] for i, t in enumerate(block)])
  np.testing.assert_allclose(verify, steps, atol=tolerance() * np.abs(steps).max())

@pytest.mark.backend
def test_no_compilation_after_warmup_and_instances_are_independent(tiny_dir):
  a, b = load(tiny_dir / "target"), load(tiny_dir / "other")
  toks = lambda n: Tensor([[3] * n], dtype=dtypes.int32)
  for m in (a, b):
    m(toks(1), 5), m(toks(5), 5)                             # warm-up: a step captures on its first call
  compiled = len(to_program_cache)
  for pos in range(6, 60):
    a(toks(1), pos).realize(); a(toks(5), pos + 1).realize(); b(toks(1), pos).realize()
  assert len(to_program_cache) == compiled, "a decode or verify step compiled a kernel after warm-up"
  # alternating calls: each instance answers with its own weights (its own JIT and cache)
  seq = [int(t) for t in np.random.default_rng(5).integers(0, 64, 9)]
  a.prefill(seq[:8]); b.prefill(seq[:8])
  la, lb = a(Tensor([seq[8:]], dtype=dtypes.int32), 8).numpy(), b(Tensor([seq[8:]], dtype=dtypes.int32), 8).numpy()
  np.testing.assert_allclose(la, logits(a, seq)[-1:], atol=tolerance() * np.abs(la).max())
  np.testing.assert_allclose(lb, logits(b, seq)[-1:], atol=tolerance() * np.abs(lb).max())
  assert not np.allclose(la, lb)
  decode = ("forward", 1)
  assert a.jits is not b.jits and a.jits[decode] is not b.jits[decode]

@pytest.mark.backend
def test_steps_replay_their_kernels_as_tinygrads_executor_runs_them(tiny_dir):
  """A captured step on a device without a graph of its own runs as models/replay.py's batches, and computes what
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
  if Device[Device.DEFAULT].graph is replay.Replay:
    assert all(isinstance(get_graph_runtime(g), replay.Replay) for g in graphs)

@pytest.mark.backend
def test_a_prefill_of_a_new_length_compiles_nothing(tiny):
  """A prefill runs passes of power-of-two widths (7 tokens: 4, 2, 1): once those are captured, prompts of other lengths
  made of them compile nothing, and the cache they fill is the full forward's."""
  seq = [int(t) for t in np.random.default_rng(8).integers(0, 64, 12)]
  full = logits(tiny, seq)
  tiny.prefill(seq[:7]); tiny(seq[7:8], 7)
  compiled = len(to_program_cache)
  for n in (6, 5, 3, 1):                                            # 4+2, 4+1, 2+1, 1: new lengths, the same widths
    tiny.prefill(seq[:n])
    np.testing.assert_allclose(tiny(seq[n:n+1], n).numpy(), full[n:n+1], atol=tolerance() * np.abs(full).max())
  assert len(to_program_cache) == compiled, "a prefill of a new length compiled a kernel"

def lanes_programs() -> set[str]: return {p.arg.name for p in to_program_cache.values() if p.arg.name.startswith("lanes_")}

@pytest.mark.backend
@pytest.mark.parametrize("T", [1, 2, 3, 5, 9, 16])
def test_lanes_kernel_computes_the_matmul(T):
  """The lanes kernel is x @ w.T for every width a step may run (its rows in chunks: 9 = 3 x 3, 16 = 2 x 8), in the
  suite's dtype: inputs in it, float32 inside, the result in the output dtype."""
  rng = np.random.default_rng(T)
  for N, C in ((96, 32), (64, 64), (256, 128)):
    x, w = (Tensor(rng.standard_normal(shape).astype(np.float32)).cast(dtype()).realize() for shape in ((1, T, C), (N, C)))
    expected = x.float().numpy().astype(np.float64) @ w.float().numpy().astype(np.float64).T
    for out in (None, dtypes.float32):
      got = linear.linear(x, w, out, lanes=True)
      assert got.shape == (1, T, N) and got.dtype == (out or x.dtype)
      assert np.abs(got.float().numpy() - expected).max() / np.abs(expected).max() < tolerance()
    assert f"lanes_{T}_{N}_{C}" in lanes_programs()
  assert not linear.fits(98, 32) and not linear.fits(96, 48) and linear.fits(96, 64) and not linear.fits(100, 64)

def test_choose_measures_once_per_machine(monkeypatch):
  """choose() times both kernels on the weights given, keeps the faster, and asks tinygrad's disk cache first: a second
  process (an empty use_lanes) measures nothing. Shapes the lanes kernel does not fit are never measured."""
  disk, timed = {}, []
  monkeypatch.setattr(linear, "use_lanes", {})
  monkeypatch.setattr(linear, "diskcache_get", lambda table, key: disk.get((table, key)))
  monkeypatch.setattr(linear, "diskcache_put", lambda table, key, val: disk.setdefault((table, key), val))
  monkeypatch.setattr(linear, "seconds", lambda x, weights, lanes: timed.append((x.shape, lanes)) or (1.0 if lanes else 2.0))
  weights = [Tensor.empty(64, 32) for _ in range(3)]
  assert linear.choose(3, weights, dtypes.float32) is True and timed == [((3, 32), True), ((3, 32), False)]
  assert linear.use_lanes == {(3, 64, 32, dtypes.float32, dtypes.float32): True}
  monkeypatch.setattr(linear, "use_lanes", {})
  assert linear.choose(3, weights, dtypes.float32) is True and len(timed) == 2, "measured again"
  assert linear.choose(3, [Tensor.empty(66, 32)], dtypes.float32) is False and len(timed) == 2
  monkeypatch.setattr(linear, "seconds", lambda x, weights, lanes: 2.0 if lanes else 1.0)
  assert linear.choose(5, weights, dtypes.float32) is False and linear.use_lanes[(5, 64, 32, dtypes.float32, dtypes.float32)] is False

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

def attention_programs() -> set[str]: return {p.arg.name for p in to_program_cache.values() if p.arg.name.startswith(("scores_", "values_"))}

@pytest.mark.backend
@pytest.mark.parametrize("T", [1, 2, 3, 5, 9, 16])
def test_attention_kernels_compute_attention(T):
  """attention.py's kernels and tinygrad's broadcasts both compute causal attention over the cache, for every width a
  step may run (rows in chunks: 9 = 3 x 3, 16 = 2 x 8), at the first positions and deep in the cache, with the position
  a bound variable (a captured step: one compile for every position), an expression of one (a draft's later steps run
  at start_pos + 1, ...) or a Python int (an eager pass: at 0, T = 1 is a range of one position)."""
  rng = np.random.default_rng(T)
  H, P, D = 3, 64, 32
  qkv, cache = (Tensor(rng.standard_normal(shape).astype(np.float32)).cast(dtype()).realize() for shape in ((1, T, 3 * H * D), (2, 1, H, P, D)))
  start_pos, earlier_pos = UOp.variable("start_pos", 0, P - T), UOp.variable("start_pos", 0, P - T - 2)
  for kernels in (True, False):
    step = TinyJit(lambda qkv, pos: attention.attend(qkv, cache, pos, kernels).realize())
    later = TinyJit(lambda qkv, pos: attention.attend(qkv, cache, pos + 2, kernels).realize())
    for start in (0, 2, P - T - 7, P - T):
      expected = np_attention(qkv.float().numpy().astype(np.float64), cache.float().numpy().astype(np.float64), start)
      results = [step(qkv, start_pos.bind(start))] + ([later(qkv, earlier_pos.bind(start - 2))] if start >= 2 else [])
      for got in results + ([attention.attend(qkv, cache, start, kernels)] if start == 0 else []):
        assert got.shape == (1, T, H * D) and got.dtype == qkv.dtype
        assert np.abs(got.float().numpy()[0] - expected).max() / np.abs(expected).max() < tolerance(), (kernels, start)
  assert {f"scores_{T}_{H}_{D}", f"values_{T}_{H}_{D}"} <= attention_programs()

def test_attention_choose_measures_once_per_machine(monkeypatch):
  """attention.choose() times its kernels and tinygrad's broadcasts over the caches given, keeps the faster, and asks
  tinygrad's disk cache first; a head dimension the kernels do not split is never measured."""
  disk, timed = {}, []
  monkeypatch.setattr(attention, "use_kernels", {})
  monkeypatch.setattr(linear, "diskcache_get", lambda table, key: disk.get((table, key)))
  monkeypatch.setattr(linear, "diskcache_put", lambda table, key, val: disk.setdefault((table, key), val))
  monkeypatch.setattr(attention, "seconds", lambda T, caches, dtype, kernels: timed.append((T, kernels)) or (1.0 if kernels else 2.0))
  caches = [Tensor.empty(2, 1, 4, 128, 64) for _ in range(2)]
  assert attention.choose(5, caches, dtypes.float32) is True and timed == [(5, True), (5, False)]
  assert attention.use_kernels == {(5, 4, 128, 64, dtypes.float32): True}
  monkeypatch.setattr(attention, "use_kernels", {})
  assert attention.choose(5, caches, dtypes.float32) is True and len(timed) == 2, "measured again"
  assert attention.choose(5, [Tensor.empty(2, 1, 4, 128, 30)], dtypes.float32) is False and len(timed) == 2
  monkeypatch.setattr(attention, "seconds", lambda T, caches, dtype, kernels: 2.0 if kernels else 1.0)
  assert attention.choose(1, caches, dtypes.float32) is False and attention.use_kernels[(1, 4, 128, 64, dtypes.float32)] is False

@pytest.mark.backend
@pytest.mark.parametrize("T", [1, 2, 5, 16])
def test_norm_kernel_computes_layer_norm(T):
  """norm.py's kernel and tinygrad's both compute nn.LayerNorm over each row, for every width a step may run, in the
  suite's dtype, on rows whose mean is far from 0 (a mean taken carelessly would cancel)."""
  rng = np.random.default_rng(T)
  for C in (32, 768):
    x = Tensor((rng.standard_normal((1, T, C)) * 3 + 20).astype(np.float32)).cast(dtype()).realize()
    w, b = (Tensor(rng.standard_normal(C).astype(np.float32)).cast(dtype()).realize() for _ in range(2))
    xs = x.float().numpy().astype(np.float64)
    expected = (xs - xs.mean(-1, keepdims=True)) / np.sqrt(xs.var(-1, keepdims=True) + 1e-5) * w.float().numpy() + b.float().numpy()
    for kernel in (True, False):
      got = norm.layer_norm(x, w, b, 1e-5, kernel)
      assert got.shape == x.shape and got.dtype == x.dtype
      assert np.abs(got.float().numpy() - expected).max() / np.abs(expected).max() < tolerance(), (C, kernel)
    assert f"norm_{T}_{C}" in {p.arg.name for p in to_program_cache.values()}

def test_norm_choose_measures_once_per_machine(monkeypatch):
  """norm.choose() times its kernel and tinygrad's over the norms given, keeps the faster, and asks tinygrad's disk cache
  first: a second process (an empty use_kernel) measures nothing."""
  disk, timed = {}, []
  monkeypatch.setattr(norm, "use_kernel", {})
  monkeypatch.setattr(linear, "diskcache_get", lambda table, key: disk.get((table, key)))
  monkeypatch.setattr(linear, "diskcache_put", lambda table, key, val: disk.setdefault((table, key), val))
  monkeypatch.setattr(norm, "seconds", lambda T, norms, dtype, kernel: timed.append((T, kernel)) or (1.0 if kernel else 2.0))
  norms = [norm.LayerNorm(48) for _ in range(3)]
  assert norm.choose(5, norms, dtypes.float32) is True and timed == [(5, True), (5, False)]
  assert norm.use_kernel == {(5, 48, dtypes.float32): True}
  monkeypatch.setattr(norm, "use_kernel", {})
  assert norm.choose(5, norms, dtypes.float32) is True and len(timed) == 2, "measured again"
  monkeypatch.setattr(norm, "seconds", lambda T, norms, dtype, kernel: 2.0 if kernel else 1.0)
  assert norm.choose(1, norms, dtypes.float32) is False and norm.use_kernel[(1, 48, dtypes.float32)] is False

def test_auto_dtype_is_half_where_half_measures_faster(monkeypatch):
  """--dtype auto asks a measurement, not the device's name: half where a half matrix-vector product is clearly faster
  (timed once per machine, then read from tinygrad's disk cache), float32 where it is not or the device has no half."""
  disk, timed = {}, []
  monkeypatch.setattr(linear, "diskcache_get", lambda table, key: disk.get((table, key)))
  monkeypatch.setattr(linear, "diskcache_put", lambda table, key, val: disk.setdefault((table, key), val))
  renderer = Device[Device.DEFAULT].renderer
  monkeypatch.setattr(type(renderer), "supported_dtypes", lambda self: [dtypes.float32, dtypes.half])
  class Fake:   # what half_pays() builds, without kernels for a half the device may not have
    def __init__(self, dtype=dtypes.float32): self.dtype = dtype
    @staticmethod
    def ones(*shape, dtype=dtypes.float32): return Fake(dtype)
    def cast(self, dtype): return Fake(dtype)
    def contiguous(self): return self
    def realize(self): return self
  monkeypatch.setattr(linear, "Tensor", Fake)
  def seconds(cost): return lambda x, weights, lanes: timed.append(lanes) or cost[weights[0].dtype]
  monkeypatch.setattr(linear, "seconds", seconds({dtypes.half: 1.0, dtypes.float32: 2.0}))
  assert gpt2.resolve_dtype("auto") == dtypes.half and timed == [False, False]
  assert gpt2.resolve_dtype("auto") == dtypes.half and len(timed) == 2, "measured again"
  assert gpt2.resolve_dtype("float32") == dtypes.float32 and len(timed) == 2
  disk.clear()
  monkeypatch.setattr(linear, "seconds", seconds({dtypes.half: 1.0, dtypes.float32: 1.2}))   # faster, not clearly
  assert gpt2.resolve_dtype("auto") == dtypes.float32
  disk.clear()
  monkeypatch.setattr(type(renderer), "supported_dtypes", lambda self: [dtypes.float32])
  monkeypatch.setattr(linear, "seconds", lambda *a: pytest.fail("measured a dtype the device does not have"))
  assert gpt2.resolve_dtype("auto") == dtypes.float32

@pytest.mark.backend
def test_a_model_on_its_own_kernels(tiny_dir, monkeypatch):
  """Where the choices pick this project's kernels, every linear layer and the lm_head of a pass run the lanes kernel,
  every layer's attention the attention kernels and every layer norm the norm kernel: the logits of a plain forward
  and of captured steps (a decode and a 5-token verify pass) are the numpy GPT-2's."""
  class Everywhere(dict):
    def get(self, key, default=None): return linear.fits(*key[1:3])
  monkeypatch.setattr(linear, "use_lanes", Everywhere())
  monkeypatch.setattr(attention, "use_kernels", collections.defaultdict(lambda: True))
  monkeypatch.setattr(norm, "use_kernel", collections.defaultdict(lambda: True))
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
  assert {"lanes_5_96_32", "lanes_1_32_32", "lanes_1_128_32", "lanes_5_32_128", "lanes_1_64_32"} <= lanes_programs()
  assert {"scores_5_2_16", "values_5_2_16", "scores_1_2_16", "values_1_2_16"} <= attention_programs()
  assert {"norm_5_32", "norm_1_32"} <= {p.arg.name for p in to_program_cache.values()}

def test_steps_choose_their_linear_kernels_and_search_the_rest(tiny_dir, monkeypatch):
  """Every step pass (at most STEP_WIDTH tokens) has the kernels of its linear layers, attention and layer norms chosen by
  measurement (models/linear.py, models/attention.py, models/norm.py) for its width and for one token, whatever the
  search; with search > 0 its other kernels come from tinygrad's BEAM search (which caches its result on disk: a machine
  searches a kernel once). A prefill chooses and searches nothing. The logits do not change."""
  import tinygrad.codegen.opt.search as tinygrad_search
  beams, beam_search = [], tinygrad_search.beam_search  # the beam width of every kernel search
  monkeypatch.setattr(tinygrad_search, "beam_search", lambda *a, **kw: beams.append(a[3]) or beam_search(*a, **kw))
  monkeypatch.setattr(linear, "use_lanes", {})
  monkeypatch.setattr(attention, "use_kernels", {})
  monkeypatch.setattr(norm, "use_kernel", {})
  plain, searched = load(tiny_dir / "target"), load(tiny_dir / "target", search=1)
  seq = [int(t) for t in np.random.default_rng(6).integers(0, 64, 7)]
  searched.prefill(seq[:-1])
  assert beams == [] and linear.use_lanes == attention.use_kernels == norm.use_kernel == {}, "a prefill searched or chose"
  assert searched.jit(searched.forward, gpt2.STEP_WIDTH + 1).search == 0 and linear.use_lanes == attention.use_kernels == norm.use_kernel == {}
  step = [searched(seq[-1:], len(seq) - 1).numpy() for _ in range(3)]    # captured on the first call
  assert beams and set(beams) == {1}
  assert {(T, N, C) for T, N, C, *_ in linear.use_lanes} == {(1, 96, 32), (1, 32, 32), (1, 128, 32), (1, 32, 128), (1, 64, 32)}
  assert set(attention.use_kernels) == {(1, 2, 256, 16, searched.dtype)} and set(norm.use_kernel) == {(1, 32, searched.dtype)}
  plain.prefill(seq[:-1])
  beams.clear()
  expected = plain(seq[-2:], len(seq) - 2).numpy()
  assert beams == [] and {T for T, *_ in linear.use_lanes} == {T for T, *_ in attention.use_kernels} == {T for T, *_ in norm.use_kernel} == {1, 2}, \
    "search 0 searched, or did not choose"
  two = [searched(seq[-2:], len(seq) - 2).numpy() for _ in range(3)]
  assert beams and set(beams) == {1}
  np.testing.assert_allclose(np.concatenate([step[-1], two[-1]]), np.concatenate([expected[-1:], expected]),
                             atol=tolerance() * np.abs(expected).max())

@pytest.mark.backend
def test_captured_steps_are_stored_and_run_on_the_loading_models_weights(tiny_dir, tmp_path, monkeypatch):
  """A captured step is stored (Step, step_file) and a later instance of the same shape loads it instead of capturing:
  it runs on that instance's own weights and KV cache (stored by name), exactly as a step it captured itself would. An
  unreadable file is captured again and rewritten; SPEC_STEP_CACHE="" stores nothing."""
  monkeypatch.setenv("SPEC_STEP_CACHE", str(tmp_path / "steps"))
  seq = [int(t) for t in np.random.default_rng(7).integers(0, 64, 9)]
  def decode(model):  # a prefill's pass of 8 tokens, then a one-token step, each captured on its first call
    model.prefill(seq[:-1])
    return [model(seq[-1:], len(seq) - 1).numpy() for _ in range(3)][-1]
  step = lambda model: model.jit(model.forward, 1)
  prefill = lambda model: model.jit(model.forward, 8, step=False)
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

def test_size_table_parameter_counts():
  assert {k: round(c.n_params / 1e6) for k, c in models.CONFIGS.items()} == \
    {"gpt2": 124, "gpt2-medium": 355, "gpt2-large": 774, "gpt2-xl": 1558}

# ***** bad weights: one clear error naming the file and the problem *****

@pytest.fixture
def good(tmp_path): return write_checkpoint(tmp_path / "ckpt", TINY, random_weights(TINY, seed=4))

def expect_error(path, *words):
  with pytest.raises(models.CheckpointError) as e: models.load(str(path))
  for w in words: assert w in str(e.value), str(e.value)

def test_missing_directory(tmp_path): expect_error(tmp_path / "nope", "no such checkpoint directory")
def test_unknown_model_name(): expect_error("gpt3", "unknown model 'gpt3'", "gpt2-xl")
def test_missing_config(good): (good / "config.json").unlink(); expect_error(good, "config.json", "missing")
def test_missing_weights_file(good): (good / "model.safetensors").unlink(); expect_error(good, "model.safetensors", "missing")

def test_corrupt_config(good):
  (good / "config.json").write_text("{not json"); expect_error(good, "config.json", "not valid JSON")

def test_truncated_weights(good):
  fn = good / "model.safetensors"
  fn.write_bytes(fn.read_bytes()[:-1000]); expect_error(good, str(fn), "truncated")

def test_garbage_weights(good):
  fn = good / "model.safetensors"
  fn.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00this is no json" + bytes(100)); expect_error(good, str(fn), "not a valid safetensors")

def test_missing_key(good):
  w = random_weights(TINY, seed=4); del w["h.1.mlp.c_fc.bias"]
  write_safetensors(good / "model.safetensors", w); expect_error(good, "missing weight h.1.mlp.c_fc.bias")

def test_wrong_shape(good):
  w = random_weights(TINY, seed=4); w["h.0.attn.c_proj.weight"] = w["h.0.attn.c_proj.weight"][:16]
  write_safetensors(good / "model.safetensors", w); expect_error(good, "h.0.attn.c_proj.weight", "shape")

def test_wrong_vocabulary_rows(good):
  w = random_weights(TINY, seed=4); w["wte.weight"] = w["wte.weight"][:40]
  write_safetensors(good / "model.safetensors", w); expect_error(good, "wte.weight", "(40, 32)", "expected (64, 32)")

"""The GPT-2 port, alone (plain) and with the engine: parity with an independent numpy GPT-2, KV cache and rollback,
the JIT, loading errors."""
import json, subprocess, sys
import numpy as np
import pytest
from tinygrad import Tensor, dtypes
from tinygrad.nn.state import get_state_dict
from tinygrad.uop.ops import Ops
from tinygrad.codegen import to_program_cache
import models
from conftest import ROOT, TINY, load, np_gpt2_logits, random_weights, read_safetensors, shared_dir, tolerance, write_checkpoint, \
  write_safetensors

PLAIN = pytest.mark.parametrize("plain", [False, True], ids=["engine", "plain"])

def logits(model, tokens, start_pos=0) -> np.ndarray:
  return model.forward(Tensor([tokens], dtype=dtypes.int32), start_pos).numpy()

def assert_close(actual, expected):
  """Agreement relative to the logit scale, within the suite's dtype's tolerance."""
  err = np.abs(actual - expected).max() / np.abs(expected).max()
  assert err < tolerance(), f"max error {err:.2e} of the logit scale"

@pytest.mark.backend
@pytest.mark.quick
@PLAIN
@pytest.mark.parametrize("prefixed", [pytest.param(False, marks=pytest.mark.gpu), True], ids=["hf-original-keys", "transformer-prefixed-keys"])
def test_parity_tiny_random(tmp_path, prefixed, plain):
  weights = random_weights(TINY, seed=11)
  model = load(write_checkpoint(tmp_path / "ckpt", TINY, weights, prefixed), plain=plain)
  tokens = list(np.random.default_rng(0).integers(0, TINY["vocab_size"], 20))
  expected = np_gpt2_logits(weights, TINY["n_head"], tokens)
  assert_close(logits(model, tokens), expected)
  last = model.forward(Tensor([tokens], dtype=dtypes.int32), 0, last=True).numpy()   # a draft step's: the last row's
  assert last.shape == (1, TINY["vocab_size"])
  assert_close(last, expected[-1:])

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
@PLAIN
@pytest.mark.parametrize("name", ["docs-target", "docs-draft"])
def test_parity_shared_checkpoints(name, enc, plain):
  path = shared_dir() / name
  model, cfg = load(path, plain=plain), json.loads((path / "config.json").read_text())
  tokens = enc.encode("The Python interpreter reads a dictionary of names and values.")
  assert_close(logits(model, tokens), np_gpt2_logits(read_safetensors(path / "model.safetensors"), cfg["n_head"], tokens))

@pytest.fixture(scope="module", params=[False, True], ids=["engine", "plain"])
def tiny(tiny_dir, request): return load(tiny_dir / "target", plain=request.param)

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
@pytest.mark.parametrize("K", [1, 4, 8])   # the emulated GPU: test_gpu.py's rollback test, a wide pass against steps
def test_verify_pass_equals_single_steps(tiny, K):
  rng = np.random.default_rng(K)
  prefix, block = [int(t) for t in rng.integers(0, 64, 7)], [int(t) for t in rng.integers(0, 64, K + 1)]
  tiny.prefill(prefix)
  verify = tiny(Tensor([block], dtype=dtypes.int32), len(prefix)).numpy()
  tiny.prefill(prefix)
  steps = np.stack([tiny(Tensor([[t]], dtype=dtypes.int32), len(prefix) + i).numpy()[0] for i, t in enumerate(block)])
  np.testing.assert_allclose(verify, steps, atol=tolerance() * np.abs(steps).max())

@pytest.mark.backend
@PLAIN
def test_no_compilation_after_warmup_and_instances_are_independent(tiny_dir, plain):
  a, b = load(tiny_dir / "target", plain=plain), load(tiny_dir / "other", plain=plain)
  toks = lambda n: Tensor([[3] * n], dtype=dtypes.int32)
  for m in (a, b):
    for _ in range(3): m(toks(1), 5), m(toks(5), 5)          # warm-up: captured by the second call at the latest
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
def test_a_prefill_of_a_new_length_compiles_nothing(tiny):
  """A prefill runs one pass of the power of two that holds the prompt, padded (7 tokens: 8): once it is captured,
  prompts of 5 to 8 tokens compile nothing, and the cache they fill is the full forward's, whatever the padding wrote
  past them (fails where the padding's keys are read, or a length compiles a pass of its own)."""
  seq = [int(t) for t in np.random.default_rng(8).integers(0, 64, 12)]
  full = logits(tiny, seq)
  tiny.prefill(seq[:7]); tiny(seq[7:8], 7)
  compiled = len(to_program_cache)
  for n in (6, 5, 8):
    tiny.prefill(seq[:n])
    np.testing.assert_allclose(tiny(seq[n:n+1], n).numpy(), full[n:n+1], atol=tolerance() * np.abs(full).max())
  assert len(to_program_cache) == compiled, "a prefill of a new length compiled a kernel"

def test_size_table_parameter_counts():
  assert {k: round(c.n_params / 1e6) for k, c in models.CONFIGS.items()} == \
    {"gpt2": 124, "gpt2-medium": 355, "gpt2-large": 774, "gpt2-xl": 1558}

LOAD_PEAK = 1.2   # a load's peak resident memory over its weights' bytes, the process's memory before it set aside

PEAK_SCRIPT = """import resource, sys
import models
from tinygrad.nn.state import get_state_dict
def peak() -> int:  # this process's own: ru_maxrss on Linux keeps the parent's across fork and exec
  try: return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) * 1024
  except OSError: return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
models.check_device()
before = peak()
model = models.load(sys.argv[1], "float32", plain=sys.argv[2] == "plain")
weights = sum(t.nbytes() for k, t in get_state_dict(model).items() if "cache_kv" not in k and not k.startswith("jits."))
print(before, peak(), weights)"""

@pytest.mark.backend
@pytest.mark.parametrize("way", ["plain", "engine"])
def test_a_load_holds_each_weight_once(tmp_path, way):
  """Loading a checkpoint of a few hundred MB raises the process's peak resident memory by at most LOAD_PEAK times its
  weights (each tensor read, laid out and realized in turn; the file not mapped; the KV cache untouched until used;
  the engine's move of the weights into huge pages one tensor at a time).
  Until 2026-11-28 a load peaked at 3.1x (gpt2-xl's 6.23 GB: 19.4 GB)."""
  cfg = dict(n_layer=6, n_head=8, n_embd=1024, vocab_size=2048, n_positions=1024)
  path = write_checkpoint(tmp_path / "ckpt", cfg, random_weights(cfg, seed=5))
  run = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(path), way], capture_output=True, text=True, cwd=ROOT)
  assert run.returncode == 0, run.stderr[-2000:]
  before, peak, weights = map(int, run.stdout.split()[-3:])
  print(f"load: {(peak - before) / 1e6:.0f} MB for {weights / 1e6:.0f} MB of weights")
  assert weights > 300e6 and (peak - before) / weights <= LOAD_PEAK

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

"""float16 as a GPU computes it: GPT-2's residual stream carries values in the thousands (the "massive activations"
of Sun et al. 2024, mostly at the first positions), and a layer norm that squared them in half overflowed (past 256),
took the variance as inf and zeroed the row. Marked gpu: CI runs them on CUDA's target emulated in Python
(DEV=PYTHON::sm_80), which rounds half arithmetic as a GPU does (the engine's whole model there with the stats kernel
alone); they run on every device of the suite besides.
Checked against the float64 definition (conftest's numpy GPT-2): the bar is 0.1 on every log-probability and the
same argmax at every position; main at ff585c2 failed each (an error of 5.6 and 0 of 4 on the self-check's model)."""
import numpy as np
import pytest
from tinygrad import Tensor, dtypes
import models
from models.engine import device, norm
from models.engine.choice import CHOSEN, TINYGRAD, Way
from conftest import np_gpt2_logits, random_weights, write_checkpoint
from self_check import MASSIVE, log_probs
from models import engine

CFG = dict(n_layer=2, n_head=2, n_embd=64, vocab_size=64, n_positions=64)
TOKENS = [3, 17, 42, 9]

def massive(tmp_path, where:str):
  """A tiny random checkpoint with MASSIVE in one dimension of position 0's embedding, of every position's residual
  from layer 0's MLP on (its c_proj bias: layer 1's norms and ln_f see it), or both."""
  weights = random_weights(CFG, seed=1)
  if where != "a later layer": weights["wpe.weight"][0, 5] = MASSIVE
  if where != "position 0": weights["h.0.mlp.c_proj.bias"][7] = MASSIVE
  return write_checkpoint(tmp_path / "massive", CFG, weights), weights

def assert_like_float64(model, weights):
  got = log_probs(model.forward(Tensor([TOKENS], dtype=dtypes.int32), 0).numpy())
  expected = log_probs(np_gpt2_logits(weights, CFG["n_head"], TOKENS))
  error, agree = np.abs(got - expected).max(), (got.argmax(-1) == expected.argmax(-1)).sum()
  assert error <= 0.1 and agree == len(TOKENS), f"log-probability error {error:.3g}, argmax {agree} of {len(TOKENS)}"

@pytest.mark.gpu
@pytest.mark.parametrize("where", ["position 0", "a later layer"])
def test_the_port_in_float16_keeps_massive_activations(tmp_path, where):
  """The port (plain) in float16: its layer norms take their statistics in float32 (models/gpt2.py, LayerNorm)."""
  path, weights = massive(tmp_path, where)
  assert_like_float64(models.load(str(path), "float16", plain=True), weights)

# apart: each is minutes on the emulated GPU, which runs the stats kernel's alone: with work-groups the matvec kernel
# takes each block's layer norms inside, so a way is ln_f's, and each way meets massive rows on it below
@pytest.mark.parametrize("kind", ["tinygrad's", "row", pytest.param("stats", marks=pytest.mark.gpu)])
def test_the_engine_in_float16_keeps_massive_activations(tmp_path, monkeypatch, kind):
  """The engine in float16, its kernels wherever they fit (the matvec kernel, with the layer norm inside, where the
  device has work-groups), its layer norms forced to one way: tinygrad's (formula()), the row kernel, or the stats
  kernel at each of its work-group sizes (where the device has none, tinygrad's CPU backend, that it has no size)."""
  path, weights = massive(tmp_path, "both")
  ways = {"tinygrad's": [TINYGRAD], "row": [Way("row")], "stats": [Way("stats", g) for g in norm.groups(CFG["n_embd"])]}
  assert ways[kind] or (kind == "stats" and not device.work_groups())
  with engine.engine_kernels():
    for way in ways[kind]:
      with CHOSEN.fixed(lambda k, key, way=way, engines=CHOSEN.rule: way if k == "norm" else engines(k, key)):
        assert_like_float64(models.load(str(path), "float16"), weights)

@pytest.mark.gpu
def test_the_layer_norms_in_float16_keep_massive_rows():
  """Each way of the engine's layer norm (and the port's) on rows in half with MASSIVE in one element, and on a
  constant row (a variance of 0: its two sums' difference must not round below 0 into a NaN), within half's rounding
  of the float64 definition."""
  rng, C, T = np.random.default_rng(3), 256, 3
  x = rng.standard_normal((T, C)).astype(np.float32)
  x[0, 0], x[1, 100], x[2] = MASSIVE, -MASSIVE, 7.5
  w, b = (rng.standard_normal(C).astype(np.float32) for _ in range(2))
  xs = x.astype(np.float64)
  expected = (xs - xs.mean(-1, keepdims=True)) / np.sqrt(xs.var(-1, keepdims=True) + 1e-5) * w + b
  half = lambda a: Tensor(a).cast(dtypes.half).realize()
  port = models.gpt2.LayerNorm(C)
  port.weight, port.bias = half(w), half(b)
  ways = [("port", port(half(x)))] + [(v, norm.layer_norm(half(x), half(w), half(b), 1e-5, v)) for v in norm.ways(C)]
  for way, got in ways:
    assert got.dtype == dtypes.half
    error = np.abs(got.numpy().astype(np.float64) - expected).max() / np.abs(expected).max()   # half, read as half
    assert error < 1e-2, (way, error)

@pytest.mark.gpu
def test_gelu_in_half_past_its_cubes_overflow():
  """GELU (tanh form) in half: x^3 overflows past |x| = 40.3, tanh(+-inf) is +-1, so the result is x and 0, its
  limits, and no NaN; within half's rounding below it."""
  x = np.array([-3000, -100, -41, -40, -5, -0.5, 0, 0.5, 5, 40, 41, 100, 3000], np.float32)
  got = Tensor(x).cast(dtypes.half).gelu().numpy().astype(np.float32)   # read as half: a cast would let tinygrad skip it
  expected = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x.astype(np.float64) ** 3)))
  assert not np.isnan(got).any() and np.allclose(got, expected, rtol=2e-3, atol=1e-3), got

"""The GPU suite's own small tests, for CUDA's target emulated in Python (DEV=PYTHON::sm_80, pytest -m gpu), where
every kernel runs in the interpreter: decodes against the numpy GPT-2 and after a rollback, greedy identity on few tokens
(K 2, the token rule). The suite also takes, marked gpu elsewhere: parity with the numpy GPT-2, exact enumeration of
whole rounds on the device, the self-check's chi-square test (the block rule's rounds), GPT-2's massive activations in
float16, and the engine's kernels against their formulas. The engine measures no choice there (an interpreter's
timings choose arbitrarily): its kernels run wherever they fit (conftest.py, engine.engine_kernels()). Beside
them, unmarked (they run on tinygrad's NULL device whatever DEV is), the probes showing that the GPU checks of
tools/render_kernels.py and tools/kernel_bounds.py can fail."""
import json, os, pathlib, subprocess, sys
import numpy as np
import pytest
import spec
from conftest import TINY, load, np_gpt2_logits, random_weights, tolerance

ROOT = pathlib.Path(__file__).resolve().parent.parent

@pytest.fixture(scope="module")
def tiny(tiny_dir): return {name: load(tiny_dir / name) for name in ("target", "draft")}

@pytest.mark.gpu
def test_decode_and_rollback_on_few_tokens(tiny):
  """Decoded logits against the float64 numpy GPT-2's over the whole sequence (an emulated wide pass takes longer than
  the decodes), then 2 positions rolled back and other tokens fed."""
  target, seq = tiny["target"], [int(t) for t in np.random.default_rng(1).integers(0, 64, 8)]
  reference = lambda tokens: np_gpt2_logits(random_weights(TINY, seed=1), TINY["n_head"], tokens)
  full = reference(seq)
  target.prefill(seq[:4])
  steps = [target([t], i).numpy()[0] for i, t in enumerate(seq[4:], start=4)]
  np.testing.assert_allclose(np.stack(steps), full[4:], atol=tolerance() * np.abs(full).max())
  other = [int(t) for t in np.random.default_rng(2).integers(0, 64, 2)]          # roll back 2 and feed others
  got = [target([t], i).numpy()[0] for i, t in enumerate(other, start=6)]
  expected = reference(seq[:6] + other)[-2:]
  np.testing.assert_allclose(np.stack(got), expected, atol=tolerance() * np.abs(expected).max())

@pytest.mark.gpu
@pytest.mark.parametrize("K,verification", [(2, "token")])   # the block rule: the chi-square's rounds; all: test_spec
def test_greedy_identity_on_few_tokens(tiny, K, verification):
  alone = spec.autoregressive_generate(tiny["target"], [5, 9, 2], 8, eos=None)[0]
  got, stats = spec.speculative_generate(tiny["target"], tiny["draft"], [5, 9, 2], K, 8, eos=None, verification=verification)
  assert got == alone and stats.rounds < 8, stats

PROBE = """
import json, render_kernels as rk, models, spec
from tinygrad import Tensor, dtypes
from tinygrad.codegen import to_program
from tinygrad.helpers import Target
from tinygrad.renderer.cstyle import MetalRenderer
rk.render_only()
model, metal = models.load("gpt2", "float32", dummy=True, plain=True), MetalRenderer(Target("NULL", "METAL", ""))
hidden = Tensor.ones(1, model.cfg.n_embd).contiguous().realize()
def problems(fn):
  rk.asts.clear(); fn().realize()
  return [p for prg in (to_program(ast, metal) for ast in rk.asts.values()) for p in rk.launch_problems(prg)]
rk.record()
print(json.dumps([problems(lambda: spec.best(model.forward(Tensor([[1]], dtype=dtypes.int32), 0))),
                  problems(lambda: spec.best(model.lm_head(hidden)))]))
"""

def test_render_kernels_finds_a_kernel_that_leaves_a_gpu_idle():
  """tools/render_kernels.py's work check can fail: greedy's argmax over gpt2's lm_head left lazy takes the matrix
  product into its reduction (a few dozen threads, what an H100 ran on 2026-11-26); over the forward's logits it does not.
  On tinygrad's NULL device, rendered for Metal (no compiler needed, NVIDIA's neither)."""
  env = {**os.environ, "DEV": "NULL", "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tools")])}
  out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-2000:]
  forward, lazy = json.loads(out.stdout.splitlines()[-1])
  assert forward == [] and any("operations a thread" in p for p in lazy), (forward, lazy)

ARGUMENTS = """
import json
from tinygrad import Tensor, Device, dtypes
from tinygrad.codegen import to_program
import kernel_bounds as kb, spec
def problems():
  kb.asts.clear()
  spec.verify(Tensor.randn(1, 64), None, Tensor([[3]], dtype=dtypes.int32), Tensor([1, 2], dtype=dtypes.uint32), 0,
              (1.0, 0, 1.0), greedy=False, filters=(), rule="block", one_hot=True).realize()
  return [p for ast in kb.asts.values() for p in kb.argument_problems(to_program(ast, Device[Device.DEFAULT].renderer), ast)]
kb.record()
rule = problems()
ones = lambda x: Tensor.ones(x.shape[0] + 1)
spec.block_acceptance = lambda p, q, x, rule=spec.block_acceptance: (rule(p, q, x)[0], ones(x), ones(x) * 0)
print(json.dumps([rule, problems()]))
"""

def test_kernel_bounds_finds_a_kernel_that_drops_a_buffer_its_call_passes():
  """tools/kernel_bounds.py's argument check (render_kernels.py's too) can fail: the block rule with h = Tensor.ones
  (an earlier form of test_spec's negative control) makes the kernel that draws n, in a one-token verify, drop the
  buffer it was to read: CUDA rejected its graph node ('invalid argument') on an H100; the rule itself keeps every
  buffer. On the NULL device."""
  env = {**os.environ, "DEV": "NULL", "CHECK_OOB": "0", "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tools")])}
  out = subprocess.run([sys.executable, "-c", ARGUMENTS], env=env, capture_output=True, text=True, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-2000:]
  rule, ones = json.loads(out.stdout.splitlines()[-1])
  assert rule == [] and any("passed" in p for p in ones), (rule, ones)

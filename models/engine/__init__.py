"""The engine: what makes the port fast, applied to a loaded model from outside by apply(), and nothing without it.

- lanes.py, matvec.py, attention.py, norm.py: one custom kernel each (the linear layers and lm_head on a CPU and on a
  GPU, attention, the layer norms), with the formula it replaces, a check whether it fits, and a choice measured once
  per machine; a kernel that fails to compile or run loses its measurement, and one line on stderr says which and why.
- replay.py: a JIT graph for devices without one (CPU, OpenCL), used by the engine's steps only.
- store.py: captured steps stored on disk and loaded by later processes.
models.load(..., plain=True) skips apply(): the port alone, on tinygrad's own kernels and executor. docs/engine.md.
"""
from __future__ import annotations
import contextlib, functools, sys, threading, time, weakref
from tinygrad import TinyJit, Device, Context, dtypes
from models.gpt2 import GPT2
from models.engine import attention, lanes, matvec, norm, replay, store
from models.engine.measure import half_pays

STEP_WIDTH = 16   # the widest step pass whose kernels are chosen and searched: K+1 tokens for K up to 15

def apply(model:GPT2, search:int=0) -> GPT2:
  """The one seam: model's linear layers, attention and layer norms computed by the engine's kernels where they measure
  faster, and its JIT-compiled steps compiled through compile() (kernel choices, BEAM search of width search, the
  store, the replay graph). The state (weights, KV cache) and its names do not change."""
  for block in model.h:
    block.attn.c_attn, block.attn.c_proj = matvec.Linear(block.attn.c_attn), matvec.Linear(block.attn.c_proj)
    block.mlp.c_fc, block.mlp.c_proj = matvec.Linear(block.mlp.c_fc), matvec.Linear(block.mlp.c_proj)
    block.ln_1, block.ln_2 = norm.LayerNorm(block.ln_1), norm.LayerNorm(block.ln_2)
    attention.install(block.attn)
  model.ln_f = norm.LayerNorm(model.ln_f)
  model.lm_head = functools.partial(matvec.linear, w=model.wte.weight, dtype=dtypes.float32)
  model.compile = functools.partial(compile, weakref.ref(model), search)
  return model

def compile(model_ref, search:int, fn:functools.partial, key:tuple) -> Step:
  """GPT2.compile for an engine model. A step of a generation (at most STEP_WIDTH tokens, not a prefill's fill pass)
  has its kernels chosen first, for its width and for one token (a draft's step runs T tokens, then one at a time),
  and searched when search > 0; a prefill pass runs once per prompt, on tinygrad's default kernels (whatever the
  tables hold by then: a stored pass is the same whichever process captured it)."""
  model, (name, T) = model_ref(), key[:2]
  step = name != GPT2.fill.__name__ and T <= STEP_WIDTH
  if step: choose_kernels(model, {1, T})
  what = f"{name} of {T} token{'s' * (T > 1)} ({model.cfg.n_layer} layers x {model.cfg.n_embd})"
  return Step(fn, search if step else 0, what, model, store.step_file(model, fn.func, key, search), formulas=not step)

def choose_kernels(model:GPT2, widths) -> None:
  """For passes of these widths, measure once per machine which kernels compute each linear layer (each role over all
  layers, and the lm_head), attention and the layer norms faster: the engine's or tinygrad's."""
  roles = list(zip(*((b.attn.c_attn, b.attn.c_proj, b.mlp.c_fc, b.mlp.c_proj) for b in model.h)))
  groups = [([l.weight for l in role], [l.bias for l in role]) for role in roles] + [([model.wte.weight], None)]
  what = f"choosing the kernels of {model.cfg.n_layer} layers x {model.cfg.n_embd} for passes of {sorted(widths)} " \
         "tokens"
  with notice(what), replay.graph(Device.DEFAULT):
    for T in sorted(widths):
      for weights, biases in groups:
        lanes.choose(T, weights, model.dtype)
        matvec.choose(T, weights, biases, model.dtype)   # against what lanes chose
      attention.choose(T, [b.attn for b in model.h], model.dtype)
      attention.choose_chunks(T, [b.attn for b in model.h], model.dtype)   # against what attention.choose() chose
      norms = [ln for b in model.h for ln in (b.ln_1, b.ln_2)] + [model.ln_f]
      norm.choose(T, norms, model.dtype)
      norm.choose_group(T, norms, model.dtype)   # against what norm.choose() chose

class Step:
  """A TinyJit of the engine: captured with kernels from tinygrad's BEAM search of width `search` (0: its heuristics),
  or with the formulas only, replayed through replay.py's graph, stored at `path` once captured, and loaded from there
  by a later process."""
  def __init__(self, fn, search:int, what:str, model:GPT2, path, formulas:bool=False):
    self.search, self.what, self.model, self.path, self.formulas = search, what, weakref.ref(model), path, formulas
    self.fn = (path and store.load(model, path)) or TinyJit(fn)
    self.calls = 0
  captured = property(lambda self: self.fn.captured)
  # calls as tinygrad's TinyJit counts them: the first call runs the function plainly and captures it (or links a
  # loaded step), so it counts as two
  cnt = property(lambda self: self.calls + (self.calls > 0))
  def __call__(self, *args):
    self.calls += 1
    with replay.graph(Device.DEFAULT):
      if self.fn.captured is not None: return self.fn(*args)
      searched = " with searched kernels" if self.search else ""
      with Context(BEAM=self.search), notice(f"compiling {self.what}{searched}"), \
           (formulas() if self.formulas else contextlib.nullcontext()):
        for _ in range(2): ret = self.fn(*args)   # plainly, then captured: both now, on the same inputs
    if self.path is not None: store.save(self.fn, self.model(), self.path)
    return ret

@contextlib.contextmanager
def formulas():
  """tinygrad's kernels for every layer meanwhile, whatever the measured tables hold."""
  tables = [(lanes, "use_lanes"), (matvec, "use_matvec"), (attention, "use_kernels"), (attention, "use_chunks"),
            (norm, "use_kernel"), (norm, "use_group")]
  saved = [getattr(module, name) for module, name in tables]
  for module, name in tables: setattr(module, name, {})
  try: yield
  finally:
    for (module, name), table in zip(tables, saved): setattr(module, name, table)

@contextlib.contextmanager
def notice(what:str, after:float=10.0):
  """Say on stderr what runs once it has taken `after` seconds, and when it ends: a first run compiles, and measures
  and searches kernels for minutes (gpt2-xl); later runs find them in tinygrad's disk cache and the store."""
  say = lambda text: print(f"spec: {what}{text}", file=sys.stderr, flush=True)
  t0, timer = time.perf_counter(), threading.Timer(after, say, [" (the work of a first run: it is cached) ..."])
  timer.start()
  try: yield
  finally:
    timer.cancel()
    if time.perf_counter() - t0 > after: say(f": done in {time.perf_counter() - t0:.0f} s")

__all__ = ["apply", "half_pays", "Step", "STEP_WIDTH"]

"""The engine: what makes the port fast, applied to a loaded model from outside by apply(), and nothing without it.

- lanes.py, matvec.py, attention.py, norm.py: the custom kernels (the linear layers and lm_head on a CPU and on a GPU,
  attention, the layer norms), each with the formula it replaces and a check whether it fits; linear.py, attention.py
  and norm.py choose among them by measurement once per machine (choice.py): a kernel that fails to compile or run,
  or computes other values than tinygrad's, loses, and one line on stderr says which and why.
- Block: the port's block computed through them, each linear layer fused with the layer norm before it and GELU or
  the residual add after it where the matvec kernel runs.
- replay.py: a JIT graph for devices without one (CPU, OpenCL), used by the engine's steps only; native.py: a step in
  one native call on tinygrad's CPU backend.
- store.py: captured steps stored on disk and loaded by later processes.
- pages.py: the model's weights in huge pages on tinygrad's CPU backend.
- device.py: what the device offers the kernels; internals.py: every use of tinygrad beyond its public names.
models.load(..., plain=True) skips apply(): the port alone, on tinygrad's own kernels and executor. docs/engine.md.
"""
from __future__ import annotations
import contextlib, functools, sys, threading, time, weakref
from tinygrad import Tensor, TinyJit, Device, Context, dtypes
from models.gpt2 import GPT2
from models.engine import attention, choice, internals, linear, native, norm, pages, replay, store
from models.engine.choice import CHOSEN, TINYGRAD, Way

STEP_WIDTH = 16   # the widest step pass whose kernels are chosen and searched: K+1 tokens for K up to 15
# a prefill's pass runs the ways chosen for this width, whatever its own: timing tinygrad's matmul at 64 rows cost a
# first run twice as much (docs/engine.md)
PREFILL_CHOICE = 32
SHORTCUTS = 4     # a step's inputs it keeps a shortcut for (replay.Shortcut)

def apply(model:GPT2, search:int=0) -> GPT2:
  """The one seam: model's blocks, final layer norm and lm_head computed by the engine's kernels where they measure
  faster, its JIT-compiled steps compiled through compile() (kernel choices, BEAM search of width search, the store,
  the replay graph), and a step's output read by read(). The state (weights, KV cache) keeps its names and values, the
  weights in huge pages where the device's buffers are the process's memory (pages.py)."""
  pages.move(model)
  model.h = [Block(block) for block in model.h]
  model.ln_f = norm.LayerNorm(model.ln_f)
  model.lm_head = functools.partial(linear.head, w=model.wte.weight)
  model.compile = functools.partial(compile, weakref.ref(model), search)
  model.read = read
  return model

def read(t:Tensor) -> list:
  """GPT2.read for an engine model: t.tolist(), a realized buffer copied out at once (internals.read()) where tinygrad
  schedules and runs a copy: 0.5 ms of a round on a CPU (docs/engine.md)."""
  if t.dtype.fmt in (None, "e") or (out := internals.read(t.uop)) is None: return t.tolist()
  return out.cast(t.dtype.fmt, t.shape).tolist()

class Block:
  """The port's Block (the same modules, the same state names) computed by the engine: each linear layer by
  linear.apply() with the layer norm before it and GELU or the residual add after it (one matvec kernel each where it
  runs), attention, the cache's write with it, by attention.apply()."""
  def __init__(self, plain): self.ln_1, self.attn, self.ln_2, self.mlp = plain.ln_1, plain.attn, plain.ln_2, plain.mlp

  def __call__(self, x:Tensor, start_pos) -> Tensor:
    attn, mlp, f32 = self.attn, self.mlp, dtypes.float32
    # the attention's values stay float32 between kernels (half: the weights, the KV cache, the residual stream, the
    # MLP's hidden rows): a CPU converts half a value at a time where both a product's operands are half, but the
    # vectors kernel a vector at a time, and the MLP's 4x wider rows read at half the bytes (docs/engine.md)
    qkv = linear.apply(x, attn.c_attn.weight, attn.c_attn.bias, f32, ln=self.ln_1)
    x = linear.apply(attention.apply(attn, qkv, start_pos), attn.c_proj.weight, attn.c_proj.bias, x.dtype, residual=x)
    h = linear.apply(x, mlp.c_fc.weight, mlp.c_fc.bias, x.dtype, ln=self.ln_2, gelu=True)
    # realized, a block at a time (the port's bound on what tinygrad fuses): in a capture every block after the first
    # has the same graph but for its buffers, and tinygrad's schedule cache schedules it once (a step's capture in half)
    return linear.apply(h, mlp.c_proj.weight, mlp.c_proj.bias, x.dtype, residual=x).realize()

def compile(model_ref, search:int, fn:functools.partial, key:tuple, passes:tuple[int, ...]) -> Step:
  """GPT2.compile for an engine model. A step of a generation (at most STEP_WIDTH tokens, not a prefill's fill pass)
  has its kernels chosen first, for the widths of its passes (a draft's step runs T tokens, then one at a time; the
  target's verify step T tokens only), and searched when search > 0; a prefill's pass of any width (the powers of two
  up to PREFILL_WIDTH) runs the kernels chosen for passes of PREFILL_CHOICE, one measurement for all, nothing
  searched; a wider pass (a call of more tokens) runs tinygrad's kernels."""
  model, (name, T) = model_ref(), key[:2]
  prefill = name == GPT2.fill.__name__
  step = not prefill and T <= STEP_WIDTH
  if step: choices, rule = choose_kernels(model, set(passes)), None
  elif prefill: choices, rule = choose_kernels(model, {PREFILL_CHOICE}, head=False), lambda: widths_as(PREFILL_CHOICE)
  else: choices, rule = (), tinygrad_kernels
  what = f"{name} of {T} token{'s' * (T > 1)} ({model.cfg.n_layer} layers x {model.cfg.n_embd})"
  stored = store.step_name(model, fn.func, key, search, choices)
  return Step(fn, search if step else 0, what, model, stored, rule, timed=step)

def choose_kernels(model:GPT2, widths, head:bool=True) -> tuple:
  """For passes of these widths, measure once per machine which kernels compute each linear layer (each role over its
  layers, and the lm_head), attention and the layer norms fastest: the engine's or tinygrad's. Returns the choices."""
  blocks = model.h
  # each linear role in the form a block runs it (engine.Block): its weights, biases and what surrounds it
  f32, stream = dtypes.float32, model.dtype   # the residual stream's dtype (and the weights')
  roles = [([b.attn.c_attn for b in blocks], dict(x_dtype=stream, dtype=f32, lns=[b.ln_1 for b in blocks])),
           ([b.attn.c_proj for b in blocks], dict(x_dtype=f32, dtype=stream, residual=True)),
           ([b.mlp.c_fc for b in blocks], dict(x_dtype=stream, dtype=stream, lns=[b.ln_2 for b in blocks], gelu=True)),
           ([b.mlp.c_proj for b in blocks], dict(x_dtype=stream, dtype=stream, residual=True))]
  groups = [([l.weight for l in role], [l.bias for l in role], form) for role, form in roles]
  if head: groups.append(([model.wte.weight], None, dict(x_dtype=stream, dtype=f32)))   # the lm_head (linear.head())
  what = f"choosing the kernels of {model.cfg.n_layer} layers x {model.cfg.n_embd} for passes of {sorted(widths)} " \
         "tokens"
  # the norms first: a linear layer's choice times the layer norm before it as a block runs it
  norms = [ln for b in blocks for ln in (b.ln_1, b.ln_2)] + [model.ln_f]
  layers = [c for T in sorted(widths) for c in
            [functools.partial(norm.choose, T, norms, model.dtype),
             *(functools.partial(linear.choose, T, w, b, **form) for w, b, form in groups),
             functools.partial(attention.choose, T, [b.attn for b in blocks], f32)]]
  choices = []
  with notice(what, lambda: (len(choices), len(layers))), graph():
    for choose in layers: choices.append(choose())
  return tuple(choices)

class Step:
  """A TinyJit of the engine: captured with kernels from tinygrad's BEAM search of width `search` (0: its heuristics),
  with the choices a rule fixes meanwhile where given (a prefill's pass: widths_as(); a wider pass: tinygrad's), run by
  native.py's runner where it fits and measures faster (timed: a prefill's pass is not, it runs on the runner where it
  fits: its kernels take milliseconds, which the runner shares among the cores where replay.py runs a kernel's splits
  on one), else replayed through replay.py's graph, stored under its name (store.step_name()) once captured, and loaded
  from there by a later process."""
  def __init__(self, fn, search:int, what:str, model:GPT2, name:str, rule=None, timed:bool=True):
    self.search, self.what, self.model, self.name, self.rule = search, what, weakref.ref(model), name, rule
    self.timed = timed
    self.path = store.step_path(name)
    self.fn = (self.path and store.load(model, self.path)) or TinyJit(fn)
    self.calls, self.shortcuts = 0, []
  captured = property(lambda self: self.fn.captured)
  def __call__(self, *args):
    self.calls += 1
    for shortcut in self.shortcuts:
      if (ret := shortcut(args)) is not None: return ret
    with graph():
      if self.fn.captured is not None: ret = self.fn(*args)
      else:
        searched = " with searched kernels" if self.search else ""
        with Context(BEAM=self.search), notice(f"compiling {self.what}{searched}"), \
             (self.rule() if self.rule else contextlib.nullcontext()):
          internals.capture_next(self.fn)
          ret = self.fn(*args)
        if self.path is not None: store.save(self.fn, self.model(), self.path)
      # a step's call again on the same inputs rewrites what it wrote: its runners are timed on them; a prefill's pass
      # runs once per prompt: not timed
      if self.calls == 1 and self.timed: native.choose(self.fn.captured, lambda: self.fn(*args), self.name)
      # a later call on these inputs skips TinyJit's call; a few kept (a verify step's block: either draft width)
      if shortcut := replay.shortcut(self.fn.captured, args): self.shortcuts = [shortcut, *self.shortcuts][:SHORTCUTS]
    return ret

def half_pays() -> bool:
  """Whether this device multiplies a row by half weights clearly faster (1.25x) than by float32 ones, each by the
  engine's fastest way run as a step runs (linear.half_timer(), graph()): a GPU reads half the bytes, a CPU's lanes
  kernel converts four values at a time (x86's F16C); where half is emulated (pocl) it does not pay. Each dtype timed
  1 + choice.ROUNDS times, in turn, its fastest kept: a burst of other work during one timing does not decide. Once
  per machine (choice.path())."""
  if not internals.has_half(): return False
  disk = choice.machine_key(choice.sources(linear.__name__))
  if (pays := choice.cached("spec_half", disk)) is None:
    with graph():
      timers = {dt: linear.half_timer(dt) for dt in (dtypes.half, dtypes.float32)}
      seconds = {dt: [] for dt in timers}
      for _ in range(1 + choice.ROUNDS):
        for dt, timer in timers.items(): seconds[dt].append(timer())
    pays = choice.first_stored("spec_half", disk, min(seconds[dtypes.half]) * 1.25 < min(seconds[dtypes.float32]))
  return pays

def graph():
  """The engine's graph for tinygrad's default device meanwhile, where tinygrad has none: native.py's where it fits,
  else replay.py's."""
  return replay.graph(Device.DEFAULT, native.Native if native.fits(Device.DEFAULT) else replay.Replay)

def widths_as(T:int):
  """The ways measured for passes of T tokens meanwhile, for passes of any width (tinygrad's where none was)."""
  return CHOSEN.fixed(lambda kind, key: CHOSEN.measured[kind].get((T, *key[1:]), TINYGRAD))

def tinygrad_kernels():
  """tinygrad's kernels for every layer meanwhile, whatever was measured."""
  return CHOSEN.fixed(lambda kind, key: TINYGRAD)

def engine_kernels():
  """The engine's kernels wherever they fit meanwhile, nothing measured (for tests and renderers): for passes of
  several rows the work-group kernels where the device has them (the matvec kernel, attention in chunks, the norm's
  stats kernel), for one row the others (the lanes kernel, attention's fused kernel where C runs, else its CPU design,
  the norm's row kernel), so that one generation runs both."""
  def pick(ways:list[Way], T:int) -> Way:
    wide = [w for w in ways if w.kernel in ("matvec", "chunks", "stats")]   # the work-group ways
    other = [w for w in ways if w != TINYGRAD and w not in wide]
    if T == 1: other.sort(key=lambda w: w.kernel != "fused")   # one row: attention's fused kernel, where C runs
    first = (wide or other) if T > 1 else (other or wide)
    return first[0] if first else TINYGRAD
  ways = {"linear": lambda k: linear.ways(*k[:3], k[4]), "attention": lambda k: attention.ways(k[3], k[4:6]),
          "norm": lambda k: norm.ways(k[1])}
  return CHOSEN.fixed(lambda kind, key: pick(ways[kind](key), key[0]))

@contextlib.contextmanager
def notice(what:str, progress=None, every:float=10.0):
  """Say on stderr what runs once it has taken `every` seconds, then every `every` seconds how far it is (progress():
  done, total) and about how long it has left at its pace so far, and when it ends: a first run on a machine compiles,
  and measures and searches kernels for minutes (gpt2-xl); later runs find them in tinygrad's disk cache and the
  store."""
  say = lambda text: print(f"spec: {what}{text}", file=sys.stderr, flush=True)
  t0, stop = time.perf_counter(), threading.Event()
  def report():
    first = True
    while not stop.wait(every):
      done, total = progress() if progress else (0, 0)
      elapsed = time.perf_counter() - t0
      left = f", about {elapsed * (total - done) / done:.0f} s left" if done else ""
      say((" (a first run on this machine: kept for later runs)" if first else "") +
          (f": {done} of {total} done{left}" if total else "") + " ...")
      first = False
  reporter = threading.Thread(target=report, daemon=True)
  reporter.start()
  try: yield
  finally:
    stop.set()
    if time.perf_counter() - t0 > every: say(f": done in {time.perf_counter() - t0:.0f} s")

__all__ = ["apply", "Block", "engine_kernels", "half_pays", "PREFILL_CHOICE", "Step", "STEP_WIDTH", "tinygrad_kernels",
           "widths_as"]

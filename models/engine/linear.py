"""The linear layers and the lm_head: which kernel multiplies a step's rows by a weight (tinygrad's matmul, the lanes
kernel in each of its layouts, the matvec kernel with each of its options), measured once per machine (choose()); and a
layer applied with what surrounds it in a block (apply()): the layer norm before it, GELU or the residual add after it,
all in the matvec kernel where it runs, in tinygrad's operations elsewhere.
"""
from __future__ import annotations
import functools, math
from typing import NamedTuple
from tinygrad import Device, Tensor, dtypes
from models.engine import choice, lanes, matvec, norm
from models.engine.choice import CHOSEN, PRUNE, TINYGRAD, Way, captured, enough, fastest

HALF_SHAPE, HALF_LAYERS = (4096, 1024), 8   # the weights half_timer() times a row by
# past this many rows (a prefill's passes) the lanes kernel is a candidate in its row layout only: the others hold 2-4x
# the partial sums of a chunk of rows, and measured 1.5-7.6x slower at 64 rows (docs/engine.md)
PREFILL_ROWS = 16

# the widths (T, x dtype) where the matvec kernel lost clearly to a role (its first option over PRUNE x the fastest):
# the process times it on no other role of that width (a CPU's OpenCL, where it loses every time, compiles it once)
matvec_outpaced: set[tuple] = set()

def apply(x:Tensor, w:Tensor, b:Tensor|None=None, dtype=None, ln=None, gelu:bool=False, residual:Tensor|None=None,
          way:Way|None=None) -> Tensor:
  """residual + GELU(ln(x) @ w.T + b) in dtype (default x's), each part where given; ln: a layer norm (weight, bias,
  eps). way: tinygrad's (TINYGRAD), the lanes kernel in a layout (Way("lanes", layout)), the matvec kernel with its
  options (Way("matvec", (group, outputs))); None: as choose() measured for these shapes and this form (else
  tinygrad's). A layer norm outside the kernel runs as norm.choose() measured (else its formula), for a given way too:
  a choice compares what a block runs."""
  if way is None: way = chosen(x, w, b, dtype, ln, gelu, residual)
  if way.kernel == "matvec": return matvec.linear(x, w, b, dtype, way.option, ln, gelu, residual)
  if way.kernel == "lanes":
    dtype = dtype or x.dtype
    # the lanes kernel reads float32 rows (lanes.linear()): its layer norm writes them
    if ln is not None: x = norm.layer_norm(x, ln.weight, ln.bias, ln.eps, dtype=dtypes.float32)
    return lanes.linear(x, w, dtype, way.option, b, gelu, residual)
  else:
    if ln is not None: x = norm.layer_norm(x, ln.weight, ln.bias, ln.eps)
    y = lanes.formula(x, w, dtype)
    if b is not None: y = y + b
    if gelu: y = y.gelu()
  return y if residual is None else residual + y

class Form(NamedTuple):
  """What a block runs around a layer, a kernel of its own for each (chosen apart): a layer norm before it, GELU, a
  residual add, the output dtype."""
  ln: bool
  gelu: bool
  residual: bool
  dtype: object
  def __str__(self) -> str:
    parts = [name for name, on in zip(("its layer norm", "GELU", "the residual add"), self[:3]) if on]
    return f" with {' and '.join(parts)}" if parts else ""

def chosen(x:Tensor, w:Tensor, b:Tensor|None=None, dtype=None, ln=None, gelu:bool=False,
           residual:Tensor|None=None) -> Way:
  """The way choose() measured for apply(x, w, b, dtype, ln, gelu, residual), else tinygrad's."""
  *B, C = x.shape
  around = Form(ln is not None, gelu, residual is not None, dtype or x.dtype)
  return CHOSEN.way("linear", (math.prod(B), w.shape[0], C, x.dtype, w.dtype, b is not None, around))

def ways(T:int, N:int, C:int, dtype=dtypes.float32) -> list[Way]:
  """The ways that fit T rows times (N, C) weights in dtype on this device, tinygrad's first. The lanes kernel's "four"
  layout only where "lanes" does not fit: "lanes" at half the outputs, it never measured ahead of the others where both
  fit, and a first run compiles one kernel less a layer. Where the vectors layouts fit, they alone of the layouts: a
  choice timed one layer at a time picked others for some roles, and every pass ran faster with "vectors" in each of
  them; "vectors_wide" for half weights only: float32 ones convert nothing, and passes ran up to 1.3x slower where a
  choice picked it (docs/engine.md)."""
  fit = [layout for layout in lanes.LAYOUTS if lanes.fits(N, C, layout, Device.DEFAULT) and
         (T <= PREFILL_ROWS or layout == "row") and (layout != "vectors_wide" or dtype == dtypes.half)]
  if vectors := [layout for layout in fit if layout in lanes.VECTORS]: fit = vectors
  layouts = [Way("lanes", layout) for layout in fit if layout != "four" or "lanes" not in fit]
  return [TINYGRAD] + layouts + ([Way("matvec", o) for o in matvec.options(N, C)] if matvec.fits(N, C) else [])

def choose(T:int, weights:list[Tensor], biases:list[Tensor]|None, x_dtype, dtype=None, lns:list|None=None,
           gelu:bool=False, residual:bool=False) -> Way:
  """The way T rows times these same-shape weights (and biases) run fastest in the form a block runs them (after the
  layer norms lns, one a weight; GELU; a residual add; output dtype), of those that compute what tinygrad's formula of
  that form computes: each captured and timed over enough of the weights in turn, the caches flushed before each call
  (as in a pass, they stream from memory), its outputs compared on massive rows and on ordinary ones
  (choice.activations(), before a layer norm; else rows of order 1), once per machine. The matvec kernel's later
  options are timed only while its first is close, and in a process where it lost clearly to another role at this
  width, not at all."""
  (N, C), bias = weights[0].shape, biases is not None
  key = (T, N, C, x_dtype, weights[0].dtype, bias, Form(bool(lns), gelu, residual, dtype or x_dtype))
  if CHOSEN.needs("linear", key):
    # a layer norm's input is the residual stream; the other layers' (attention's, GELU's outputs) are of order 1
    x, *other = choice.activations(T, C, dtype=x_dtype) if lns else [choice.random(T, C, dtype=x_dtype)]
    r = choice.random(T, N, dtype=dtype or x_dtype, seed=1) if residual else None   # the stream, as in a block
    weights = enough(weights)
    biases = biases[:len(weights)] if bias else [None] * len(weights)
    lns = lns[:len(weights)] if lns else [None] * len(weights)
    evict = choice.evictor()
    layers = list(zip(weights, biases, lns))
    outputs = lambda way, layers=layers: lambda x: [apply(x, w, b, dtype, ln, gelu, r, way) for w, b, ln in layers]
    def run(way): return captured(outputs(way), [(x,)] + [(o,) for o in other], before=evict)
    candidates = [w for w in ways(T, N, C, weights[0].dtype)
                  if not (w.kernel == "matvec" and (T, x_dtype) in matvec_outpaced)]
    costs = {}
    # the tolerance of the least precise of the rows, the weights and the output
    coarsest = min((x_dtype, weights[0].dtype, dtype or x_dtype), key=lambda d: d.itemsize)
    # what runs before (the layer norm, as chosen) is part of the cost
    ln_way = CHOSEN.way("norm", (T, C, x_dtype)) if lns[0] is not None else None
    what = (key, ln_way, choice.sources(__name__))
    first = next((w for w in candidates if w.kernel == "matvec"), None)
    # every candidate's kernels compiled at once (one layer's: the others run the same), but the matvec kernel's later
    # options, which may not run
    if choice.cached("spec_linear", choice.machine_key(*what)) is None:
      choice.compile_together([functools.partial(outputs(w, layers[:1]), x) for w in candidates
                               if w.kernel != "matvec" or w is first])
    CHOSEN.measured["linear"][key] = fastest("spec_linear", what,
                                             {w: functools.partial(run, w) for w in candidates},
                                             f"linear kernel ({T} rows x ({N}, {C}){key[-1]})", coarsest,
                                             family=lambda w: w.kernel if w.kernel == "matvec" else None, costs=costs,
                                             length=C)
    if costs and first is not None and costs.get(first, math.inf) > PRUNE * min(costs.values()):
      matvec_outpaced.add((T, x_dtype))
  return CHOSEN.way("linear", key)

class Linear:
  """An nn.Linear (the same weight and bias, the same state names) computed by apply()."""
  def __init__(self, plain): self.weight, self.bias = plain.weight, plain.bias
  def __call__(self, x:Tensor) -> Tensor: return apply(x, self.weight, self.bias)

def head(x:Tensor, w:Tensor) -> Tensor:
  """The lm_head: x @ w.T, float32 logits."""
  return apply(x, w, dtype=dtypes.float32)

def half_timer(dtype):
  """A function that times a row times HALF_LAYERS weights of HALF_SHAPE in dtype by choose()'s way, in turn, caches
  flushed, in seconds: its first call the best of 3, each later call one more."""
  (N, C), evict = HALF_SHAPE, choice.evictor()
  weights = [choice.random(N, C, dtype=dtype, seed=i) for i in range(HALF_LAYERS)]
  way = choose(1, weights, None, dtype)
  first, _, again = captured(lambda x: [apply(x, w, way=way) for w in weights], [(choice.random(1, C, dtype=dtype),)],
                             before=evict)
  firsts = [first]
  return lambda: firsts.pop() if firsts else again()

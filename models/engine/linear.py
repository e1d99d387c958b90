"""The linear layers and the lm_head: which kernel multiplies a step's rows by a weight (tinygrad's matmul, the lanes
kernel, the matvec kernel with each of its options), measured once per machine (choose()); and a layer applied with
what surrounds it in a block (apply()): the layer norm before it, GELU or the residual add after it, all in the matvec
kernel where it runs, in tinygrad's operations elsewhere.
"""
from __future__ import annotations
import functools, inspect, math
from tinygrad import Tensor, dtypes
from models.engine import lanes, matvec, norm
from models.engine.measure import PRUNE, captured, enough, fastest, random

# (T, N, C, x dtype, weight dtype, bias) -> None (tinygrad's matmul), "lanes", or the matvec kernel's (group, outputs):
# what choose() measured on this device
use: dict[tuple, str|tuple[int, int]|None] = {}
# (T, x dtype): the matvec kernel lost clearly (its first option over PRUNE x the fastest) to a role of this width:
# the process times it on no other (a CPU's OpenCL, where it loses every time, compiles it once a width)
lost: set[tuple] = set()
ASK = object()   # apply()'s way: as use holds

def apply(x:Tensor, w:Tensor, b:Tensor|None=None, dtype=None, ln=None, gelu:bool=False, residual:Tensor|None=None,
          way=ASK) -> Tensor:
  """residual + GELU(ln(x) @ w.T + b) in dtype (default x's), each part where given; ln: a layer norm (weight, bias,
  eps). way: as choose() measured for these shapes (else tinygrad's), or None, "lanes", (group, outputs)."""
  if way is ASK: way = chosen(x, w, b)
  if isinstance(way, tuple): return matvec.linear(x, w, b, dtype, way, ln, gelu, residual)
  if ln is not None: x = norm.layer_norm(x, ln.weight, ln.bias, ln.eps)
  y = lanes.linear(x, w, dtype) if way == "lanes" else lanes.formula(x, w, dtype)
  if b is not None: y = y + b
  if gelu: y = y.gelu()
  return y if residual is None else residual + y

def chosen(x:Tensor, w:Tensor, b:Tensor|None=None) -> str|tuple[int, int]|None:
  """The way choose() measured for x @ w.T (+ b), else tinygrad's (None)."""
  *B, C = x.shape
  return use.get((math.prod(B), w.shape[0], C, x.dtype, w.dtype, b is not None))

def ways(T:int, N:int, C:int) -> list:
  """The ways that fit T rows times (N, C) on this device, tinygrad's first."""
  return [None] + (["lanes"] if lanes.fits(N, C) else []) + (matvec.options(N, C) if matvec.fits(N, C) else [])

def choose(T:int, weights:list[Tensor], biases:list[Tensor]|None, x_dtype) -> str|tuple[int, int]|None:
  """The way T rows times these same-shape weights (and biases) run fastest, of those that compute what tinygrad's
  matmul computes: each captured and timed over enough of the weights in turn (as in a pass, they stream from memory)
  on random rows, once per machine. The matvec kernel's later options are timed only while its first is close, and in a
  process where it lost clearly to another role at this width, not at all."""
  (N, C), bias = weights[0].shape, biases is not None
  key = (T, N, C, x_dtype, weights[0].dtype, bias)
  if key not in use:
    weights = enough(weights)
    biases = biases[:len(weights)] if bias else [None] * len(weights)
    x = random(T, C, dtype=x_dtype)
    def run(way): return captured(lambda x: [apply(x, w, b, way=way).realize() for w, b in zip(weights, biases)], x)
    code = inspect.getsource(matvec.matvec_kernel), inspect.getsource(lanes.lanes_kernel), inspect.getsource(apply)
    candidates, costs = [w for w in ways(T, N, C) if not (isinstance(w, tuple) and (T, x_dtype) in lost)], {}
    use[key] = fastest("spec_linear", (key, *code), {w: functools.partial(run, w) for w in candidates},
                       f"linear kernel ({T} rows x ({N}, {C}))", x_dtype,
                       family=lambda w: "matvec" if isinstance(w, tuple) else None, costs=costs)
    first = next((w for w in candidates if isinstance(w, tuple)), None)
    if costs and first is not None and costs.get(first, math.inf) > PRUNE * min(costs.values()): lost.add((T, x_dtype))
  return use[key]

class Linear:
  """An nn.Linear (the same weight and bias, the same state names) computed by apply()."""
  def __init__(self, plain): self.weight, self.bias = plain.weight, plain.bias
  def __call__(self, x:Tensor) -> Tensor: return apply(x, self.weight, self.bias)

def head(x:Tensor, w:Tensor) -> Tensor:
  """The lm_head: x @ w.T, float32 logits."""
  return apply(x, w, dtype=dtypes.float32)


"""The matvec kernel: a linear layer over a step's few rows as a GPU reads memory fastest.

Replaces x @ w.T + b (formula()) where the device has work-groups (GPUs). A GPU reaches its memory's speed with many
threads in flight, each loading wide vectors: tinygrad's own kernels for one row give gpt2's layers a few hundred
threads looping over the whole reduction (docs/backends.md). Here each output's reduction is split over a work-group of
GROUP threads (summed in shared memory), each thread loads 4 consecutive weights at a time (16 bytes in float32, 8 in
float16: tinygrad loads at most 4 halves at once unless ALLOW_HALF8, which measured no faster on an H100) and keeps
every one of the T <= 16 rows and OUTPUTS outputs in registers, and the bias is added before the one store. Which
GROUP and OUTPUTS, and whether it beats what lanes.py left (tinygrad's matmul or the lanes kernel), is measured per
shape, width and dtype on the device (choose()).
"""
from __future__ import annotations
import functools, inspect, math
from tinygrad import Tensor, UOp, dtypes
from tinygrad.codegen.opt import Opt, OptOps
from tinygrad.uop.ops import AxisType, KernelInfo, Ops
from models.engine import lanes
from models.engine.measure import captured_seconds, fastest, group_sizes, work_groups

GROUPS, OUTPUTS, VECTOR = (32, 64, 128), (1, 2, 4), 4   # the options measured (near these); the weights a load reads
# (T, N, C, x dtype, weight dtype, bias) -> (group, outputs) where the kernel runs: what choose() measured
use_matvec: dict[tuple, tuple[int, int]|None] = {}

def formula(x:Tensor, w:Tensor, b:Tensor|None=None, dtype=None) -> Tensor:
  """What the kernel replaces: x (..., C) @ w (N, C).T (+ b) in dtype (default x's), accumulated in float32."""
  y = x.matmul(w.T, dtype=dtypes.float32)
  return (y if b is None else y + b.float()).cast(dtype or x.dtype)

def matvec_kernel(out:UOp, x:UOp, w:UOp, *b:UOp, group:int, outputs:int) -> UOp:
  """out[t, n] = sum_k x[t, k] * w[n, k] (+ b[n]), float32 inside; x (T, C), w (N, C), out (T, N) in its dtype. The
  reduction unrolled by a vector load of w, split over group threads, outputs outputs a thread, every row in
  registers."""
  (T, N), C = out.shape, x.shape[1]
  n, t, k = UOp.range(N, 0), UOp.range(T, 1, AxisType.UPCAST), UOp.range(C, 2, AxisType.REDUCE)
  f32 = lambda u: u.cast(dtypes.float32)
  acc = (f32(x[t, k]) * f32(w[n, k])).reduce(k, arg=Ops.ADD)
  y = acc + f32(b[0][n]) if b else acc
  opts = (Opt(OptOps.UNROLL, 0, VECTOR), Opt(OptOps.GROUP, 0, group)) + \
         ((Opt(OptOps.UPCAST, 0, outputs),) if outputs > 1 else ())
  info = KernelInfo(name=f"matvec_{T}_{N}_{C}", opts_to_apply=opts)
  return out[t, n].store(y.cast(out.dtype)).end(t, n).sink(arg=info)

def options(N:int, C:int) -> list[tuple[int, int]]:
  """The (group, outputs) that fit: groups of threads near GROUPS share C's vectors evenly, outputs divide N."""
  groups = group_sizes(C // VECTOR, GROUPS, 256) if C % VECTOR == 0 else []
  return [(g, o) for g in groups for o in OUTPUTS if N % o == 0]
def fits(N:int, C:int) -> bool:
  """A device with work-groups and shared memory (a GPU; not tinygrad's CPU backend) and a shape options() fits."""
  return work_groups() and bool(options(N, C))

def linear(x:Tensor, w:Tensor, b:Tensor|None=None, dtype=None, kernel:tuple[int, int]|None=None) -> Tensor:
  """formula(x, w, b, dtype): by the kernel with options kernel (group, outputs), else as choose() measured, else as
  lanes.linear() computes it."""
  *B, C = x.shape
  T, N = math.prod(B), w.shape[0]
  kernel = kernel or use_matvec.get((T, N, C, x.dtype, w.dtype, b is not None))
  if kernel is None:
    y = lanes.linear(x, w, dtype)
    return y if b is None else y + b
  out = Tensor.empty(T, N, dtype=dtype or x.dtype, device=x.device)
  fxn = functools.partial(matvec_kernel, group=kernel[0], outputs=kernel[1])
  return out.custom_kernel(x.reshape(T, C), w, *([] if b is None else [b]), fxn=fxn)[0].reshape(*B, N)

class Linear:
  """An nn.Linear (the same weight and bias, the same state names) computed by linear()."""
  def __init__(self, plain): self.weight, self.bias = plain.weight, plain.bias
  def __call__(self, x:Tensor) -> Tensor: return linear(x, self.weight, self.bias)

def choose(T:int, weights:list[Tensor], biases:list[Tensor]|None, x_dtype) -> tuple[int, int]|None:
  """The options of the kernel that computes T rows times these same-shape weights (and biases) fastest, if one beats
  what lanes.choose() left for them: all captured and timed over the weights in turn, once per machine."""
  (N, C), bias = weights[0].shape, biases is not None
  key = (T, N, C, x_dtype, weights[0].dtype, bias)
  if key in use_matvec or not fits(N, C): return use_matvec.get(key)
  x = Tensor.ones(T, C, dtype=x_dtype).contiguous().realize()
  candidates = {o: functools.partial(seconds, x, weights, biases, o) for o in [None, *options(N, C)]}
  code = inspect.getsource(matvec_kernel), inspect.getsource(formula), VECTOR
  best = fastest("spec_matvec", (key, *code), candidates, f"matvec kernel ({T} rows x ({N}, {C}); group, outputs)")
  use_matvec[key] = best
  return best

def seconds(x:Tensor, weights:list[Tensor], biases:list[Tensor]|None, kernel:tuple[int, int]|None) -> float:
  bs = biases or [None] * len(weights)
  return captured_seconds(lambda x: [linear(x, w, b, kernel=kernel).realize() for w, b in zip(weights, bs)], x)

"""The lanes kernel: a linear layer over a step's few rows at the cost of one row.

Replaces x @ w.T (formula()). A step pass multiplies T <= 16 rows by every weight matrix: memory-bound when T is 1,
and it should stay so for the K+1 rows of a verify pass. tinygrad's own kernels for a few rows read a weight once per
row or run out of registers on a CPU; this kernel holds every row, 4 lanes and 8 outputs in registers while the
weights stream past once. Whether it is faster is measured per shape, width and dtype on the device (choose()).
"""
from __future__ import annotations
import inspect, math
from tinygrad import Tensor, UOp, dtypes
from tinygrad.codegen.opt import Opt, OptOps
from tinygrad.uop.ops import AxisType, KernelInfo, Ops
from models.engine.measure import captured_seconds, faster

LANES, OUTPUTS, GROUPS = 4, 8, 8   # partial sums per output; outputs and groups of LANES at a time (docs/engine.md)
# (T, N, C, x dtype, weight dtype) -> run the lanes kernel: what choose() measured, for every model of the process
use_lanes: dict[tuple, bool] = {}

def formula(x:Tensor, w:Tensor, dtype=None) -> Tensor:
  """What the kernel replaces: x (..., C) @ w (N, C).T in dtype (default x's), accumulated in float32."""
  return x.matmul(w.T, dtype=dtype)

def lanes_kernel(out:UOp, x:UOp, w:UOp) -> UOp:
  """out[t, n, l] = sum_g x[t, g*LANES + l] * w[n, g*LANES + l], float32; x (T, C), w (N, C), out (T, N, LANES). Rows
  come in chunks (rows()). The options are fixed: OUTPUTS outputs and GROUPS groups at a time."""
  (T, N, _), G = out.shape, x.shape[1] // LANES
  chunk = rows(T)
  n, tc = UOp.range(N, 0), UOp.range(T // chunk, 1)
  ti, lane = UOp.range(chunk, 2, AxisType.UPCAST), UOp.range(LANES, 3, AxisType.UPCAST)
  g = UOp.range(G, 4, AxisType.REDUCE)
  t, k = tc * chunk + ti, g * LANES + lane
  acc = (x[t, k].cast(dtypes.float32) * w[n, k].cast(dtypes.float32)).reduce(g, arg=Ops.ADD)
  opts = (Opt(OptOps.UPCAST, 0, OUTPUTS), Opt(OptOps.UNROLL, 0, GROUPS))
  info = KernelInfo(name=f"lanes_{T}_{N}_{x.shape[1]}", opts_to_apply=opts)
  return out[t, n, lane].store(acc).end(tc, ti, n, lane).sink(arg=info)

def rows(T:int) -> int: return max(c for c in range(1, 9) if T % c == 0)   # a chunk: the most rows up to 8 dividing T
def fits(N:int, C:int) -> bool: return N % OUTPUTS == 0 and C % (GROUPS * LANES) == 0

def linear(x:Tensor, w:Tensor, dtype=None, lanes:bool|None=None) -> Tensor:
  """formula(x, w, dtype), by the lanes kernel or tinygrad's matmul; lanes None: as choose() measured (else the
  matmul)."""
  *B, C = x.shape
  T, N = math.prod(B), w.shape[0]
  if lanes is None: lanes = use_lanes.get((T, N, C, x.dtype, w.dtype), False)
  if not lanes: return formula(x, w, dtype)
  out = Tensor.empty(T, N, LANES, dtype=dtypes.float32, device=x.device)
  part = out.custom_kernel(x.reshape(T, C), w, fxn=lanes_kernel)[0]
  # the lanes summed outside, fused with what follows (bias, GELU, residual): inside, compilers kept them on the stack
  return part.sum(-1).cast(dtype or x.dtype).reshape(*B, N)

class Linear:
  """An nn.Linear (the same weight and bias, the same state names) computed by linear()."""
  def __init__(self, plain): self.weight, self.bias = plain.weight, plain.bias
  def __call__(self, x:Tensor) -> Tensor: return linear(x, self.weight) + self.bias

def choose(T:int, weights:list[Tensor], x_dtype) -> bool:
  """Whether T rows times these same-shape weights run faster as the lanes kernel than as tinygrad's matmul: both
  captured and timed over all of them in turn (as in a pass, the weights stream from memory), once per machine."""
  N, C = weights[0].shape
  key = (T, N, C, x_dtype, weights[0].dtype)
  if key not in use_lanes:
    x = Tensor.ones(T, C, dtype=x_dtype).contiguous().realize()
    code = (inspect.getsource(lanes_kernel), inspect.getsource(rows), (LANES, OUTPUTS, GROUPS))
    use_lanes[key] = fits(N, C) and faster("spec_lanes", (key, *code), lambda: seconds(x, weights, True),
                                           lambda: seconds(x, weights, False), f"lanes kernel ({T} rows x ({N}, {C}))")
  return use_lanes[key]

def seconds(x:Tensor, weights:list[Tensor], lanes:bool) -> float:
  return captured_seconds(lambda x: [linear(x, w, dtypes.float32, lanes).realize() for w in weights], x)

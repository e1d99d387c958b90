"""The lanes kernel: a linear layer over a step's few rows at the cost of one row.

Replaces x @ w.T (formula()). A step pass multiplies T <= 16 rows by every weight matrix: memory-bound when T is 1,
and it should stay so for the K+1 rows of a verify pass. tinygrad's own kernels for a few rows read a weight once per
row or run out of registers on a CPU; this kernel holds every row, 4 lanes and 8 outputs in registers while the
weights stream past once. Whether it is faster is measured per shape, width and dtype on the device (linear.py).
"""
from __future__ import annotations
import functools, math
from tinygrad import Tensor, UOp, Device, dtypes
from tinygrad.helpers import NUM_CPU_THREADS
from tinygrad.codegen.opt import Opt, OptOps
from tinygrad.uop.ops import AxisType, KernelInfo, Ops

LANES, OUTPUTS, GROUPS = 4, 8, 8   # partial sums per output; outputs and groups of LANES at a time (docs/engine.md)

def formula(x:Tensor, w:Tensor, dtype=None) -> Tensor:
  """What the kernel replaces: x (..., C) @ w (N, C).T in dtype (default x's), accumulated in float32."""
  return x.matmul(w.T, dtype=dtype)

def lanes_kernel(out:UOp, x:UOp, w:UOp, threads:int=1) -> UOp:
  """out[t, n, l] = sum_g x[t, g*LANES + l] * w[n, g*LANES + l], float32; x (T, C), w (N, C), out (T, N, LANES). Rows
  come in chunks (rows()). The options are fixed: OUTPUTS outputs and GROUPS groups at a time, the outputs split into
  `threads` parts, each a core's (tinygrad's heuristics give a kernel with fixed options none)."""
  (T, N, _), G = out.shape, x.shape[1] // LANES
  chunk = rows(T)
  n, tc = UOp.range(N, 0), UOp.range(T // chunk, 1)
  ti, lane = UOp.range(chunk, 2, AxisType.UPCAST), UOp.range(LANES, 3, AxisType.UPCAST)
  g = UOp.range(G, 4, AxisType.REDUCE)
  t, k = tc * chunk + ti, g * LANES + lane
  acc = (x[t, k].cast(dtypes.float32) * w[n, k].cast(dtypes.float32)).reduce(g, arg=Ops.ADD)
  opts = (Opt(OptOps.UPCAST, 0, OUTPUTS), Opt(OptOps.UNROLL, 0, GROUPS)) + thread(threads)
  info = KernelInfo(name=f"lanes_{T}_{N}_{x.shape[1]}", opts_to_apply=opts)
  return out[t, n, lane].store(acc).end(tc, ti, n, lane).sink(arg=info)

def rows(T:int) -> int: return max(c for c in range(1, 9) if T % c == 0)   # a chunk: the most rows up to 8 dividing T
def splits(n:int, device:str) -> int:
  """The parts a kernel's axis of n splits into, each a core's: the most up to tinygrad's thread count that divide n
  where the device's renderer has threads (tinygrad's CPU backend), else 1."""
  if not Device[device].renderer.has_threads: return 1
  return max(d for d in range(1, NUM_CPU_THREADS.value + 1) if n % d == 0)
def thread(threads:int) -> tuple[Opt, ...]: return (Opt(OptOps.THREAD, 0, threads),) if threads > 1 else ()
def fits(N:int, C:int) -> bool: return N % OUTPUTS == 0 and C % (GROUPS * LANES) == 0

def linear(x:Tensor, w:Tensor, dtype=None) -> Tensor:
  """formula(x, w, dtype) by the lanes kernel."""
  *B, C = x.shape
  T, N = math.prod(B), w.shape[0]
  out = Tensor.empty(T, N, LANES, dtype=dtypes.float32, device=x.device)
  kernel = functools.partial(lanes_kernel, threads=splits(N // OUTPUTS, x.device))
  part = out.custom_kernel(x.reshape(T, C), w, fxn=kernel)[0]
  # the lanes summed outside, fused with what follows (bias, GELU, residual): inside, compilers kept them on the stack
  return part.sum(-1).cast(dtype or x.dtype).reshape(*B, N)

"""The linear layers of a step pass, and the lanes kernel that computes a few rows of them at the cost of one.

A step pass multiplies T <= 16 rows by every weight matrix: memory-bound when T is 1 (each weight is read once), and it
should stay so for the K+1 rows of a verify pass. tinygrad's own kernels for a few rows, heuristic or searched, read a
weight once per row or run out of registers on the CPU (a 5-row pass of gpt2-xl cost 3x its decode). lanes_kernel
holds every row, 4 lanes and 8 outputs in registers while the weights stream past once. Whether it is faster than
tinygrad's kernel is measured, per shape, width and dtype, on the model's own weights and the device at hand
(choose()), and cached on disk; nothing names a device.
"""
from __future__ import annotations
import hashlib, importlib.metadata, inspect, math, time
from tinygrad import Tensor, TinyJit, UOp, Device, Context, dtypes
from tinygrad.codegen.opt import Opt, OptOps
from tinygrad.helpers import diskcache_get, diskcache_put
from tinygrad.uop.ops import AxisType, KernelInfo, Ops

# partial sums per output, and outputs and groups of LANES at a time. The compilers here (pocl, clang) vectorize a kernel's
# float4 loads 4 wide, so 8 lanes only held more registers: gpt2-xl's 9-token pass on pocl 540-542 ms, with 8 lanes, 4
# outputs and 4 groups 563-566 (its decode and 5-token pass, and gpt2's passes, the same within noise)
LANES, OUTPUTS, GROUPS = 4, 8, 8
# (T, N, C, x dtype, weight dtype) -> run the lanes kernel: what choose() measured on this device. One table for the
# process: a pass of these shapes runs the faster kernel whichever model it belongs to
use_lanes: dict[tuple, bool] = {}

def lanes_kernel(out:UOp, x:UOp, w:UOp) -> UOp:
  """out[t, n, l] = sum_g x[t, g*LANES + l] * w[n, g*LANES + l], float32; x (T, C), w (N, C), out (T, N, LANES).
  Rows come in chunks (rows()); a chunk's weights are read again from the cache. The kernel options are fixed:
  OUTPUTS outputs and GROUPS groups at a time (tinygrad's search caps a kernel's registers below this)."""
  (T, N, _), G = out.shape, x.shape[1] // LANES
  chunk = rows(T)
  n, tc = UOp.range(N, 0), UOp.range(T // chunk, 1)
  ti, lane, g = UOp.range(chunk, 2, AxisType.UPCAST), UOp.range(LANES, 3, AxisType.UPCAST), UOp.range(G, 4, AxisType.REDUCE)
  t, k = tc * chunk + ti, g * LANES + lane
  acc = (x[t, k].cast(dtypes.float32) * w[n, k].cast(dtypes.float32)).reduce(g, arg=Ops.ADD)
  opts = (Opt(OptOps.UPCAST, 0, OUTPUTS), Opt(OptOps.UNROLL, 0, GROUPS))
  return out[t, n, lane].store(acc).end(tc, ti, n, lane).sink(arg=KernelInfo(name=f"lanes_{T}_{N}_{x.shape[1]}", opts_to_apply=opts))

def rows(T:int) -> int: return max(c for c in range(1, 9) if T % c == 0)   # a chunk: the most rows up to 8 that divide T
def fits(N:int, C:int) -> bool: return N % OUTPUTS == 0 and C % (GROUPS * LANES) == 0

def linear(x:Tensor, w:Tensor, dtype=None, lanes:bool|None=None) -> Tensor:
  """x (..., C) @ w (N, C).T, in dtype (default x's), accumulated in float32. lanes: the lanes kernel or tinygrad's
  matmul; None: as choose() measured for this width and shape (tinygrad's matmul if it never did)."""
  *B, C = x.shape
  T, N = math.prod(B), w.shape[0]
  if lanes is None: lanes = use_lanes.get((T, N, C, x.dtype, w.dtype), False)
  if not lanes: return x.matmul(w.T, dtype=dtype)
  part = Tensor.empty(T, N, LANES, dtype=dtypes.float32, device=x.device).custom_kernel(x.reshape(T, C), w, fxn=lanes_kernel)[0]
  # the lanes summed here, fused with what follows (bias, GELU, residual): summed inside the kernel, clang and pocl kept
  # its accumulators on the stack (12 x 3072x768 weights, one row, CPU backend 7.0 -> 8.9 ms, pocl 5.7 -> 6.9)
  return part.sum(-1).cast(dtype or x.dtype).reshape(*B, N)

class Linear:
  """y = x w^T + b, w (out, in): nn.Linear's layout and state names, computed by linear()."""
  def __init__(self, n_in:int, n_out:int): self.weight, self.bias = Tensor.empty(n_out, n_in), Tensor.zeros(n_out)
  def __call__(self, x:Tensor) -> Tensor: return linear(x, self.weight) + self.bias

def choose(T:int, weights:list[Tensor], x_dtype) -> bool:
  """Whether T rows times these same-shape weights run faster as the lanes kernel than as tinygrad's matmul with its
  default kernels: both timed over all of them in turn (the regime of a pass: the weights stream from memory), best of
  3. Cached in tinygrad's disk cache by device, compiler target, tinygrad version, shapes and the kernel's code: once
  per machine."""
  N, C = weights[0].shape
  key = (T, N, C, x_dtype, weights[0].dtype)
  if key in use_lanes: return use_lanes[key]
  if not fits(N, C): use_lanes[key] = False; return False
  kernel = inspect.getsource(lanes_kernel) + inspect.getsource(rows) + repr((LANES, OUTPUTS, GROUPS))
  x = lambda: Tensor.ones(T, C, dtype=x_dtype).contiguous().realize()
  use_lanes[key] = faster("spec_lanes", (key, kernel), lambda: seconds(x(), weights, True), lambda: seconds(x(), weights, False))
  return use_lanes[key]

def faster(kind:str, what:tuple, first, second) -> bool:
  """Whether first() measures fewer seconds than second(), asked once per machine: cached in tinygrad's disk cache under
  kind by machine_key(*what) (what holds the measured code: a changed kernel, its chunks or options, is measured again)."""
  disk = machine_key(*what)
  if (ret := diskcache_get(kind, disk)) is None: ret = diskcache_put(kind, disk, first() < second())
  return ret

def half_pays() -> bool:
  """Whether this device multiplies a row by half weights clearly faster (1.25x) than by float32 ones, as tinygrad's
  matmul: where half is native (a GPU) it reads half the bytes; where tinygrad converts every half value to float (its
  CPU backend) or emulates half (an OpenCL driver without cl_khr_fp16, such as pocl) it does not. 8 weights of 1024 x
  4096 timed in turn, best of 3. Cached in tinygrad's disk cache by device, compiler target and tinygrad version."""
  if dtypes.half not in Device[Device.DEFAULT].renderer.supported_dtypes(): return False
  disk = machine_key()
  if (pays := diskcache_get("spec_half", disk)) is None:
    weights = [Tensor.ones(1024, 4096).contiguous().realize() for _ in range(8)]
    def cost(dtype) -> float:
      return seconds(Tensor.ones(1, 4096, dtype=dtype).contiguous().realize(), [w.cast(dtype).contiguous().realize() for w in weights], False)
    pays = diskcache_put("spec_half", disk, cost(dtypes.half) * 1.25 < cost(dtypes.float32))
  return pays

def machine_key(*what) -> str:
  """A disk-cache key for a measurement on this machine: tinygrad's version, the device, its compiler target, and what."""
  return hashlib.sha256(repr((importlib.metadata.version("tinygrad"), Device.DEFAULT, Device[Device.DEFAULT].renderer.target,
                              *what)).encode()).hexdigest()

def seconds(x:Tensor, weights:list[Tensor], lanes:bool) -> float:
  step = TinyJit(lambda x: [linear(x, w, dtypes.float32, lanes).realize() for w in weights])
  with Context(BEAM=0):
    for _ in range(2): step(x)                    # a TinyJit captures on its second call
  return best_seconds(lambda: step(x))

def best_seconds(fn, reps:int=3) -> float:
  """The fastest of reps synchronized calls of fn: its cost without the noise of whatever else the machine does."""
  def once() -> float: t0 = synchronize(); fn(); return synchronize() - t0
  return min(once() for _ in range(reps))

def synchronize() -> float: Device[Device.DEFAULT].synchronize(); return time.perf_counter()

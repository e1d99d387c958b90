"""Layer norm of a step pass's few rows as one kernel of its own, or as tinygrad's three (mean, variance, normalize).

A decode runs two layer norms a layer, and on a CPU a small model's pass costs more per kernel than per byte (pocl:
~20 us of dispatch a kernel; the two norms were 6 of a layer's 19 kernels). One
work-item per row, which loops over it three times, does in one kernel what tinygrad's reductions split over threads:
gpt2's 768 wide, one row, on pocl 22 us against ~70 (tinygrad's CPU backend alike). For wide prefills and on GPUs a
work-item per row loses; which is faster is measured per device and shape (choose()), as for the linear layers.
"""
from __future__ import annotations
import functools, inspect, math
from tinygrad import Tensor, TinyJit, UOp, Context, dtypes
from tinygrad.uop.ops import AxisType, KernelInfo, Ops
from models.linear import best_seconds, faster

# (T, C, dtype) -> run the kernel here: what choose() measured on this device
use_kernel: dict[tuple, bool] = {}

def norm_kernel(out:UOp, x:UOp, w:UOp, b:UOp, eps:float) -> UOp:
  """out[t] = (x[t] - mean x[t]) / sqrt(var x[t] + eps) * w + b for each row of x (T, C), float32 inside, in out's dtype:
  a work-item per row that loops over it for the mean, again for the variance, and a third time to write."""
  T, C = out.shape
  t = UOp.range(T, 0, AxisType.GLOBAL)
  k1, k2, k = UOp.range(C, 1, AxisType.REDUCE), UOp.range(C, 2, AxisType.REDUCE), UOp.range(C, 3, AxisType.LOOP)
  f32 = lambda u: u.cast(dtypes.float32)
  mean = f32(x[t, k1]).reduce(k1, arg=Ops.ADD) * (1 / C)
  var = ((f32(x[t, k2]) - mean) ** 2).reduce(k2, arg=Ops.ADD) * (1 / C)
  y = (f32(x[t, k]) - mean) * (var + eps).rsqrt() * f32(w[k]) + f32(b[k])
  # no options: tinygrad's would split the row over threads, each recomputing the row's mean and variance
  return out[t, k].store(y.cast(out.dtype)).end(t, k).sink(arg=KernelInfo(name=f"norm_{T}_{C}", opts_to_apply=()))

def layer_norm(x:Tensor, w:Tensor, b:Tensor, eps:float, kernel:bool|None=None) -> Tensor:
  """nn.LayerNorm over x's last axis, in x's dtype. kernel: the kernel here or tinygrad's; None: as choose() measured
  for this width and shape (tinygrad's if it never did)."""
  *B, C = x.shape
  T = math.prod(B)
  if kernel is None: kernel = use_kernel.get((T, C, x.dtype), False)
  if not kernel: return x.layernorm(eps=eps) * w + b
  out = Tensor.empty(T, C, dtype=x.dtype, device=x.device)
  return out.custom_kernel(x.reshape(T, C), w, b, fxn=functools.partial(norm_kernel, eps=eps))[0].reshape(x.shape)

class LayerNorm:
  """nn.LayerNorm's state names and result, computed by layer_norm()."""
  def __init__(self, C:int, eps:float=1e-5): self.weight, self.bias, self.eps = Tensor.ones(C), Tensor.zeros(C), eps
  def __call__(self, x:Tensor) -> Tensor: return layer_norm(x, self.weight, self.bias, self.eps)

def choose(T:int, norms:list[LayerNorm], dtype) -> bool:
  """Whether T rows are normalized faster by the kernel here than by tinygrad's, over these norms (a model's): both
  timed (seconds()), and cached on disk like linear.choose(); once per machine."""
  key = (T, norms[0].weight.shape[0], dtype)
  if key not in use_kernel:
    code = inspect.getsource(norm_kernel) + inspect.getsource(layer_norm)
    use_kernel[key] = faster("spec_norm", (key, code), lambda: seconds(T, norms, dtype, True), lambda: seconds(T, norms, dtype, False))
  return use_kernel[key]

def seconds(T:int, norms:list[LayerNorm], dtype, kernel:bool) -> float:
  """T rows through every norm, captured, best of 3."""
  x = Tensor.ones(T, norms[0].weight.shape[0], dtype=dtype).contiguous().realize()
  step = TinyJit(lambda x: [layer_norm(x, n.weight, n.bias, n.eps, kernel).realize() for n in norms])
  with Context(BEAM=0):
    for _ in range(2): step(x)              # a TinyJit captures on its second call
  return best_seconds(lambda: step(x))

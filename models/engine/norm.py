"""The layer norm of a step's few rows as one kernel, where tinygrad computes it in three (mean, variance, normalize).

Replaces nn.LayerNorm (formula()). On a CPU a small model's pass costs more per kernel than per byte, and the two norms
of a layer were a third of its kernels. One work-item per row loops over it three times. For wide prefills and on GPUs
a work-item per row loses; which is faster is measured per device and shape (choose()).
"""
from __future__ import annotations
import functools, inspect, math
from tinygrad import Tensor, UOp, dtypes, nn
from tinygrad.uop.ops import AxisType, KernelInfo, Ops
from models.engine.measure import captured_seconds, faster

# (T, C, dtype) -> run the kernel here: what choose() measured on this device
use_kernel: dict[tuple, bool] = {}

def formula(x:Tensor, w:Tensor, b:Tensor, eps:float) -> Tensor:
  """What the kernel replaces: nn.LayerNorm over x's last axis."""
  return x.layernorm(eps=eps) * w + b

def norm_kernel(out:UOp, x:UOp, w:UOp, b:UOp, eps:float) -> UOp:
  """out[t] = (x[t] - mean x[t]) / sqrt(var x[t] + eps) * w + b for each row of x (T, C), float32 inside: a work-item
  per row that loops over it for the mean, again for the variance, and a third time to write."""
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
  """formula(), in x's dtype, by the kernel or tinygrad's; kernel None: as choose() measured (else tinygrad's)."""
  *B, C = x.shape
  T = math.prod(B)
  if kernel is None: kernel = use_kernel.get((T, C, x.dtype), False)
  if not kernel: return formula(x, w, b, eps)
  out = Tensor.empty(T, C, dtype=x.dtype, device=x.device)
  return out.custom_kernel(x.reshape(T, C), w, b, fxn=functools.partial(norm_kernel, eps=eps))[0].reshape(x.shape)

class LayerNorm:
  """An nn.LayerNorm (the same weight and bias, the same state names) computed by layer_norm()."""
  def __init__(self, plain:nn.LayerNorm): self.weight, self.bias, self.eps = plain.weight, plain.bias, plain.eps
  def __call__(self, x:Tensor) -> Tensor: return layer_norm(x, self.weight, self.bias, self.eps)

def choose(T:int, norms:list[LayerNorm], dtype) -> bool:
  """Whether T rows are normalized faster by the kernel than by tinygrad's, over these norms (a model's): both captured
  and timed, once per machine."""
  C = norms[0].weight.shape[0]
  key = (T, C, dtype)
  if key not in use_kernel:
    code = inspect.getsource(norm_kernel) + inspect.getsource(layer_norm)
    use_kernel[key] = faster("spec_norm", (key, code), lambda: seconds(T, norms, dtype, True),
                             lambda: seconds(T, norms, dtype, False), f"layer norm kernel ({T} rows x {C})")
  return use_kernel[key]

def seconds(T:int, norms:list[LayerNorm], dtype, kernel:bool) -> float:
  """T rows through every norm, captured, best of 3."""
  x = Tensor.ones(T, norms[0].weight.shape[0], dtype=dtype).contiguous().realize()
  return captured_seconds(lambda x: [layer_norm(x, n.weight, n.bias, n.eps, kernel).realize() for n in norms], x)

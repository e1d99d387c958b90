"""The layer norm of a step's few rows as one kernel, where tinygrad computes it in three (mean, variance, normalize).

Replaces the port's LayerNorm (formula()). On a CPU a small model's pass costs more per kernel than per byte, and the
two norms of a layer were a third of its kernels. One work-item per row loops over it three times. For wide prefills
and on GPUs a work-item per row loses: there a work-group per row sums it in one kernel (stats_kernel(); a GPU's
tinygrad gave each of its two sums 16 threads). Which way, and the work-group size, is measured per width and dtype
(choose()); where a linear layer runs the matvec kernel, its layer norm runs inside it (matvec.py).
"""
from __future__ import annotations
import functools, math
from tinygrad import Tensor, UOp, dtypes
from models.engine.choice import CHOSEN, TINYGRAD, Way, activations, captured, fastest, sources
from models.engine.device import group_sizes, work_groups
from models.engine.internals import AxisType, KernelInfo, Ops, Opt, OptOps

GROUPS, VECTOR = (64, 128, 256), 4   # work-group sizes measured (near these); the elements a load reads
MEASURED_NORMS = 16   # norms a candidate is timed over: a norm's cost is its launches, not bytes

def formula(x:Tensor, w:Tensor, b:Tensor, eps:float, dtype=None) -> Tensor:
  """What the kernel replaces: the port's LayerNorm over x's last axis, its statistics in float32 (models/gpt2.py), in
  dtype (default x's)."""
  return (x.float().layernorm(eps=eps) * w + b).cast(dtype or x.dtype)

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

def shift(row, C:int) -> UOp|Tensor:
  """What a row's one-pass sums are shifted by: the median of its first, middle and last elements (row(k): element k,
  float32), close to the mean, so that a variance taken as a difference of the sums loses nothing to a mean far from 0;
  a massive element (GPT-2's thousands) moves it only where it is not alone among the three (docs/engine.md)."""
  a, b, c = row(0), row(C // 2), row(C - 1)
  return a.minimum(b).maximum(a.maximum(b).minimum(c))

def stats_kernel(out:UOp, x:UOp, group:int) -> UOp:
  """out[t] = (sum_k d, sum_k d^2), d = x[t, k] - shift(x[t]), float32 inside: a row's sums shifted near its mean;
  each row's sum split over a work-group of group threads, VECTOR elements a load."""
  T, C = x.shape
  t, j, k = UOp.range(T, 0), UOp.range(2, 1, AxisType.UPCAST), UOp.range(C, 2, AxisType.REDUCE)
  d = x[t, k].cast(dtypes.float32) - shift(lambda i: x[t, i].cast(dtypes.float32), C)
  acc = j.eq(0).where(d, d * d).reduce(k, arg=Ops.ADD)
  info = KernelInfo(name=f"stats_{T}_{C}", opts_to_apply=(Opt(OptOps.UNROLL, 0, VECTOR), Opt(OptOps.GROUP, 0, group)))
  return out[t, j].store(acc).end(t, j).sink(arg=info)

def groups(C:int) -> list[int]:
  """Work-group sizes near GROUPS that share a row's vectors evenly; none where the device has no work-groups."""
  return group_sizes(C // VECTOR, GROUPS, 512) if work_groups() and C % VECTOR == 0 else []

def grouped(x:Tensor, w:Tensor, b:Tensor, eps:float, group:int, dtype=None) -> Tensor:
  """formula() from stats_kernel()'s sums: mean = shift + S1 / C, variance = S2 / C - (S1 / C)^2."""
  *B, C = x.shape
  rows = x.reshape(math.prod(B), C)
  out = Tensor.empty(rows.shape[0], 2, dtype=dtypes.float32, device=x.device)
  moments = out.custom_kernel(rows, fxn=functools.partial(stats_kernel, group=group))[0] / C
  d_mean = moments[:, :1]   # the mean of x - shift
  # the variance as a difference of float32 sums can round below 0
  mean, var = shift(lambda i: rows[:, i:i + 1].float(), C) + d_mean, (moments[:, 1:] - d_mean * d_mean).maximum(0)
  return ((rows.float() - mean) * (var + eps).rsqrt() * w.float() + b.float()).cast(dtype or x.dtype).reshape(x.shape)

def layer_norm(x:Tensor, w:Tensor, b:Tensor, eps:float, way:Way|None=None, dtype=None) -> Tensor:
  """formula() in dtype (default x's; a consumer that reads float32 skips a rounding): by stats_kernel()
  (Way("stats", its work-group size)), norm_kernel() (Way("row")) or tinygrad's (TINYGRAD); None: as choose() measured
  (else tinygrad's)."""
  *B, C = x.shape
  T = math.prod(B)
  if way is None: way = CHOSEN.way("norm", (T, C, x.dtype))
  if way == TINYGRAD: return formula(x, w, b, eps, dtype)
  if way.kernel == "stats": return grouped(x, w, b, eps, way.option, dtype)
  out = Tensor.empty(T, C, dtype=dtype or x.dtype, device=x.device)
  return out.custom_kernel(x.reshape(T, C), w, b, fxn=functools.partial(norm_kernel, eps=eps))[0].reshape(x.shape)

class LayerNorm:
  """The port's LayerNorm (the same weight and bias, the same state names) computed by layer_norm()."""
  def __init__(self, plain): self.weight, self.bias, self.eps = plain.weight, plain.bias, plain.eps
  def __call__(self, x:Tensor) -> Tensor: return layer_norm(x, self.weight, self.bias, self.eps)

def ways(C:int) -> list[Way]:
  """The ways that fit rows of C on this device, tinygrad's first."""
  return [TINYGRAD, Way("row")] + [Way("stats", g) for g in groups(C)]

def choose(T:int, norms:list[LayerNorm], dtype) -> Way:
  """The way T rows are normalized fastest, of those that compute what tinygrad's does, over the first MEASURED_NORMS of
  these (a model's): each captured and timed on rows shaped like GPT-2's residual stream, its outputs compared on
  massive rows and on ordinary ones (choice.activations()), once per machine; the stats kernel's other work-group
  sizes only while its first is close."""
  C = norms[0].weight.shape[0]
  key = (T, C, dtype)
  if CHOSEN.needs("norm", key):
    norms = norms[:MEASURED_NORMS]
    x, *other = activations(T, C, dtype=dtype)
    def run(way):
      return captured(lambda x: [layer_norm(x, n.weight, n.bias, n.eps, way) for n in norms],
                      [(x,)] + [(o,) for o in other])
    CHOSEN.measured["norm"][key] = fastest("spec_norm", (key, sources(__name__)),
                                           {w: functools.partial(run, w) for w in ways(C)},
                                           f"layer norm kernel ({T} rows x {C})", dtype,
                                           family=lambda w: w.kernel if w.kernel == "stats" else None, length=C)
  return CHOSEN.way("norm", key)

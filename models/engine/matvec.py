"""The matvec kernel: a linear layer over a step's few rows as a GPU reads memory fastest, with what surrounds it fused.

Replaces x @ w.T + b (formula()) where the device has work-groups (GPUs). A GPU reaches its memory's speed with many
threads in flight, each loading wide vectors: tinygrad's own kernels for one row give gpt2's layers a few hundred
threads looping over the whole reduction (docs/backends.md). Here each output's reduction is split over a work-group of
`group` threads, a multiple of a warp's 32 where the row is long enough (the row padded to a multiple of it, the
padding's loads masked), each thread loads 4 consecutive weights at a time (16 bytes in float32, 8 in float16:
tinygrad loads at most 4 halves at once unless ALLOW_HALF8, which measured no faster on an H100) and keeps every one of
the T <= 16 rows and `outputs` outputs in registers.

What a block does around a linear layer runs in the same kernel, so that a layer costs one launch: the layer norm
before it (the row's sums taken in the same loop and folded in by linearity, below), the bias, GELU and the residual
add after it, before the one store. Which group and outputs, and whether the kernel beats the lanes kernel and
tinygrad's matmul, is measured per shape, width and dtype on the device (linear.py).
"""
from __future__ import annotations
import functools, math
from tinygrad import Tensor, UOp, dtypes
from models.engine.device import work_groups
from models.engine.internals import AxisType, KernelInfo, Ops, Opt, OptOps
from models.engine.norm import shift

# the options measured, the likeliest first (its time decides whether the rest are timed: measure.fastest); a load's
# elements
OPTIONS, VECTOR = ((64, 1), (32, 1), (128, 1), (64, 2), (32, 2), (128, 2)), 4

def formula(x:Tensor, w:Tensor, b:Tensor|None=None, dtype=None) -> Tensor:
  """What the kernel replaces: x (..., C) @ w (N, C).T (+ b) in dtype (default x's), accumulated in float32."""
  y = x.matmul(w.T, dtype=dtypes.float32)
  return (y if b is None else y + b.float()).cast(dtype or x.dtype)

def matvec_kernel(out:UOp, x:UOp, w:UOp, *extra:UOp, group:int, outputs:int, norm:float|None=None, bias:bool=False,
                  gelu:bool=False, residual:bool=False) -> UOp:
  """out[t, n] = sum_k x[t, k] * w[n, k], then + bias[n], GELU, + residual[t, n] as asked, float32 inside; x (T, C),
  w (N, C), out (T, N) in its dtype. extra: the layer norm's weight g and bias h (norm: its eps), the bias, the
  residual, in that order. With norm, x is first normalized, without a pass of its own: with d = x[t] - shift (the
  sums shifted near the row's mean: norm.shift()), m = mean d, r = 1 / sqrt(var d + eps),
    sum_k ((d_k - m) r g_k + h_k) w_nk = r (sum_k d_k g_k w_nk - m sum_k g_k w_nk) + sum_k h_k w_nk,
  five sums over k in the same loop. The reduction unrolled by a vector load, padded to and split over group threads,
  outputs outputs a thread, every row in registers."""
  (T, N), C = out.shape, x.shape[1]
  extra = list(extra)
  g, h = (extra.pop(0), extra.pop(0)) if norm is not None else (None, None)
  b, r = extra.pop(0) if bias else None, extra.pop(0) if residual else None
  n, t, k = UOp.range(N, 0), UOp.range(T, 1, AxisType.UPCAST), UOp.range(C, 2, AxisType.REDUCE)
  f32 = lambda u: u.cast(dtypes.float32)
  add = lambda u: u.reduce(k, arg=Ops.ADD)
  if norm is None: y = add(f32(x[t, k]) * f32(w[n, k]))
  else:
    d, wg = f32(x[t, k]) - shift(lambda i: f32(x[t, i]), C), f32(g[k]) * f32(w[n, k])
    m, var = add(d) * (1 / C), add(d * d) * (1 / C)
    rstd = ((var - m * m).maximum(0) + norm).rsqrt()   # a difference of float32 sums can round below 0
    y = (add(d * wg) - m * add(wg)) * rstd + add(f32(h[k]) * f32(w[n, k]))
  if b is not None: y = y + f32(b[n])
  if gelu: y = y.gelu()
  if r is not None: y = y + f32(r[t, n])
  V, reduce_axis = C // VECTOR, (N > 1) + (T > 1)   # the reduction's axis among those longer than 1
  opts = (Opt(OptOps.UNROLL, 0, VECTOR),) + ((Opt(OptOps.PADTO, reduce_axis, V + -V % group),) if V % group else ()) + \
         (Opt(OptOps.GROUP, 0, group),) + ((Opt(OptOps.UPCAST, 0, outputs),) if outputs > 1 else ())
  info = KernelInfo(name=f"matvec_{T}_{N}_{C}", opts_to_apply=opts)
  return out[t, n].store(y.cast(out.dtype)).end(t, n).sink(arg=info)

def options(N:int, C:int) -> list[tuple[int, int]]:
  """The (group, outputs) of OPTIONS that fit: outputs dividing N, a group that pads the row's vectors by less than a
  third (idle threads) and, where it pads, into more than one load a thread (a single padded load leaves the padding
  threads' slots of the group's sum unwritten in tinygrad's kernel: shared memory's garbage summed, seen on pocl); a
  row too short for any (a tiny model's) gets the largest power of two within it."""
  if C % VECTOR: return []
  V = C // VECTOR
  fit = [(g, o) for g, o in OPTIONS if N % o == 0 and (V + -V % g) * 3 < V * 4 and (V % g == 0 or V > g)]
  return fit or ([(1 << (V.bit_length() - 1), 1)] if V >= 8 else [])

def fits(N:int, C:int) -> bool:
  """A device with work-groups and shared memory (a GPU; not tinygrad's CPU backend) and a shape options() fits."""
  return work_groups() and bool(options(N, C))

def linear(x:Tensor, w:Tensor, b:Tensor|None=None, dtype=None, kernel:tuple[int, int]=(32, 1), ln=None,
           gelu:bool=False, residual:Tensor|None=None) -> Tensor:
  """formula(x, w, b, dtype) by the kernel with options kernel (group, outputs), after ln (a layer norm: weight, bias,
  eps) of x, then GELU and + residual where asked, in one kernel."""
  *B, C = x.shape
  T, N = math.prod(B), w.shape[0]
  extra = ([ln.weight, ln.bias] if ln is not None else []) + ([b] if b is not None else []) + \
          ([residual.reshape(T, N)] if residual is not None else [])
  fxn = functools.partial(matvec_kernel, group=kernel[0], outputs=kernel[1], norm=None if ln is None else ln.eps,
                          bias=b is not None, gelu=gelu, residual=residual is not None)
  out = Tensor.empty(T, N, dtype=dtype or x.dtype, device=x.device)
  return out.custom_kernel(x.reshape(T, C), w, *extra, fxn=fxn)[0].reshape(*B, N)

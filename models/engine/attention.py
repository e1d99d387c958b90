"""Attention's two kernels: a step's T queries over the KV cache, reading each cached key and value once for all rows.

Replaces the port's Attention.attend (formula()). tinygrad's heuristics size a kernel by its fixed axes only (heads x
rows), not by the cache's symbolic length: they split the 64-long dot product over threads and never hold the rows in
registers, so every row reads the keys and values again. These kernels hold a chunk of rows in registers while the
cache streams past once. Which is faster is measured per device and shape (choose()). On a GPU the softmax's
reductions and the weighted sum still run a work-item per head (and row) over every cached position: where the device
has work-groups, the positions can instead be split into CHUNKS (chunks_kernel(), each chunk's softmax and weighted
sum apart, then combine_kernel()), as measured (choose_chunks()).
"""
from __future__ import annotations
import functools, inspect, math
from tinygrad import Tensor, UOp, dtypes
from tinygrad.uop.ops import AxisType, KernelInfo, Ops
from models.gpt2 import Attention
from models.engine.lanes import rows
from models.engine.measure import captured_seconds, faster, work_groups

SPLIT = 4   # outputs of the head dimension a work-item of the weighted sum holds per row (docs/engine.md)
CHUNKS = 32   # parts of the cached positions whose softmax and weighted sum chunks_kernel() takes apart
# (T, heads, positions, head_dim, dtype) -> run the kernels here: what choose() measured on this device
use_kernels: dict[tuple, bool] = {}
# (T, heads, positions, head_dim, dtype) -> run the chunked kernels here: what choose_chunks() measured
use_chunks: dict[tuple, bool] = {}

formula = Attention.attend   # what the kernels replace: softmax(q k^T / sqrt(D) + mask) v over the cache

def scores_kernel(out:UOp, qkv:UOp, cache:UOp, pos:UOp) -> UOp:
  """out[0, h, t, s] = q[t, h] . k[h, s] / sqrt(D) for s <= pos + t, -inf for the block's later positions (causal),
  float32; qkv (1, T, 3C) is c_attn's output, cache (2, 1, H, P, D). Columns from pos + T on are not written. A
  work-item per head, position and chunk of rows; the dot product in 4 lanes."""
  (_, H, T, _), D = out.shape, cache.shape[-1]
  chunk = rows(T)
  h, s, tc = UOp.range(H, 0), UOp.range(pos + T, 1), UOp.range(T // chunk, 2)
  ti, lane = UOp.range(chunk, 3, AxisType.UPCAST), UOp.range(4, 5, AxisType.UPCAST)
  d = UOp.range(D // 4, 4, AxisType.REDUCE)
  t, k = tc * chunk + ti, d * 4 + lane
  products = qkv[0, t, h * D + k].cast(dtypes.float32) * cache[0, 0, h, s, k].cast(dtypes.float32)
  dot = products.reduce(d, arg=Ops.ADD).reduce(lane, arg=Ops.ADD)
  score = (s <= pos + t).where(dot * (1 / math.sqrt(D)), -math.inf)
  info = KernelInfo(name=f"scores_{T}_{H}_{D}", opts_to_apply=())
  return out[0, h, t, s].store(score).end(h, s, tc, ti).sink(arg=info)

def values_kernel(out:UOp, exps:UOp, cache:UOp, pos:UOp) -> UOp:
  """out[0, t, h*D + d] = sum_s exps[0, h, t, s] * v[h, s, d] / sum_s exps[0, h, t, s] over s < pos + T: the softmax's
  division done on T x D outputs instead of T x S exponentials. A work-item per head, SPLIT outputs and chunk of
  rows."""
  (_, H, T, _), D = exps.shape, cache.shape[-1]
  chunk = rows(T)
  h, dc, tc = UOp.range(H, 0), UOp.range(D // SPLIT, 1), UOp.range(T // chunk, 2)
  ti, dl = UOp.range(chunk, 3, AxisType.UPCAST), UOp.range(SPLIT, 4, AxisType.UPCAST)
  s, s2 = UOp.range(pos + T, 5, AxisType.REDUCE), UOp.range(pos + T, 6, AxisType.REDUCE)
  t, d = tc * chunk + ti, dc * SPLIT + dl
  acc = (exps[0, h, t, s] * cache[1, 0, h, s, d].cast(dtypes.float32)).reduce(s, arg=Ops.ADD)
  y = acc / exps[0, h, t, s2].reduce(s2, arg=Ops.ADD)
  info = KernelInfo(name=f"values_{T}_{H}_{D}", opts_to_apply=())
  return out[0, t, h * D + d].store(y.cast(out.dtype)).end(h, dc, tc, ti, dl).sink(arg=info)

def chunks_kernel(out:UOp, scores:UOp, cache:UOp, pos:UOp) -> UOp:
  """out[0, h, t, j] = (o_0 .. o_D-1, m, l) over chunk j of the positions s < pos + T (CHUNKS chunks of equal length):
  m its largest score, l = sum_s exp(score_s - m), o_d = sum_s exp(score_s - m) v[h, s, d]; a chunk of no position or
  of masked ones only has m -inf and l, o 0. A work-item per head, row and chunk; indices clamped into the buffers."""
  (_, H, T, _, E), (P, D) = out.shape, cache.shape[-2:]
  S = pos + T
  L = (S + (CHUNKS - 1)) // CHUNKS
  h, t, j = UOp.range(H, 0), UOp.range(T, 1), UOp.range(CHUNKS, 2)
  l1, l2, l3 = (UOp.range(L, 3 + i, AxisType.REDUCE) for i in range(3))
  e = UOp.range(E, 6, AxisType.UPCAST)
  inside = lambda l: j * L + l < S
  score = lambda l: inside(l).where(scores[0, h, t, (j * L + l).minimum(P - 1)], -math.inf)
  m = score(l1).reduce(l1, arg=Ops.MAX)
  shift = m.maximum(-3e38)   # a chunk masked whole (m -inf): its exponentials 0, not exp(-inf + inf)
  weight = lambda l: inside(l).where((score(l) - shift).exp(), 0.0)
  total = weight(l2).reduce(l2, arg=Ops.ADD)
  v = cache[1, 0, h, (j * L + l3).minimum(P - 1), e.minimum(D - 1)].cast(dtypes.float32)
  acc = (weight(l3) * v).reduce(l3, arg=Ops.ADD)
  info = KernelInfo(name=f"chunks_{T}_{H}_{D}", opts_to_apply=())
  return out[0, h, t, j, e].store((e < D).where(acc, e.eq(D).where(m, total))).end(h, t, j, e).sink(arg=info)

def combine_kernel(out:UOp, parts:UOp) -> UOp:
  """out[0, t, h*D + d] = sum_j exp(m_j - m) o_j,d / sum_j exp(m_j - m) l_j with m = max_j m_j: the chunks' softmax
  and weighted sums made one. A work-item per head, row and output."""
  (_, H, T, _, E), D = parts.shape, parts.shape[-1] - 2
  h, t, d = UOp.range(H, 0), UOp.range(T, 1), UOp.range(D, 2)
  j1, j2, j3 = (UOp.range(CHUNKS, 3 + i, AxisType.REDUCE) for i in range(3))
  m = parts[0, h, t, j1, D].reduce(j1, arg=Ops.MAX)
  weight = lambda j: (parts[0, h, t, j, D] - m).exp()
  num = (weight(j2) * parts[0, h, t, j2, d]).reduce(j2, arg=Ops.ADD)
  den = (weight(j3) * parts[0, h, t, j3, D + 1]).reduce(j3, arg=Ops.ADD)
  info = KernelInfo(name=f"combine_{T}_{H}_{D}", opts_to_apply=())
  return out[0, t, h * D + d].store((num / den).cast(out.dtype)).end(h, t, d).sink(arg=info)

def custom(fxn, out:Tensor, *inputs:Tensor, pos:UOp) -> Tensor:
  """out after fxn(out, *inputs, pos) ran: Tensor.custom_kernel passes buffers only, so the position, an expression of
  variables (a draft's later steps run at start_pos + 1, ...), goes beside them as tinygrad's own kernels hold one."""
  buffers = [out.uop, *(x.uop for x in inputs)]
  params = [UOp.placeholder_like(u, slot=i) for i, u in enumerate(buffers)]
  bound = [u for u in pos.toposort() if u.is_bound_var]
  variables = bound + [u for u in pos.toposort() if u.is_variable and all(b.src[0] is not u for b in bound)]
  names = {u: (u.src[0] if u.op is Ops.AFTER else u).replace(op=Ops.PARAM) for u in variables}
  return Tensor(out.uop.after(fxn(*params, pos.substitute(names)).call(*buffers, *variables)))

def kernels(qkv:Tensor, cache:Tensor, start_pos:int|UOp, chunks:bool=False) -> Tensor:
  """formula()'s result (1, T, C) by the two kernels, tinygrad's own taking the scores' maximum and exponentials; or
  (chunks) by the scores kernel, chunks_kernel() and combine_kernel()."""
  (B, T, C3), (_, _, H, P, D) = qkv.shape, cache.shape
  # the kernels' ranges end at a variable whatever start_pos is: a range of one position (an eager pass at 0) is no loop
  pos = start_pos if isinstance(start_pos, UOp) else UOp.variable("pos", 0, P - T).bind(start_pos)
  scores = custom(scores_kernel, Tensor.empty(B, H, T, P, device=qkv.device), qkv, cache, pos=pos)
  if chunks:
    parts = custom(chunks_kernel, Tensor.empty(B, H, T, CHUNKS, D + 2, device=qkv.device), scores, cache, pos=pos)
    return Tensor.empty(B, T, C3 // 3, dtype=qkv.dtype, device=qkv.device).custom_kernel(parts, fxn=combine_kernel)[0]
  scores = scores[..., :start_pos + T]
  exps = Tensor.empty(B, H, T, P, device=qkv.device)   # another buffer: written in place, tinygrad copied it first
  exps[..., :start_pos + T].assign((scores - scores.max(-1, keepdim=True)).exp())
  return custom(values_kernel, Tensor.empty(B, T, C3 // 3, dtype=qkv.dtype, device=qkv.device), exps, cache, pos=pos)

def fits(D:int) -> bool: return D % 4 == 0 and D % SPLIT == 0

def chunks_fit(D:int) -> bool:
  """The chunked kernels are a candidate where the device has work-groups (a GPU; not tinygrad's CPU backend)."""
  return fits(D) and work_groups()

def attend(attn:Attention, qkv:Tensor, start_pos:int|UOp, use:bool|None=None, chunks:bool|None=None) -> Tensor:
  """formula(attn, qkv, start_pos) by the chunked kernels, the kernels or tinygrad's; use and chunks None: as
  choose_chunks() and choose() measured (else tinygrad's)."""
  (_, T, _), (_, _, H, P, D) = qkv.shape, attn.cache_kv.shape
  key = (T, H, P, D, qkv.dtype)
  if chunks or (chunks is None and use is None and use_chunks.get(key, False)):
    return kernels(qkv, attn.cache_kv, start_pos, chunks=True)
  if use is None: use = use_kernels.get(key, False)
  return kernels(qkv, attn.cache_kv, start_pos) if use else formula(attn, qkv, start_pos)

def install(attn:Attention) -> None:
  """attn.attend computed by attend(): an instance attribute in front of the class's method."""
  attn.attend = functools.partial(attend, attn)

def choose(T:int, layers:list[Attention], dtype) -> bool:
  """Whether a pass of T rows attends faster through the kernels than through the formula, over these layers at a
  quarter of their context: both captured and timed, once per machine."""
  _, _, H, P, D = layers[0].cache_kv.shape
  key = (T, H, P, D, dtype)
  if key not in use_kernels:
    code = "".join(inspect.getsource(f) for f in (scores_kernel, values_kernel, kernels, rows)) + repr(SPLIT)
    use_kernels[key] = fits(D) and faster("spec_attention", (key, code), lambda: seconds(T, layers, dtype, True),
                                          lambda: seconds(T, layers, dtype, False),
                                          f"attention kernels ({T} rows, {H} x {D})")
  return use_kernels[key]

def choose_chunks(T:int, layers:list[Attention], dtype) -> bool:
  """Whether a pass of T rows attends faster through the chunked kernels than as choose() left it, over these layers at
  a quarter of their context, once per machine; never where they do not fit."""
  _, _, H, P, D = layers[0].cache_kv.shape
  key = (T, H, P, D, dtype)
  if key not in use_chunks:
    code = "".join(inspect.getsource(f) for f in (scores_kernel, chunks_kernel, combine_kernel, kernels)) + repr(CHUNKS)
    use_chunks[key] = chunks_fit(D) and faster("spec_attention_chunks", (key, code),
                                               lambda: seconds(T, layers, dtype, None, True),
                                               lambda: seconds(T, layers, dtype, None, False),
                                               f"chunked attention kernels ({T} rows, {H} x {D})")
  return use_chunks[key]

def seconds(T:int, layers:list[Attention], dtype, use:bool|None, chunks:bool|None=None) -> float:
  """One pass of T rows through every layer's attention at a quarter of the context, captured, best of 3."""
  _, _, H, P, D = layers[0].cache_kv.shape
  qkv = Tensor.ones(1, T, 3 * H * D, dtype=dtype).contiguous().realize()
  pos = UOp.variable("pos", 0, P - T).bind(min(P // 4, P - T))
  return captured_seconds(lambda qkv, pos: [attend(a, qkv, pos, use, chunks).realize() for a in layers], qkv, pos)

"""Attention's kernels: a step's T queries over the KV cache, reading each cached key and value once for all rows.

Replaces the port's Attention.store and Attention.attend (formula()). tinygrad's heuristics size a kernel by its fixed
axes only (heads x rows), not by the cache's symbolic length: they split the 64-long dot product over threads and never
hold the rows in registers, so every row reads the keys and values again. Two designs:
- for CPUs, scores_kernel() and values_kernel(): a work-item per head, position (or output) and chunk of rows, the rows
  in registers while the cache streams past once;
- for GPUs (work-groups), the positions split into chunks of `length` (flash-decoding): wide_scores_kernel() (a thread
  a position, SCORE_GROUP of them a work-group), chunks_kernel() (each chunk's softmax and weighted sum, a thread per
  output of the head dimension: the values' loads coalesced), combine_kernel() (the chunks made one, a thread per
  output, which also writes the block's keys and values into the cache: the two kernels before it read them from
  c_attn's output, so that no launch of its own writes the cache);
- for CPUs that run C, fused_kernel(): the block's keys and values stored, and each row's scores, softmax and weighted
  sum, a work-item per head in one C function: six kernels become one (on a CPU a small model's pass costs more per
  kernel than per byte).
Which, and the chunks' length, is measured per device and shape at a short and a long context (choose()).
"""
from __future__ import annotations
import copy, functools, math, string
from tinygrad import Device, Tensor, UOp, dtypes
from models.gpt2 import Attention
from models.engine import internals
from models.engine.choice import CHOSEN, TINYGRAD, Way, captured, fastest, random, sources
from models.engine.device import core_splits, row_chunk, split_opts, work_groups
from models.engine.internals import AxisType, KernelInfo, Ops, Opt, OptOps, runs_c_functions
from models.engine.lanes import C_TYPES, c_format, exp_c

SPLIT = 4   # outputs of the head dimension a work-item of the weighted sum holds per row
LENGTHS = (32, 64)   # positions a chunk holds (the options measured)
SCORE_GROUP = 64     # positions a work-group of wide_scores_kernel() takes, a thread each
MEASURED_LAYERS = 4  # layers a candidate is timed over: attention's cost is its launches and latency, not bytes

def formula(attn:Attention, qkv:Tensor, start_pos:int|UOp) -> Tensor:
  """What the kernels replace: the block's keys and values into the cache (in its dtype), then
  softmax(q k^T / sqrt(D) + mask) v in qkv's dtype."""
  attn.store(qkv.cast(attn.cache_kv.dtype), start_pos)
  return Attention.attend(attn, qkv, start_pos)

def scores_kernel(out:UOp, qkv:UOp, cache:UOp, pos:UOp, threads:int=1) -> UOp:
  """out[0, h, t, s, l] = sum_d q[t, h, 4d + l] k[h, s, 4d + l] / sqrt(D) for s <= pos + t, -inf for the block's later
  positions (causal), float32: the dot product's 4 lanes, summed outside (a float32 q and the lanes stored as a vector
  let clang convert a half cache 4 keys at once, docs/engine.md); qkv (1, T, 3C) is c_attn's output, cache
  (2, 1, H, P, D). Columns from pos + T on are not written. A work-item per head, position and chunk of rows; the heads
  in `threads` parts (device.core_splits())."""
  (_, H, T, _, _), D = out.shape, cache.shape[-1]
  chunk = row_chunk(T)
  h, s, tc = UOp.range(H, 0), UOp.range(pos + T, 1), UOp.range(T // chunk, 2)
  ti, lane = UOp.range(chunk, 3, AxisType.UPCAST), UOp.range(4, 5, AxisType.UPCAST)
  d = UOp.range(D // 4, 4, AxisType.REDUCE)
  t, k = tc * chunk + ti, d * 4 + lane
  dot = (qkv[0, t, h * D + k].cast(dtypes.float32) * cache[0, 0, h, s, k].cast(dtypes.float32)).reduce(d, arg=Ops.ADD)
  score = (s <= pos + t).where(dot * (1 / math.sqrt(D)), -math.inf)
  info = KernelInfo(name=f"scores_{T}_{H}_{D}", opts_to_apply=split_opts(threads))
  return out[0, h, t, s, lane].store(score).end(h, s, tc, ti, lane).sink(arg=info)

def values_kernel(out:UOp, exps:UOp, cache:UOp, pos:UOp, threads:int=1) -> UOp:
  """out[0, t, h*D + d] = sum_s exps[0, h, t, s] * v[h, s, d] / sum_s exps[0, h, t, s] over s < pos + T: the softmax's
  division done on T x D outputs instead of T x S exponentials. A work-item per head, SPLIT outputs and chunk of
  rows; the heads in `threads` parts."""
  (_, H, T, _), D = exps.shape, cache.shape[-1]
  chunk = row_chunk(T)
  h, dc, tc = UOp.range(H, 0), UOp.range(D // SPLIT, 1), UOp.range(T // chunk, 2)
  ti, dl = UOp.range(chunk, 3, AxisType.UPCAST), UOp.range(SPLIT, 4, AxisType.UPCAST)
  s, s2 = UOp.range(pos + T, 5, AxisType.REDUCE), UOp.range(pos + T, 6, AxisType.REDUCE)
  t, d = tc * chunk + ti, dc * SPLIT + dl
  acc = (exps[0, h, t, s] * cache[1, 0, h, s, d].cast(dtypes.float32)).reduce(s, arg=Ops.ADD)
  y = acc / exps[0, h, t, s2].reduce(s2, arg=Ops.ADD)
  info = KernelInfo(name=f"values_{T}_{H}_{D}", opts_to_apply=split_opts(threads))
  return out[0, t, h * D + d].store(y.cast(out.dtype)).end(h, dc, tc, ti, dl).sink(arg=info)

f32 = lambda u: u.cast(dtypes.float32)

def block_or_cache(qkv:UOp, cache:UOp, j:int, h:UOp, s:UOp, d:UOp, pos:UOp) -> UOp:
  """Key (j 0) or value (j 1) d of head h at position s, float32: from the cache before pos, from c_attn's output
  (qkv: q, k, v) for the block's own positions; indices clamped into both buffers."""
  T, C, P = qkv.shape[1], qkv.shape[2] // 3, cache.shape[3]
  block = qkv[0, (s - pos).maximum(0).minimum(T - 1), (j + 1) * C + h * cache.shape[4] + d]
  return (s < pos).where(f32(cache[j, 0, h, s.minimum(P - 1), d]), f32(block))

def wide_scores_kernel(out:UOp, qkv:UOp, cache:UOp, pos:UOp) -> UOp:
  """out[0, h, t, s] = q[t, h] . k[h, s] / sqrt(D) for s <= pos + t, -inf after (causal), float32, for s up to
  pos + T rounded up to SCORE_GROUP (out has P + SCORE_GROUP columns); the block's keys from qkv (block_or_cache()). A
  work-group of SCORE_GROUP threads per head and positions, a thread a position, every row in registers."""
  (_, H, T, _), D, G = out.shape, cache.shape[-1], SCORE_GROUP
  h, sb = UOp.range(H, 0), UOp.range((pos + T + G - 1) // G, 1)
  sl, t, d = UOp.range(G, 2, AxisType.LOCAL), UOp.range(T, 3, AxisType.UPCAST), UOp.range(D, 4, AxisType.REDUCE)
  s = sb * G + sl
  dot = (f32(qkv[0, t, h * D + d]) * block_or_cache(qkv, cache, 0, h, s, d, pos)).reduce(d, arg=Ops.ADD)
  score = (s <= pos + t).where(dot * (1 / math.sqrt(D)), -math.inf)
  info = KernelInfo(name=f"wide_scores_{T}_{H}_{D}", opts_to_apply=(Opt(OptOps.UNROLL, 0, 4),))
  return out[0, h, t, s].store(score).end(h, sb, sl, t).sink(arg=info)

def chunks_kernel(out:UOp, scores:UOp, qkv:UOp, cache:UOp, pos:UOp, length:int) -> UOp:
  """out[0, h, t, j, e] = (o_0 .. o_D-1, m, l) over chunk j, positions j*length .. j*length + length-1 below pos + T:
  m its largest score, l = sum_s exp(score_s - m), o_d = sum_s exp(score_s - m) v[h, s, d]; a chunk of masked
  positions only has m -inf and l, o 0. A work-group per head, row and chunk, a thread per e (the values' loads
  coalesced); the block's values from qkv (block_or_cache())."""
  (_, H, T, _, E), D = out.shape, cache.shape[-1]
  S = pos + T
  h, t, j = UOp.range(H, 0), UOp.range(T, 1), UOp.range((S + length - 1) // length, 2)
  e = UOp.range(E, 3, AxisType.LOCAL)
  l1, l2, l3 = (UOp.range(length, 4 + i, AxisType.REDUCE) for i in range(3))
  score = lambda l: (j * length + l < S).where(scores[0, h, t, j * length + l], -math.inf)
  m = score(l1).reduce(l1, arg=Ops.MAX)
  shift = m.maximum(-3e38)   # a chunk masked whole (m -inf): its exponentials 0, not exp(-inf + inf)
  weight = lambda l: (j * length + l < S).where((score(l) - shift).exp(), 0.0)
  total = weight(l2).reduce(l2, arg=Ops.ADD)
  acc = (weight(l3) * block_or_cache(qkv, cache, 1, h, j * length + l3, e.minimum(D - 1), pos)).reduce(l3, arg=Ops.ADD)
  info = KernelInfo(name=f"chunks_{T}_{H}_{D}", opts_to_apply=())
  return out[0, h, t, j, e].store((e < D).where(acc, e.eq(D).where(m, total))).end(h, t, j, e).sink(arg=info)

def combine_kernel(out:UOp, parts:UOp, qkv:UOp, cache:UOp, pos:UOp, length:int) -> UOp:
  """out[0, t, h*D + d] = sum_j exp(m_j - m) o_j,d / sum_j exp(m_j - m) l_j with m = max_j m_j: the chunks' softmax
  and weighted sums made one; and the block's keys and values from qkv into the cache at pos + t. A work-group per
  head and row, a thread per output."""
  (_, H, T, _, E), C = parts.shape, qkv.shape[-1] // 3
  D = E - 2
  J = (pos + T + length - 1) // length
  h, t, d = UOp.range(H, 0), UOp.range(T, 1), UOp.range(D, 2, AxisType.LOCAL)
  j1, j2, j3 = (UOp.range(J, 3 + i, AxisType.REDUCE) for i in range(3))
  m = parts[0, h, t, j1, D].reduce(j1, arg=Ops.MAX)
  weight = lambda j: (parts[0, h, t, j, D] - m).exp()
  num = (weight(j2) * parts[0, h, t, j2, d]).reduce(j2, arg=Ops.ADD)
  den = (weight(j3) * parts[0, h, t, j3, D + 1]).reduce(j3, arg=Ops.ADD)
  stores = [out[0, t, h * D + d].store((num / den).cast(out.dtype))] + \
           [cache[i, 0, h, pos + t, d].store(qkv[0, t, (i + 1) * C + h * D + d].cast(cache.dtype)) for i in (0, 1)]
  return UOp.group(*stores).end(h, t, d).sink(arg=KernelInfo(name=f"combine_{T}_{H}_{D}", opts_to_apply=()))

def fused_kernel(out:UOp, qkv:UOp, cache:UOp, pos:UOp, threads:int=1) -> UOp:
  """formula() for a head a work-item, in C (FUSED): the block's keys and values from qkv (1, T, 3C) into the cache
  (2, 1, H, P, D) at pos, then for each row t softmax(q k^T / sqrt(D)) v over positions up to pos + t into out
  (1, T, C), float32 inside; the heads in `threads` parts. The C writes every output; its value, the head's first, is
  tinygrad's store."""
  (_, T, C3), (_, _, H, P, D) = qkv.shape, cache.shape
  h = UOp.range(H, 0)
  first = out[0, 0, h * D]
  code = string.Template(FUSED).substitute(T=T, C=C3 // 3, D=D, P=P, values=H * P * D, scale=f"{1 / math.sqrt(D)!r}f",
                                           exp=exp_c("x", "v", "vi"),
                                           out=C_TYPES[out.dtype], qkv=C_TYPES[qkv.dtype], cache=C_TYPES[cache.dtype],
                                           qkv_size=qkv.dtype.itemsize, cache_size=cache.dtype.itemsize)
  y = UOp(Ops.CUSTOMI, dtypes.float32, (first, qkv[0, 0, h * D], cache[0, 0, h, 0, 0], pos), c_format(code))
  info = KernelInfo(name=f"attention_{T}_{H}_{D}", opts_to_apply=split_opts(threads))
  return first.store(y.cast(out.dtype)).end(h).sink(arg=info)

# arrays are zeroed by loops, not `= {}`: clang calls memset for a large initializer, which a program that links no
# libc resolves to no code (a 32-row prefill's kernel jumped into unmapped memory); exp by lanes.exp_c(): its 2^-126
# below -87, beside the largest score's 1, rounds away
FUSED = """({
  typedef float v __attribute__((ext_vector_type(8), aligned(4)));
  typedef int vi __attribute__((ext_vector_type(8), aligned(4)));
  typedef $cache c __attribute__((ext_vector_type(8), aligned($cache_size)));
  typedef $qkv q8 __attribute__((ext_vector_type(8), aligned($qkv_size)));
  $out *o = ($out *)(@0); const $qkv *qkv = (const $qkv *)(@1); int pos = @3;
  $cache *keys = ($cache *)(@2), *values = keys + $values;
  for (int t = 0; t < $T; t++)
    for (int d = 0; d < $D; d++) {
      keys[(pos + t) * $D + d] = qkv[t * 3 * $C + $C + d];
      values[(pos + t) * $D + d] = qkv[t * 3 * $C + 2 * $C + d];
    }
  v q[$T][$D / 8], acc[$T][$D / 8];
  for (int t = 0; t < $T; t++)
    for (int i = 0; i < $D / 8; i++) {
      q[t][i] = __builtin_convertvector(((const q8 *)(qkv + t * 3 * $C))[i], v);
      acc[t][i] = (v)0;
    }
  float p[$T][$P + 8], m[$T], l[$T];
  int S = pos + $T;
  for (int t = 0; t < $T; t++) m[t] = -3e38f;
  for (int s = 0; s < S; s++) {
    v a[$T];
    for (int t = 0; t < $T; t++) a[t] = (v)0;
    for (int i = 0; i < $D / 8; i++) {
      v k = __builtin_convertvector(((const c *)(keys + s * $D))[i], v);
      for (int t = 0; t < $T; t++) a[t] += q[t][i] * k;
    }
    for (int t = 0; t < $T; t++) {
      float x = (((a[t][0] + a[t][4]) + (a[t][1] + a[t][5])) + ((a[t][2] + a[t][6]) + (a[t][3] + a[t][7]))) * $scale;
      p[t][s] = x;
      if (s <= pos + t && x > m[t]) m[t] = x;
    }
  }
  for (int t = 0; t < $T; t++) {
    v sum = {};
    for (int s = 0; s < S; s += 8) {
      v x = *(v *)&p[t][s] - m[t];
      $exp
      *(v *)&p[t][s] = e;
    }
    for (int s = pos + t + 1; s < S + 8; s++) p[t][s] = 0;
    for (int s = 0; s < S; s += 8) sum += *(v *)&p[t][s];
    l[t] = ((sum[0] + sum[4]) + (sum[1] + sum[5])) + ((sum[2] + sum[6]) + (sum[3] + sum[7]));
  }
  for (int s = 0; s < S; s++)
    for (int i = 0; i < $D / 8; i++) {
      v val = __builtin_convertvector(((const c *)(values + s * $D))[i], v);
      for (int t = 0; t < $T; t++) acc[t][i] += p[t][s] * val;
    }
  for (int t = 0; t < $T; t++)
    for (int i = 0; i < $D / 8; i++)
      for (int d = 0; d < 8; d++) o[t * $C + i * 8 + d] = acc[t][i][d] / l[t];
  acc[0][0][0] / l[0]; })"""

def custom(fxn, out:Tensor, *inputs:Tensor, pos:UOp) -> Tensor:
  """out after fxn(out, *inputs, pos) ran, the position (an expression of variables: a draft's later steps run at
  start_pos + 1, ...) passed beside the buffers as tinygrad's own kernels hold one."""
  return Tensor(internals.custom_call(fxn, out.uop, *(x.uop for x in inputs), pos=pos))

def position(start_pos:int|UOp, P:int, T:int) -> UOp:
  """The kernels' ranges end at a variable whatever start_pos is: a range of one position (an eager pass at 0) is no
  loop."""
  return start_pos if isinstance(start_pos, UOp) else UOp.variable("pos", 0, P - T).bind(start_pos)

def kernels(qkv:Tensor, cache:Tensor, start_pos:int|UOp) -> Tensor:
  """Attend's result (1, T, C) over a cache that holds the block by the CPU design's two kernels, tinygrad's own taking
  the scores' maximum and exponentials."""
  (B, T, C3), (_, _, H, P, _) = qkv.shape, cache.shape
  pos, threads = position(start_pos, P, T), core_splits(H, qkv.device)
  lanes = custom(functools.partial(scores_kernel, threads=threads), Tensor.empty(B, H, T, P, 4, device=qkv.device),
                 qkv, cache, pos=pos)
  scores = lanes[..., :start_pos + T, :].sum(-1)
  exps = Tensor.empty(B, H, T, P, device=qkv.device)   # another buffer: written in place, tinygrad copied it first
  exps[..., :start_pos + T].assign((scores - scores.max(-1, keepdim=True)).exp())
  out = Tensor.empty(B, T, C3 // 3, dtype=qkv.dtype, device=qkv.device)
  return custom(functools.partial(values_kernel, threads=threads), out, exps, cache, pos=pos)

def chunked(qkv:Tensor, cache:Tensor, start_pos:int|UOp, length:int) -> Tensor:
  """formula()'s result (1, T, C) by the GPU design's three kernels, chunks of length positions; the block's keys and
  values go into the cache by the last."""
  (B, T, C3), (_, _, H, P, D) = qkv.shape, cache.shape
  pos = position(start_pos, P, T)
  scores = custom(wide_scores_kernel, Tensor.empty(B, H, T, P + SCORE_GROUP, device=qkv.device), qkv, cache, pos=pos)
  parts = Tensor.empty(B, H, T, (P + length - 1) // length, D + 2, device=qkv.device)
  parts = custom(functools.partial(chunks_kernel, length=length), parts, scores, qkv, cache, pos=pos)
  out = Tensor.empty(B, T, C3 // 3, dtype=qkv.dtype, device=qkv.device)
  return custom(functools.partial(combine_kernel, length=length), out, parts, qkv, cache, pos=pos)

def fits(D:int) -> bool: return D % 4 == 0 and D % SPLIT == 0

def fused(qkv:Tensor, cache:Tensor, start_pos:int|UOp) -> Tensor:
  """formula()'s result (1, T, C) by fused_kernel(), which also writes the block's keys and values into the cache."""
  (B, T, C3), (_, _, H, P, _) = qkv.shape, cache.shape
  out = Tensor.empty(B, T, C3 // 3, dtype=qkv.dtype, device=qkv.device)
  kernel = functools.partial(fused_kernel, threads=core_splits(H, qkv.device))
  return custom(kernel, out, qkv, cache, pos=position(start_pos, P, T))

def fused_fits(D:int, dtypes_:tuple, device:str) -> bool:
  """Whether fused_kernel() runs: C, a head dimension of whole vectors of 8, dtypes it converts."""
  return D % 8 == 0 and all(d in C_TYPES for d in dtypes_) and runs_c_functions(device)

def ways(D:int, dtypes_:tuple) -> list[Way]:
  """The ways that fit a head dimension D (and the cache's and rows' dtypes) on this device, tinygrad's first: the CPU
  design ("rows"), where the device runs C the fused kernel ("fused"), and where it has work-groups the GPU design at
  each chunk length ("chunks")."""
  return [TINYGRAD] + ([Way("rows")] if fits(D) else []) + \
         ([Way("fused")] if fused_fits(D, dtypes_, Device.DEFAULT) else []) + \
         ([Way("chunks", length) for length in LENGTHS] if fits(D) and work_groups() else [])

def apply(attn:Attention, qkv:Tensor, start_pos:int|UOp, way:Way|None=None) -> Tensor:
  """formula(attn, qkv, start_pos) (the cache written, then attention) by the GPU design (Way("chunks", length)), the
  CPU design (Way("rows")), the fused kernel (Way("fused")) or tinygrad's (TINYGRAD); None: as choose() measured (else
  tinygrad's)."""
  (_, T, _), (_, _, H, P, D) = qkv.shape, attn.cache_kv.shape
  if way is None: way = CHOSEN.way("attention", (T, H, P, D, attn.cache_kv.dtype, qkv.dtype))
  if way.kernel == "chunks": return chunked(qkv, attn.cache_kv, start_pos, way.option)
  if way.kernel == "fused": return fused(qkv, attn.cache_kv, start_pos)
  if way == TINYGRAD: return formula(attn, qkv, start_pos)
  attn.store(qkv.cast(attn.cache_kv.dtype), start_pos)
  return kernels(qkv, attn.cache_kv, start_pos)

def choose(T:int, layers:list[Attention], qkv_dtype) -> Way:
  """The way a pass of T rows (c_attn's output in qkv_dtype) attends fastest, of those that compute what tinygrad's
  does, the cache they write included: each captured and timed over some of these layers, on random caches of their own
  (fresh for each way: the model's stay as they are) and random rows, at a short and a long context (positions P/16
  and 3P/4), its outputs at each context and the caches after it compared; once per machine; the GPU design's second
  chunk length only while its first is close."""
  (_, _, H, P, D), dtype = layers[0].cache_kv.shape, layers[0].cache_kv.dtype
  key = (T, H, P, D, dtype, qkv_dtype)
  if CHOSEN.needs("attention", key):
    qkv = random(1, T, 3 * H * D, dtype=qkv_dtype)
    contexts = [UOp.variable("pos", 0, P - T).bind(min(p, P - T)) for p in (P // 16, 3 * P // 4)]
    def run(way):
      shells = [copy.copy(a) for a in layers[:MEASURED_LAYERS]]
      for i, a in enumerate(shells): a.cache_kv = random(*a.cache_kv.shape, dtype=dtype, seed=i)
      # one capture for both contexts: the position is a bound variable
      return captured(lambda qkv, p: [apply(a, qkv, p, way) for a in shells], [(qkv, p) for p in contexts],
                      timed=len(contexts), after=lambda: [a.cache_kv.numpy() for a in shells])
    candidates = {w: functools.partial(run, w) for w in ways(D, (dtype, qkv_dtype))}
    CHOSEN.measured["attention"][key] = fastest("spec_attention", (key, sources(__name__)), candidates,
                                                f"attention kernels ({T} rows, {H} x {D})", dtype,
                                                family=lambda w: w.kernel if w.kernel == "chunks" else None, length=P)
  return CHOSEN.way("attention", key)

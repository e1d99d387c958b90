"""Attention of a pass's T tokens over the KV cache, as tinygrad's broadcasts or as two kernels of its own that read each
cached key and value once for all T rows.

tinygrad's heuristics size a kernel by its fixed axes only (heads x rows), not by the cache's symbolic length: they split
the 64-long dot product over threads and never hold the rows in registers, so every row reads the keys and values again
and a verify pass's attention grows with its rows. The kernels here hold a chunk of rows in registers while the cache
streams past once. gpt2-xl's 48 layers, ms, broadcasts -> kernels (pocl; tinygrad's CPU backend alike):
  position 100: 1 token 13.3 -> 10.5, 5 tokens 37.4 -> 21.2, 9 tokens 60.7 -> 32.6
  position 500: 1 token 42.6 -> 35.2, 5 tokens 156.3 -> 76.4, 9 tokens 263.4 -> 115.4
Which is faster is measured per device and shape (choose()), as for the linear layers.
"""
from __future__ import annotations
import inspect, math
from tinygrad import Tensor, TinyJit, UOp, Context, dtypes
from tinygrad.uop.ops import AxisType, KernelInfo, Ops
from models.linear import best_seconds, faster, rows

# the head dimension's outputs a work-item of the weighted sum holds per row: 8 and 16 were as fast (gpt2-xl, 5 and 9
# tokens), but tinygrad prints a kernel's cost estimate, an expression over every unrolled operation, to key its runtime
# cache: with emulated half (pocl) a chunk of 8 rows x 8 outputs took 30 s to print, x 4 outputs 6 s
SPLIT = 4
# (T, heads, positions, head_dim, dtype) -> run the kernels here: what choose() measured on this device
use_kernels: dict[tuple, bool] = {}

def scores_kernel(out:UOp, qkv:UOp, cache:UOp, pos:UOp) -> UOp:
  """out[0, h, t, s] = q[t, h] . k[h, s] / sqrt(D) for s <= pos + t, -inf for the later positions of the block (causal),
  float32; qkv (1, T, 3C) is c_attn's output, cache (2, 1, H, P, D). Columns from pos + T on are not written. A work-item
  per head, position and chunk of rows; the 64-long dot product in 4 lanes."""
  (_, H, T, _), D = out.shape, cache.shape[-1]
  chunk = rows(T)
  h, s, tc = UOp.range(H, 0), UOp.range(pos + T, 1), UOp.range(T // chunk, 2)
  ti, d, lane = UOp.range(chunk, 3, AxisType.UPCAST), UOp.range(D // 4, 4, AxisType.REDUCE), UOp.range(4, 5, AxisType.UPCAST)
  t, k = tc * chunk + ti, d * 4 + lane
  dot = (qkv[0, t, h * D + k].cast(dtypes.float32) * cache[0, 0, h, s, k].cast(dtypes.float32)).reduce(d, arg=Ops.ADD).reduce(lane, arg=Ops.ADD)
  score = (s <= pos + t).where(dot * (1 / math.sqrt(D)), -math.inf)
  return out[0, h, t, s].store(score).end(h, s, tc, ti).sink(arg=KernelInfo(name=f"scores_{T}_{H}_{D}", opts_to_apply=()))

def values_kernel(out:UOp, exps:UOp, cache:UOp, pos:UOp) -> UOp:
  """out[0, t, h*D + d] = sum_s exps[0, h, t, s] * v[h, s, d] / sum_s exps[0, h, t, s] over s < pos + T: the softmax's
  normalization done here, on T x D outputs instead of T x S exponentials. A work-item per head, SPLIT outputs of
  the head dimension and chunk of rows."""
  (_, H, T, _), D = exps.shape, cache.shape[-1]
  chunk = rows(T)
  h, dc, tc = UOp.range(H, 0), UOp.range(D // SPLIT, 1), UOp.range(T // chunk, 2)
  ti, dl = UOp.range(chunk, 3, AxisType.UPCAST), UOp.range(SPLIT, 4, AxisType.UPCAST)
  s, s2 = UOp.range(pos + T, 5, AxisType.REDUCE), UOp.range(pos + T, 6, AxisType.REDUCE)
  t, d = tc * chunk + ti, dc * SPLIT + dl
  acc = (exps[0, h, t, s] * cache[1, 0, h, s, d].cast(dtypes.float32)).reduce(s, arg=Ops.ADD)
  y = acc / exps[0, h, t, s2].reduce(s2, arg=Ops.ADD)
  return out[0, t, h * D + d].store(y.cast(out.dtype)).end(h, dc, tc, ti, dl).sink(arg=KernelInfo(name=f"values_{T}_{H}_{D}", opts_to_apply=()))

def custom(fxn, out:Tensor, *inputs:Tensor, pos:UOp) -> Tensor:
  """out after fxn(out, *inputs, pos) ran: Tensor.custom_kernel, which passes buffers only, with the position beside them,
  an expression of variables (a draft's later steps run at start_pos + 1, ...). Each variable, bound (AFTER(variable,
  STORE(variable, value))) or not, enters the kernel as tinygrad's own kernels hold one: a parameter found by its name."""
  buffers = [out.uop, *(x.uop for x in inputs)]
  params = [UOp.placeholder_like(u, slot=i) for i, u in enumerate(buffers)]
  bound = [u for u in pos.toposort() if u.is_bound_var]
  variables = bound + [u for u in pos.toposort() if u.is_variable and all(b.src[0] is not u for b in bound)]
  names = {u: (u.src[0] if u.op is Ops.AFTER else u).replace(op=Ops.PARAM) for u in variables}
  return Tensor(out.uop.after(fxn(*params, pos.substitute(names)).call(*buffers, *variables)))

def attend(qkv:Tensor, cache:Tensor, start_pos:int|UOp, kernels:bool|None=None) -> Tensor:
  """qkv (1, T, 3C), c_attn's output for positions start_pos .. start_pos+T-1, whose keys and values are in cache
  (2, 1, H, P, D) -> causal attention (1, T, C), in qkv's dtype; scores and softmax in float32. kernels: the kernels
  here or tinygrad's broadcasts; None: as choose() measured (the broadcasts if it never did)."""
  (B, T, C3), (_, _, H, P, D) = qkv.shape, cache.shape
  if kernels is None: kernels = use_kernels.get((T, H, P, D, qkv.dtype), False)
  S = start_pos + T
  if kernels:
    # the kernels' ranges end at a variable whatever start_pos is: a range of one position (an eager pass at 0) is no loop
    pos = start_pos if isinstance(start_pos, UOp) else UOp.variable("pos", 0, P - T).bind(start_pos)
    scores = custom(scores_kernel, Tensor.empty(B, H, T, P, device=qkv.device), qkv, cache, pos=pos)[..., :S]
    exps = Tensor.empty(B, H, T, P, device=qkv.device)   # another buffer: written in place, tinygrad copied it first
    exps[..., :S].assign((scores - scores.max(-1, keepdim=True)).exp())
    return custom(values_kernel, Tensor.empty(B, T, C3 // 3, dtype=qkv.dtype, device=qkv.device), exps, cache, pos=pos)
  q = qkv.reshape(B, T, 3, H, D)[:, :, 0].transpose(1, 2)          # (B, H, T, D)
  keys, values = cache[0, :, :, :S], cache[1, :, :, :S]             # (B, H, S, D)
  # Written as broadcasts, not matmuls, with the weighted sum over (head, token) rows merged into one axis: the length S
  # is symbolic, and tinygrad indexes a transposed view of the cache, or a buffer of S columns whose rows it loops over
  # as two axes, through a division by S per element (gpt2, 5 tokens at position 700, default kernels: 62 ms, now 34)
  # scores and softmax in float32 whatever the dtype: precision, and tinygrad 0.14 miscompiles a max over emulated half
  scores = (q.unsqueeze(-2) * keys.unsqueeze(-3)).sum(-1, dtype=dtypes.float32) / math.sqrt(D)  # (B, H, T, S)
  # causal: a token sees the cache and the block up to itself; only the block's own T x T corner is masked (a triu
  # over all S columns builds an arange of that symbolic length: a kernel of S^2 steps a pass)
  if T > 1: scores = scores + Tensor.full((1, 1, T, T), -math.inf).triu(1).pad((None, None, None, (start_pos, 0)))
  probs = scores.softmax(-1).cast(qkv.dtype)
  S = probs.shape[-1]   # start_pos + T as tinygrad simplified it
  values = values.unsqueeze(2).expand(B, H, T, S, D).reshape(B, H * T, S, D)
  y = (probs.reshape(B, H * T, S).unsqueeze(-1) * values).sum(-2).reshape(B, H, T, D)
  return y.transpose(1, 2).reshape(B, T, C3 // 3)

def choose(T:int, caches:list[Tensor], dtype) -> bool:
  """Whether a pass of T rows attends faster through the kernels here than through tinygrad's broadcasts, over these
  caches (a model's layers): both timed (seconds()), and cached on disk like linear.choose(); once per machine."""
  _, _, H, P, D = caches[0].shape
  key = (T, H, P, D, dtype)
  if key not in use_kernels:
    code = "".join(inspect.getsource(f) for f in (scores_kernel, values_kernel, attend, rows)) + repr(SPLIT)
    use_kernels[key] = D % 4 == 0 and D % SPLIT == 0 and faster("spec_attention", (key, code), lambda: seconds(T, caches, dtype, True),
                                                 lambda: seconds(T, caches, dtype, False))
  return use_kernels[key]

def seconds(T:int, caches:list[Tensor], dtype, kernels:bool) -> float:
  """One pass of T rows over every cache at a quarter of its length, captured, best of 3."""
  _, _, H, P, D = caches[0].shape
  qkv, pos = Tensor.ones(1, T, 3 * H * D, dtype=dtype).contiguous().realize(), UOp.variable("pos", 0, P - T).bind(min(P // 4, P - T))
  step = TinyJit(lambda qkv, pos: [attend(qkv, cache, pos, kernels).realize() for cache in caches])
  with Context(BEAM=0):
    for _ in range(2): step(qkv, pos)       # a TinyJit captures on its second call
  return best_seconds(lambda: step(qkv, pos))

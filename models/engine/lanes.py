"""The lanes kernel: a linear layer over a step's few rows at the cost of one row.

Replaces x @ w.T (formula()). A step pass multiplies T <= 16 rows by every weight matrix: memory-bound when T is 1,
and it should stay so for the K+1 rows of a verify pass. tinygrad's own kernels for a few rows read a weight once per
row or run out of registers on a CPU; this kernel holds every row, a few outputs and their partial sums (lanes) in
registers while the weights stream past once, in one of a few layouts (LAYOUTS). Whether it is faster, and in which
layout, is measured per shape, width and dtype on the device (linear.py).
"""
from __future__ import annotations
import functools, math, re, string
from tinygrad import Tensor, UOp, dtypes
from models.engine.device import core_splits, row_chunk, split_opts
from models.engine.internals import AddrSpace, AxisType, KernelInfo, Ops, Opt, OptOps, runs_c_functions

# a layout: (outputs at a time, partial sums per output, groups of those at a time, bytes of the weight prefetched
# ahead): "lanes" reads 8 rows of the weight at once, "four" 4, "row" and "wide" one after another, "wide" into four
# float4 sums that do not wait on each other. clang's code for each is fastest for some shapes and widths, by up to 2.5x
# (docs/engine.md), so linear.choose() measures them; two groups at a time run as fast as eight and lower in a third of
# tinygrad's time. "row_ahead" and "wide_ahead" first ask for the weight's row AHEAD bytes on (C only): a core
# streaming a weight from memory waits on it less (docs/engine.md). "vectors" (C only) holds a chunk of rows' sums in
# C's vectors of 8 floats, two a row, "vectors_wide" in vectors of 16 (vectors_kernel(); their tuples say only that C
# is a multiple of 16 and 32): where a CPU has 512-bit registers the wide one converts and multiplies 16 halves an
# instruction; with float32 weights, which convert nothing, passes ran up to 1.3x slower with it (linear.ways())
AHEAD = 4096
LAYOUTS = {"lanes": (8, 4, 2, 0), "four": (4, 4, 4, 0), "row": (1, 8, 2, 0), "wide": (1, 16, 2, 0),
           "row_ahead": (1, 8, 2, AHEAD), "wide_ahead": (1, 16, 2, AHEAD), "vectors": (1, 1, 16, 0),
           "vectors_wide": (1, 1, 32, 0)}
VECTORS = {"vectors": 8, "vectors_wide": 16}   # the vectors layouts' width

def formula(x:Tensor, w:Tensor, dtype=None) -> Tensor:
  """What the kernel replaces: x (..., C) @ w (N, C).T in dtype (default x's), accumulated in float32."""
  return x.matmul(w.T, dtype=dtypes.float32).cast(dtype or x.dtype)

def lanes_kernel(out:UOp, x:UOp, w:UOp, threads:int=1, layout:str="lanes") -> UOp:
  """out[t, n, l] = sum_g x[t, g*L + l] * w[n, g*L + l], float32; x (T, C), w (N, C), out (T, N, L), L partial sums
  (lanes) per output. Rows come in chunks (device.row_chunk()). The options are the layout's (LAYOUTS): so many outputs
  and groups at a time, the outputs split into `threads` parts, each a core's (tinygrad's heuristics give a kernel
  with fixed options none)."""
  (T, N, L), G = out.shape, x.shape[1] // out.shape[2]
  outputs, _, groups, ahead = LAYOUTS[layout]
  chunk = row_chunk(T)
  n, tc = UOp.range(N, 0), UOp.range(T // chunk, 1)
  if ahead: x = x.after(prefetch(w, n, ahead))   # before the row's sums: they read x
  ti, lane = UOp.range(chunk, 2, AxisType.UPCAST), UOp.range(L, 3, AxisType.UPCAST)
  g = UOp.range(G, 4, AxisType.REDUCE)
  t, k = tc * chunk + ti, g * L + lane
  acc = (x[t, k].cast(dtypes.float32) * w[n, k].cast(dtypes.float32)).reduce(g, arg=Ops.ADD)
  opts = tuple(Opt(op, 0, amount) for op, amount in ((OptOps.UPCAST, outputs), (OptOps.UNROLL, groups)) if amount > 1)
  name = "lanes" if layout == "lanes" else f"lanes_{layout}"
  info = KernelInfo(name=f"{name}_{T}_{N}_{x.shape[1]}", opts_to_apply=opts + split_opts(threads))
  return out[t, n, lane].store(acc).end(tc, ti, n, lane).sink(arg=info)

def vectors_kernel(out:UOp, x:UOp, w:UOp, *rest:UOp, bias:bool=False, gelu:bool=False, residual:bool=False,
                   threads:int=1, layout:str="vectors") -> UOp:
  """out[..., n] = sum_k x[t, k] * w[n, k] (+ bias[n]), then GELU of it or + residual[..., n], in out's dtype, float32
  inside, the bias and the residual (rest, in that order) where given; x (T, C), w (N, C), out and residual (..., N),
  T rows: for each output, a chunk of rows (device.row_chunk()) by the C of dot() in the layout's width (C only:
  tinygrad's CPU renderer stores at most 4 floats at once, and clang then vectorizes the lanes kernel's sums 4 wide,
  the weight's halves converted 4 at a time)."""
  (T, C), N = x.shape, out.shape[-1]
  out, chunk = out.reshape(T, N), row_chunk(T)
  n, tc = UOp.range(N, 0), UOp.range(T // chunk, 1)
  first = out[tc * chunk, n]
  b, r = (rest[0] if bias else None), (rest[-1].reshape(T, N) if residual else None)
  # the output stands in for a bias or residual not given: the C reads {3} and {4} only where they are
  srcs = (first, x[tc * chunk, 0], w[n, 0], first if b is None else b[n], first if r is None else r[tc * chunk, n])
  code = dot(chunk, N, C, w.dtype, out.dtype, *(None if u is None else u.dtype for u in (b, r)), gelu=gelu, x=x.dtype,
             width=VECTORS[layout])
  info = KernelInfo(name=f"lanes_{layout}_{T}_{N}_{C}", opts_to_apply=split_opts(threads))
  return first.store(UOp(Ops.CUSTOMI, dtypes.float32, srcs, code).cast(out.dtype)).end(tc, n).sink(arg=info)

def dot(rows:int, N:int, C:int, dtype, out=dtypes.float32, bias=None, residual=None, gelu:bool=False,
        x=dtypes.float32, width:int=8) -> str:
  """C's statement expression for `rows` rows of x ({1}, in dtype x) times one row of w ({2}): both `width` elements
  at a time into float32 vectors, two vectors of sums a row; each row's output, its sum plus the bias ({3}) and the
  residual ({4}, rows N apart) where their dtypes are given, in the order and at the roundings of the formula's kernels
  in dtype out, or GELU(sum + bias) in float32 as gelu_kernel() computes it, the rows' at once in a vector;
  the rows after the first written to out ({0}, rows N apart), the first row's the expression's value."""
  b = None if bias is None else f"(float)*(const {C_TYPES[bias]} *)(@3)"
  if gelu: value = "d" if b is None else f"d + {b}"   # GELU's input, in float32 (gelu_rows())
  else:
    value = "d" if out == dtypes.float32 else f"(float)({C_TYPES[out]})d"   # the sums cast to the output's dtype
    if residual is not None: value = f"(float)((const {C_TYPES[residual]} *)(@4))[t * $N] + {value}"
    if b is not None: value = f"({value}) + {b}"
  code = DOT.replace("$value", value).replace("$gelu", gelu_rows(rows) if gelu else "")
  code = string.Template(code).substitute(rows=rows, N=N, vectors=C // width, width=width, fold=fold(width),
                                          weight=C_TYPES[dtype], size=dtype.itemsize, out=C_TYPES[out],
                                          row=C_TYPES[x], row_size=x.itemsize)
  return c_format(code)

def fold(width:int) -> str:
  """C statements that set the float d to the sum of the vector r's lanes: its halves added, then those halves' and so
  on, a vector instruction a level (lane by lane, clang's sum took as many instructions as a row's multiply-adds:
  docs/engine.md)."""
  code, vector = [], "r"
  while width > 2:
    half, width = width // 2, width // 2
    lo, hi = ", ".join(map(str, range(half))), ", ".join(map(str, range(half, 2 * half)))
    code.append(f"typedef float f{half} __attribute__((ext_vector_type({half}))); "
                f"f{half} r{half} = __builtin_shufflevector({vector}, {vector}, {lo}) + "
                f"__builtin_shufflevector({vector}, {vector}, {hi});")
    vector = f"r{half}"
  return "\n    ".join(code + [f"float d = {vector}[0] + {vector}[1];"])

def c_format(code:str) -> str:
  """C whose sources are written @0, @1, ... as the format string of a CUSTOMI UOp: C's braces doubled, @i as {i}."""
  return re.sub(r"@(\d)", r"{\1}", code.replace("{", "{{").replace("}", "}}"))

C_TYPES = {dtypes.float32: "float", dtypes.float16: "__fp16"}   # the dtypes the C of the engine's kernels reads
DOT = """({
  typedef float v __attribute__((ext_vector_type($width), aligned(4)));
  typedef $weight h __attribute__((ext_vector_type($width), aligned($size)));
  typedef $row hr __attribute__((ext_vector_type($width), aligned($row_size)));
  const h *w = (const h *)(@2); const hr *x = (const hr *)(@1); $out *o = ($out *)(@0);
  v a[$rows][2] = {};
  for (int k = 0; k < $vectors; k += 2)
    for (int u = 0; u < 2; u++) {
      v wk = __builtin_convertvector(w[k + u], v);
      for (int t = 0; t < $rows; t++) a[t][u] += wk * __builtin_convertvector(x[t * $vectors + k + u], v);
    }
  float s[$rows];
  for (int t = 0; t < $rows; t++) {
    v r = a[t][0] + a[t][1];
    $fold
    s[t] = $value;
  }
  $gelu
  for (int t = 1; t < $rows; t++) o[t * $N] = s[t];
  s[0]; })"""

def exp_c(x:str, f:str="float", i:str="int") -> str:
  """C statements that set e (of type f: float, or a vector of them whose ints are i) to exp(x) for x <= 0, as Cephes'
  expf: x = n ln2 + r, |r| <= ln2 / 2, e^r by a polynomial, 2^n in the exponent's bits (tinygrad's CPU programs link no
  libm); below -87 (under float32's smallest normal) it is 2^-126, not 0."""
  to_int = "(int)n" if f == "float" else f"__builtin_convertvector(n, {i})"
  return f"""{f} x_ = {x} < -87.0f ? ({f})-87.0f : {x};
    {f} n = (x_ * 1.44269504f + 12582912.0f) - 12582912.0f, r = x_ - n * 0.693359375f + n * 2.12194440e-4f;
    {f} e = ((((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) * r
              + 1.6666665459e-1f) * r + 5.0000001201e-1f) * (r * r) + r + 1.0f);
    union {{ {i} i; {f} f; }} scale = {{({to_int} + 127) << 23}};
    e *= scale.f;"""

# GELU(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), tanh(y) = (1 - e) / (1 + e) with e = exp(-2|y|), the sign y's
def gelu_c(f:str="float", i:str="int") -> str:
  """C statements that set g (of type f: float, or a vector of them whose ints are i) to GELU(g)."""
  return f"""{f} y = 0.7978845608f * (g + 0.044715f * g * g * g), t = y < 0 ? 2 * y : -2 * y;
    {exp_c("t", f, i)}
    {f} th = (1.0f - e) / (1.0f + e);
    g = 0.5f * g * (1.0f + (y < 0 ? -th : th));"""

def gelu_rows(rows:int) -> str:
  """C that applies GELU to s[0..rows), as one vector of the rows (a power of two wide): a verify pass's rows cost
  what one does."""
  if rows == 1: return f"{{ float g = s[0]; {gelu_c()} s[0] = g; }}"
  width = 1 << (rows - 1).bit_length()
  return f"""{{ typedef float gv __attribute__((ext_vector_type({width})));
    typedef int gi __attribute__((ext_vector_type({width})));
    gv g = {{}};
    for (int t = 0; t < {rows}; t++) g[t] = s[t];
    {gelu_c("gv", "gi")}
    for (int t = 0; t < {rows}; t++) s[t] = g[t]; }}"""

def prefetch(w:UOp, n:UOp, ahead:int) -> UOp:
  """A statement that asks for the row of w (N, C) about `ahead` bytes after row n (the next at least, the last at the
  end), each of its cache lines: a store of 0 into a register, clang's __builtin_prefetch calls in its value (a
  kernel's statements are stores; the register is never read)."""
  (N, C), size = w.shape, w.dtype.itemsize
  row = (n + max(1, ahead // (C * size))).minimum(N - 1)
  calls = "".join(f"__builtin_prefetch({{0}}+{i}), " for i in range(0, C, 64 // size))
  register = UOp.placeholder((1,), dtypes.int32, slot=99, addrspace=AddrSpace.REG)   # the sums' registers count from 0
  return register[0].store(UOp(Ops.CUSTOMI, dtypes.int32, (w[row, 0],), f"({calls}0)"))

def fits(N:int, C:int, layout:str="lanes", device:str|None=None) -> bool:
  """Whether the layout computes N outputs of C inputs (on the device, where given: a prefetch and the vectors layout
  need C)."""
  outputs, lanes, groups, ahead = LAYOUTS[layout]
  if (ahead or layout in VECTORS) and device is not None and not runs_c_functions(device): return False
  return N % outputs == 0 and C % (groups * lanes) == 0

def gelu_kernel(out:UOp, part:UOp, *bias:UOp) -> UOp:
  """out[t, n] = GELU(sum_l part[t, n, l] + bias[n]), float32 inside: the lanes kernel's sums finished with the bias
  (where given) and GELU. No options: a plain loop over a row's outputs, which clang vectorizes whole; tinygrad's own
  kernel for it, upcast by 4, renders GELU's exp as scalar code (docs/engine.md)."""
  (T, N), L = out.shape, part.shape[2]
  t, n = UOp.range(T, 0), UOp.range(N, 1)
  y = part[t, n, l := UOp.range(L, 2, AxisType.REDUCE)].reduce(l, arg=Ops.ADD)
  if bias: y = y + bias[0][n].cast(dtypes.float32)
  info = KernelInfo(name=f"gelu_{T}_{N}", opts_to_apply=())
  return out[t, n].store(y.gelu().cast(out.dtype)).end(t, n).sink(arg=info)

def linear(x:Tensor, w:Tensor, dtype=None, layout:str="lanes", b:Tensor|None=None, gelu:bool=False,
           residual:Tensor|None=None) -> Tensor:
  """formula(x, w, dtype) (+ b, then GELU, then + residual, where given) by the lanes kernel in this layout."""
  *B, C = x.shape
  (T, N), (outputs, lanes, _, _) = (math.prod(B), w.shape[0]), LAYOUTS[layout]
  rows = x.reshape(T, C)
  if layout in VECTORS:   # one lane, in the layer's shape: a reshape of a kernel's output is copied where it is made
    # the rows in their dtype, converted a vector at a time (dot()); the bias, then GELU or the residual, inside
    out = Tensor.empty(*B, N, dtype=dtype or x.dtype, device=x.device)   # contiguous (the lm_head's logits)
    inside = None if gelu else residual
    kernel = functools.partial(vectors_kernel, bias=b is not None, gelu=gelu, residual=inside is not None,
                               threads=core_splits(N, x.device), layout=layout)
    y = out.custom_kernel(rows, w, *[t for t in (b, inside) if t is not None], fxn=kernel)[0]
    return y if residual is None or inside is not None else residual + y
  part = Tensor.empty(T, N, lanes, dtype=dtypes.float32, device=x.device)
  kernel = functools.partial(lanes_kernel, threads=core_splits(N // outputs, x.device), layout=layout)
  # float32 rows: where both operands are half, clang converts and multiplies one element at a time (docs/engine.md)
  part = part.custom_kernel(rows.float(), w, fxn=kernel)[0]
  # the lanes summed outside, fused with what follows (bias, residual): inside, compilers kept them on the stack
  sums = part.sum(-1).reshape(*B, N)
  if gelu:
    y = Tensor.empty(T, N, dtype=dtype or x.dtype, device=x.device)
    return y.custom_kernel(part, *([] if b is None else [b]), fxn=gelu_kernel)[0].reshape(*B, N)
  y = sums.cast(dtype or x.dtype)
  y = y if b is None else y + b
  return y if residual is None else residual + y

"""GPT-2 on tinygrad: Hugging Face checkpoints, a preallocated KV cache with rollback, JIT-compiled forward passes.

The model returns logits for every position it is fed and never samples: the speculative sampler needs the
K+1 distributions of one verify pass. The KV cache holds what the model has seen up to the position the
caller passes next; rolling back r tokens is calling with a start position r smaller (nothing is copied or
recomputed: the stale entries are overwritten before anything reads them).
"""
from __future__ import annotations
import contextlib, dataclasses, functools, hashlib, importlib.metadata, inspect, json, math, os, pathlib, pickle, sys, threading, time, weakref
from dataclasses import dataclass
from tinygrad import Tensor, TinyJit, UOp, Device, Context, dtypes, nn
from tinygrad.dtype import DType
from models import attention, hub, norm, replay
from models.linear import Linear, choose, half_pays, linear
from tinygrad.nn.state import safe_load, get_state_dict, load_state_dict
from tinygrad.helpers import CACHEDB, CACHELEVEL, ContextVar
from tinygrad.uop.ops import Ops

@dataclass(frozen=True)
class GPT2Config:
  n_layer: int
  n_head: int
  n_embd: int
  vocab_size: int = 50257
  n_positions: int = 1024
  layer_norm_epsilon: float = 1e-5

  @property
  def padded_vocab(self) -> int: return vocab_width(self.vocab_size)   # the lm_head's rows: see GPT2.forward

  @property
  def n_params(self) -> int:  # with the lm_head tied to wte, as in the released checkpoints
    C, L = self.n_embd, self.n_layer
    return self.vocab_size*C + self.n_positions*C + L*(12*C*C + 13*C) + 2*C

# The released OpenAI checkpoints, on the Hugging Face hub as openai-community/<name>: their shapes for --dummy-weights
# and documentation (a download builds the model from its config.json). Parameter counts from GPT2Config.n_params.
CONFIGS = {
  "gpt2":        GPT2Config(n_layer=12, n_head=12, n_embd=768),   # 124M
  "gpt2-medium": GPT2Config(n_layer=24, n_head=16, n_embd=1024),  # 355M
  "gpt2-large":  GPT2Config(n_layer=36, n_head=20, n_embd=1280),  # 774M
  "gpt2-xl":     GPT2Config(n_layer=48, n_head=25, n_embd=1600),  # 1558M
}
HUB_ORG = "openai-community"
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")  # stored (in, out)
EOT = 50256  # <|endoftext|>

def vocab_width(V:int) -> int:
  """V rounded up to a multiple of 64 (nanoGPT's 50304 for GPT-2): tinygrad splits an axis over threads and registers only
  by its factors, and 50257 = 29 x 1733. The lm_head's rows, and the width of spec.py's distributions."""
  return V + -V % 64

class CheckpointError(Exception):
  """A model that cannot be loaded: the message names the file (or model name) and the problem."""

class Attention:
  def __init__(self, cfg:GPT2Config, dtype):
    self.c_attn, self.c_proj = Linear(cfg.n_embd, 3*cfg.n_embd), Linear(cfg.n_embd, cfg.n_embd)
    self.n_head, self.head_dim = cfg.n_head, cfg.n_embd // cfg.n_head
    # one preallocated cache per layer and per model instance: (k|v, batch, head, position, head_dim)
    self.cache_kv = Tensor.zeros(2, 1, self.n_head, cfg.n_positions, self.head_dim, dtype=dtype).contiguous().realize()

  def __call__(self, x:Tensor, start_pos:int|UOp) -> Tensor:
    B, T, C = x.shape
    qkv = self.c_attn(x)                                                                        # (B, T, 3C)
    k, v = qkv.reshape(B, T, 3, self.n_head, self.head_dim)[:, :, 1:].permute(2, 0, 3, 1, 4)    # 2 x (B, H, T, D)
    self.cache_kv[:, :, :, start_pos:start_pos+T].assign(Tensor.stack(k, v))
    return self.c_proj(attention.attend(qkv, self.cache_kv, start_pos))

class MLP:
  def __init__(self, cfg:GPT2Config):
    self.c_fc, self.c_proj = Linear(cfg.n_embd, 4*cfg.n_embd), Linear(4*cfg.n_embd, cfg.n_embd)

  def __call__(self, x:Tensor) -> Tensor: return self.c_proj(self.c_fc(x).gelu())  # tanh GELU, GPT-2's gelu_new

class Block:
  def __init__(self, cfg:GPT2Config, dtype):
    self.ln_1, self.ln_2 = norm.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon), norm.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
    self.attn, self.mlp = Attention(cfg, dtype), MLP(cfg)

  def __call__(self, x:Tensor, start_pos:int|UOp) -> Tensor:
    x = x + self.attn(self.ln_1(x), start_pos)
    return (x + self.mlp(self.ln_2(x))).contiguous()

class GPT2:
  def __init__(self, cfg:GPT2Config, dtype:DType=dtypes.float32, search:int=0):
    self.cfg, self.dtype, self.search = cfg, dtype, search
    # wte has padded_vocab rows; the ones past vocab_size are never looked up and their logits are dropped
    self.wte, self.wpe = nn.Embedding(cfg.padded_vocab, cfg.n_embd), nn.Embedding(cfg.n_positions, cfg.n_embd)
    self.h = [Block(cfg, self.dtype) for _ in range(cfg.n_layer)]
    self.ln_f = norm.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
    for t in get_state_dict(self).values(): t.replace(t.cast(dtype))  # weights, and so activations, in dtype
    self.positions = UOp.variable("start_pos", 0, cfg.n_positions - 1)
    # JIT-compiled functions owned by this instance (a TinyJit on the class would be shared by draft and target)
    self.jits: dict[tuple, Step] = {}
    replay.install(Device.DEFAULT)   # captured steps replay their kernels without tinygrad's per-kernel dispatch

  def jit(self, fn, T:int, step:bool=True, **static) -> Step:
    """fn JIT-compiled for this instance, once per input width T and static arguments (a TinyJit freezes them), and
    stored for later processes (step_file). A step of a generation (step, at most STEP_WIDTH tokens) has the kernels of its
    linear layers chosen by measurement first (choose_kernels), and its kernels searched when self.search > 0; a prefill
    pass (step=False) runs once per prompt, on tinygrad's default kernels."""
    key = (fn.__name__, T, *sorted(static.items())) + (() if step else ("prefill",))
    if key not in self.jits:
      step = step and T <= STEP_WIDTH
      if step: self.choose_kernels({1, T})   # a draft's step runs T tokens, then one at a time
      what = f"{fn.__name__} of {T} token{'s' * (T > 1)} ({self.cfg.n_layer} layers x {self.cfg.n_embd})"
      self.jits[key] = Step(functools.partial(fn, **static), self.search if step else 0, what, self, step_file(self, fn, key))
    return self.jits[key]

  def choose_kernels(self, widths) -> None:
    """For passes of these widths, measure once per machine which kernels compute each linear layer faster
    (models/linear.py: the lanes kernel or tinygrad's matmul), attention (models/attention.py: its kernels or tinygrad's
    broadcasts) and the layer norms (models/norm.py: its kernel or tinygrad's); every later pass of those widths runs them."""
    layers = zip(*((b.attn.c_attn, b.attn.c_proj, b.mlp.c_fc, b.mlp.c_proj) for b in self.h))   # each role, every layer
    groups = [[layer.weight for layer in role] for role in layers] + [[self.wte.weight]]
    with notice(f"choosing the kernels of {self.cfg.n_layer} layers x {self.cfg.n_embd} for passes of {sorted(widths)} tokens"):
      for T in widths:
        for weights in groups: choose(T, weights, self.dtype)
        attention.choose(T, [b.attn.cache_kv for b in self.h], self.dtype)
        norm.choose(T, [ln for b in self.h for ln in (b.ln_1, b.ln_2)] + [self.ln_f], self.dtype)

  def forward(self, tokens:Tensor, start_pos:int|UOp) -> Tensor:
    """tokens (1, T) at positions start_pos .. start_pos+T-1 -> float32 logits (T, vocab) for the token after each.
    Weights, activations and the KV cache are in self.dtype; the lm_head accumulates into float32 logits."""
    T = tokens.shape[1]
    # the lookup indexes the vocabulary's rows only: over all padded_vocab rows tinygrad splits it into a slow reduce
    x = self.wte.weight[:self.cfg.vocab_size][tokens] + self.wpe.weight.shrink(((start_pos, start_pos+T), None))  # (1, T, C)
    for block in self.h: x = block(x, start_pos)
    # lm_head tied to wte, over padded_vocab rows: tinygrad's heuristics split a matmul's output axis (into registers
    # and threads) only by factors that divide it, and 50257 = 29 x 1733 (unpadded, gpt2-xl's lm_head took 85 ms, padded 36)
    logits = linear(self.ln_f(x)[0], self.wte.weight, dtype=dtypes.float32).contiguous()    # (T, padded_vocab)
    return logits[:, :self.cfg.vocab_size]                                                     # (T, vocab)

  def __call__(self, tokens:Tensor|list[int], start_pos:int, step:bool=True) -> Tensor:
    """JIT-compiled forward of tokens (1, T) or a list (GPT2.jit): after the first call of a width nothing compiles again,
    whatever start_pos is."""
    if isinstance(tokens, list): tokens = device_tokens(tokens)
    T = tokens.shape[1]
    if not 0 <= start_pos <= self.cfg.n_positions - T:
      raise ValueError(f"positions {start_pos}..{start_pos+T-1} are outside the model's context of {self.cfg.n_positions}")
    # a fresh buffer: one input layout, whoever made tokens (uncopied, a step captured on one JIT's output buffer read
    # that buffer when later given another's)
    return self.jit(self.forward, T, step)(tokens.clone(), self.positions.bind(start_pos))

  def prefill(self, tokens:list[int]) -> None:
    """Fill the cache with tokens at positions 0..len-1, in passes of PREFILL_WIDTH tokens, then of power-of-two widths
    (100 tokens: 64, 32, 4): a prompt of any length runs the same few compiled passes, stored like the steps, so a new
    length compiles nothing. tinygrad's default kernels, never searched: a first run would search every width."""
    start = 0
    while start < len(tokens):
      T = min(PREFILL_WIDTH, 1 << (len(tokens) - start).bit_length() - 1)
      self(Tensor([tokens[start:start+T]], dtype=dtypes.int32), start, step=False).realize()
      start += T

STEP_WIDTH = 16   # the widest step pass: K+1 tokens for K up to 15
# the widest prefill pass: wider ones were barely faster (gpt2, 1000 tokens on the CPU: passes up to 512 wide 23.3 s, 64
# wide 25.9 s), but once captured they hold their large intermediate buffers (1.9 GB against 1.0), and a first use
# runs each new width twice (70.7 s against 38.2)
PREFILL_WIDTH = 64

class Step:
  """A TinyJit whose kernels, when it captures, come from tinygrad's BEAM search of width `search` (0: tinygrad's default
  heuristics). tinygrad caches each kernel's choice on disk, so a machine searches a kernel once. Once captured, the step
  is also stored at `path` (step_file()), and a later process loads it instead of capturing it again: lowering its
  kernels to code takes seconds per step. The model's weights and KV cache are stored by name, not by value, so a
  loaded step runs on the loading model's own."""
  def __init__(self, fn, search:int, what:str, model:GPT2, path:pathlib.Path|None):
    self.fn, self.search, self.what, self.model, self.path = TinyJit(fn), search, what, weakref.ref(model), path
    self.calls = 0
    if path is not None and path.is_file():
      try:
        with open(path, "rb") as f: jit = _StateUnpickler(f, state_uops(model)).load()
        if getattr(jit, "captured", None) is not None: self.fn = jit
      except Exception: pass                     # unreadable (an interrupted write, another version): capture, rewrite
  @property
  def captured(self): return self.fn.captured
  @property
  def warm(self) -> bool: return self.calls >= 2  # the first call captures or links a loaded step, the second is slow too
  def __call__(self, *args):
    self.calls += 1
    if self.fn.captured is not None: return self.fn(*args)
    # a TinyJit runs its function plainly once, then captures it: both now, on the same inputs (a step computes and
    # writes the same twice), so that a step called once, like a prefill's, is captured and stored too
    with Context(BEAM=self.search), notice(f"compiling {self.what}" + (" with searched kernels" if self.search else "")):
      for _ in range(max(1, 2 - self.fn.cnt)): ret = self.fn(*args)
    if self.fn.captured is not None and self.path is not None: self.save()
    return ret
  def save(self):
    names = {id(u): name for name, u in state_uops(self.model()).items()}
    tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
    try:
      self.path.parent.mkdir(parents=True, exist_ok=True)
      with open(tmp, "wb") as f: _StatePickler(f, names).dump(self.fn)
      os.replace(tmp, self.path)                 # whole or not at all, whoever else writes it
    except OSError: tmp.unlink(missing_ok=True)  # a read-only cache: every run captures

def state_uops(model:GPT2) -> dict[str, UOp]:
  """The model's weights and KV cache by name (not what its steps return, which get_state_dict also finds)."""
  return {name: t.uop.base for name, t in get_state_dict(model).items() if not name.startswith("jits.")}

class _StatePickler(pickle.Pickler):
  def __init__(self, f, names:dict[int, str]): super().__init__(f, pickle.HIGHEST_PROTOCOL); self.names = names
  def persistent_id(self, obj): return self.names.get(id(obj)) if isinstance(obj, UOp) else None

class _StateUnpickler(pickle.Unpickler):
  def __init__(self, f, uops:dict[str, UOp]): super().__init__(f); self.uops = uops
  def persistent_load(self, name): return self.uops[name]
  def find_class(self, module, name):
    found = super().find_class(module, name)
    return _renumbered if found is UOp else found

def _renumbered(op, dtype=None, src=(), arg=None, tag=None, metadata=None, *buffer) -> UOp:
  """A stored step's own buffers (its intermediates) numbered anew in this process. tinygrad interns UOps by their
  fields, a buffer's number among them: with the storing process's numbers, a loaded step's buffer was whichever live
  buffer of this process had that number and size (another model's weights, a step captured later), and both wrote it."""
  if op is Ops.BUFFER and arg.device is not None: arg = dataclasses.replace(arg, slot=next(UOp.unique_num))
  return UOp(op, dtype, src, arg, tag, metadata, *buffer)

def step_file(model:GPT2, fn, key:tuple) -> pathlib.Path|None:
  """Where a captured step is stored: SPEC_STEP_CACHE (empty: nowhere), by default beside tinygrad's disk cache (CACHEDB),
  and nowhere with CACHELEVEL=0. The name hashes everything the captured kernels depend on: the code of this file, of
  models/attention.py, models/linear.py, models/norm.py, models/replay.py and of fn's, tinygrad's version, device and
  settings, the model's shape and dtype, the search width and the step's arguments."""
  root = os.environ.get("SPEC_STEP_CACHE", os.path.join(os.path.dirname(CACHEDB), "spec-steps"))
  if not root or CACHELEVEL.value == 0: return None
  files = {__file__, attention.__file__, inspect.getsourcefile(choose), norm.__file__, replay.__file__, inspect.getsourcefile(fn)}
  code = [pathlib.Path(f).read_bytes() for f in sorted(files)]
  settings = sorted((k, str(v.value)) for k, v in ContextVar._cache.items())
  what = (importlib.metadata.version("tinygrad"), Device.DEFAULT, Device[Device.DEFAULT].renderer.target, settings,
          model.cfg, model.dtype, model.search, key)
  return pathlib.Path(root) / f"{hashlib.sha256(b''.join(code) + repr(what).encode()).hexdigest()[:32]}.pkl"

@contextlib.contextmanager
def notice(what:str, after:float=10.0):
  """Say on stderr what runs once it has taken `after` seconds, and when it ends: a first run compiles, and searches
  kernels for minutes (gpt2-xl); later runs find both in tinygrad's disk cache."""
  say = lambda text: print(f"spec: {what}{text}", file=sys.stderr, flush=True)
  t0, timer = time.perf_counter(), threading.Timer(after, say, [" (the work of a first run: tinygrad caches it) ..."])
  timer.start()
  try: yield
  finally:
    timer.cancel()
    if time.perf_counter() - t0 > after: say(f": done in {time.perf_counter() - t0:.0f} s")

_token_writers: dict[int, tuple[Tensor, TinyJit]] = {}
def device_tokens(tokens:list[int]) -> Tensor:
  """The few tokens a step feeds in, as a (1, w) int32 Tensor on the device. Tensor(list) schedules a new host-to-device
  copy on every call (~3 ms on the CPU backend); here a JIT-compiled kernel per width builds them from bound variables
  (0.3 ms). Its output buffer is the JIT's own, rewritten by the next call of the same width."""
  w = len(tokens)
  if w not in _token_writers:  # zeros: a realized input to read, so that the JIT has a kernel to capture and owns its output
    build = lambda zeros, *ids: (zeros + Tensor.stack(*[Tensor(i) for i in ids]).cast(dtypes.int32).reshape(1, w)).realize()
    _token_writers[w] = Tensor.zeros(1, w, dtype=dtypes.int32).contiguous().realize(), TinyJit(build)
  zeros, build = _token_writers[w]
  return build(zeros, *[UOp.variable(f"token{i}", 0, 2**31 - 1).bind(t) for i, t in enumerate(tokens)])

# ***** loading *****

def check_device() -> None:
  """Compile and run one kernel on tinygrad's device (DEV, else the first that opens): a machine without a usable one
  fails here in one line, not in a traceback from the first forward pass. Native compilers' messages are silenced."""
  asked = os.environ.get("DEV") or "unset"   # read first: tinygrad sets DEV when it picks a device
  saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, 2)
  try:
    # vectorized stores and a reduction, as every forward pass has; compiled now, not found in tinygrad's disk cache
    with Context(CACHELEVEL=0): (Tensor.ones(256).contiguous() + 1).sum().item()
  except Exception as e:
    why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
    raise OSError(f"no usable tinygrad device (DEV {asked}; {why}): install clang for the CPU backend (Linux: apt-get "
                  "install clang) or a GPU backend, and choose it with DEV=CPU, DEV=CUDA, DEV=METAL, DEV=CL, ...") from None
  finally: os.dup2(saved, 2); os.close(saved); os.close(devnull)

DTYPES = {"float32": dtypes.float32, "float16": dtypes.float16}

def resolve_dtype(name:str) -> DType:
  """"auto" is float16 where the device computes in half measurably faster than in float32 (a GPU: it reads half the
  bytes per decode), else float32 (linear.half_pays(): tinygrad's CPU backend converts every half value to float, and
  tinygrad emulates half where the device's compiler has none, as on pocl: gpt2's decode 50.6 ms in float16, 31.0 in
  float32)."""
  if name == "auto": name = "float16" if half_pays() else "float32"
  if name not in DTYPES: raise ValueError(f"dtype must be auto, {' or '.join(DTYPES)}, got {name!r}")
  return DTYPES[name]

def load(name_or_dir:str, dtype:str="auto", dummy:bool=False, search:int=0) -> GPT2:
  """A model by name (gpt2, gpt2-medium, gpt2-large, gpt2-xl: from the Hugging Face cache, else downloaded into it;
  models/hub.py) or from a local Hugging Face checkpoint directory (config.json + model.safetensors), its weights in
  dtype ("auto", "float32", "float16"). dummy=True: random weights of that shape, nothing read or downloaded.
  search: the BEAM width of the kernel search for its step passes (GPT2.jit), 0 for tinygrad's default kernels."""
  path, dtype_ = pathlib.Path(name_or_dir), resolve_dtype(dtype)
  if name_or_dir in CONFIGS and not path.is_dir():
    if dummy: return _randomize(GPT2(CONFIGS[name_or_dir], dtype_, search))
    try: path = hub.snapshot(f"{HUB_ORG}/{name_or_dir}")
    except hub.HubError as e: raise CheckpointError(str(e)) from None
  elif not path.is_dir():
    if "/" in name_or_dir or name_or_dir.startswith("."): raise CheckpointError(f"{name_or_dir}: no such checkpoint directory")
    raise CheckpointError(f"unknown model {name_or_dir!r}: use one of {', '.join(CONFIGS)} or a local checkpoint directory")
  model = GPT2(_read_config(path / "config.json"), dtype_, search)
  if dummy: return _randomize(model)
  _load_weights(model, path / "model.safetensors")
  return model

def _read_config(fn:pathlib.Path) -> GPT2Config:
  try: raw = json.loads(fn.read_text())
  except FileNotFoundError: raise CheckpointError(f"{fn}: missing (a checkpoint directory needs config.json and model.safetensors)") from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e: raise CheckpointError(f"{fn}: not valid JSON ({e})") from None
  missing = [k for k in ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions") if k not in raw]
  if missing: raise CheckpointError(f"{fn}: missing {', '.join(missing)}")
  if raw.get("activation_function", "gelu_new") != "gelu_new": raise CheckpointError(f"{fn}: activation {raw['activation_function']} is not gelu_new")
  if raw["n_embd"] % raw["n_head"]: raise CheckpointError(f"{fn}: n_embd {raw['n_embd']} is not a multiple of n_head {raw['n_head']}")
  return GPT2Config(**{k: raw[k] for k in ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions")},
                    layer_norm_epsilon=raw.get("layer_norm_epsilon", 1e-5))

def _load_weights(model:GPT2, fn:pathlib.Path) -> None:
  if not fn.is_file(): raise CheckpointError(f"{fn}: missing")
  try:
    end, size = hub.safetensors_extent(fn)
    if end > size: raise ValueError(f"truncated: the header describes {end} bytes, the file has {size}")
    stored = safe_load(fn)
  except Exception as e: raise CheckpointError(f"{fn}: not a valid safetensors file ({e})") from None
  stored = {k.removeprefix("transformer."): v for k, v in stored.items()}
  expected = get_state_dict(model)
  weights = {}
  for k, param in expected.items():
    if "cache_kv" in k: continue
    if k not in stored: raise CheckpointError(f"{fn}: missing weight {k}")
    w = stored[k].to(Device.DEFAULT)
    if k.endswith(CONV1D): w = w.T
    stored_shape = (model.cfg.vocab_size, param.shape[1]) if k == "wte.weight" else param.shape  # wte: unpadded
    if w.shape != stored_shape: raise CheckpointError(f"{fn}: {k} has shape {w.shape}, expected {stored_shape}")
    if k == "wte.weight": w = w.pad(((0, param.shape[0] - w.shape[0]), None))  # zero rows up to padded_vocab
    # a buffer of the model's own layout: left as a transposed or padded view of the file's (float32 casts nothing), the
    # passes ran other kernels than random weights' and the lm_head masked its loads (default kernels: 9.3 ms, was 11.2)
    weights[k] = w.cast(param.dtype).contiguous()
  load_state_dict(model, weights, strict=False, verbose=False)

def _randomize(model:GPT2) -> GPT2:
  """Random weights of the right shapes and GPT-2's initial scale, std 0.02 (no download): for benchmarks anywhere.
  Uniform, not normal: gpt2-xl's 1.6 B take 35 s on 2 cores, with tinygrad's Tensor.normal (Box-Muller) 70 s."""
  a = 0.02 * math.sqrt(3)  # U(-a, a) has std a / sqrt(3)
  for k, t in get_state_dict(model).items():
    if "cache_kv" in k: continue
    if k.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")): t.replace(Tensor.ones(*t.shape, dtype=t.dtype).contiguous().realize())
    else: t.replace(Tensor.uniform(*t.shape, low=-a, high=a, dtype=t.dtype).realize())  # one at a time: no peak of temporaries
  return model

def tokenizer():
  """GPT-2's BPE from tiktoken (r50k_base is identical to "gpt2"); offline, point TIKTOKEN_CACHE_DIR at a cache holding it."""
  import tiktoken
  try: return tiktoken.get_encoding("r50k_base")
  except Exception as e:
    raise CheckpointError(f"cannot load GPT-2's tokenizer r50k_base ({e}): offline? set TIKTOKEN_CACHE_DIR to a directory "
                          f"holding tiktoken's r50k_base file (now {os.environ.get('TIKTOKEN_CACHE_DIR', 'unset')})") from None


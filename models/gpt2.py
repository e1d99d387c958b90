"""GPT-2 (Radford et al. 2019) on tinygrad: the port that spec.py's sampler runs, in plain Tensor operations.

The model returns every position's logits and never samples: the sampler needs the K+1 distributions of one verify
pass. The KV cache is preallocated, not initialized; it holds what the model has seen up to the position the caller
passes next, so each call continues from there, and rolling back r tokens is calling with a start position r smaller
(stale entries are overwritten before they are read; a call past the cache's end would attend over unwritten memory).
The engine (models/engine/) replaces some of these modules' computations with kernels of its own; models.load() applies
it unless plain=True.
"""
from __future__ import annotations
import functools, json, math, pathlib
from dataclasses import dataclass
from tinygrad import Tensor, TinyJit, UOp, Context, Device, dtypes, nn
from tinygrad.dtype import DType
import numpy as np
from tinygrad.nn.state import get_state_dict, safe_dtypes
from models import hub

@dataclass(frozen=True)
class GPT2Config:
  n_layer: int
  n_head: int
  n_embd: int
  vocab_size: int = 50257
  n_positions: int = 1024
  layer_norm_epsilon: float = 1e-5

  @property
  def padded_vocab(self) -> int: return vocab_width(self.vocab_size)

  @property
  def n_params(self) -> int:  # with the lm_head tied to wte, as in the released checkpoints
    C, L = self.n_embd, self.n_layer
    return self.vocab_size*C + self.n_positions*C + L*(12*C*C + 13*C) + 2*C

# the released OpenAI checkpoints (openai-community/<name> on the Hugging Face hub): shapes for --dummy-weights
CONFIGS = {
  "gpt2":        GPT2Config(n_layer=12, n_head=12, n_embd=768),   # 124M
  "gpt2-medium": GPT2Config(n_layer=24, n_head=16, n_embd=1024),  # 355M
  "gpt2-large":  GPT2Config(n_layer=36, n_head=20, n_embd=1280),  # 774M
  "gpt2-xl":     GPT2Config(n_layer=48, n_head=25, n_embd=1600),  # 1558M
}
EOT = 50256  # <|endoftext|>

def vocab_width(V:int) -> int:
  """V rounded up to a multiple of 64 (50257 -> 50304): tinygrad splits an axis over threads only by its factors, and
  50257 = 29 x 1733. The lm_head's rows, and the width of the sampler's distributions."""
  return V + -V % 64

class Attention:
  def __init__(self, cfg:GPT2Config, dtype:DType):
    self.c_attn, self.c_proj = nn.Linear(cfg.n_embd, 3*cfg.n_embd), nn.Linear(cfg.n_embd, cfg.n_embd)
    self.n_head, self.head_dim = cfg.n_head, cfg.n_embd // cfg.n_head
    # uninitialized: a position is written before it is read, and memory the context has not reached stays untouched
    self.cache_kv = Tensor.empty(2, 1, self.n_head, cfg.n_positions, self.head_dim, dtype=dtype).realize()

  def __call__(self, x:Tensor, start_pos:int|UOp) -> Tensor:
    qkv = self.c_attn(x)                                                                        # (B, T, 3C)
    self.store(qkv, start_pos)
    return self.c_proj(self.attend(qkv, start_pos))

  def store(self, qkv:Tensor, start_pos:int|UOp) -> None:
    """The block's keys and values into the KV cache at its positions."""
    B, T, _ = qkv.shape
    k, v = qkv.reshape(B, T, 3, self.n_head, self.head_dim)[:, :, 1:].permute(2, 0, 3, 1, 4)    # 2 x (B, H, T, D)
    self.cache_kv[:, :, :, start_pos:start_pos+T].assign(Tensor.stack(k, v))                   # (2, B, H, P, D)

  def attend(self, qkv:Tensor, start_pos:int|UOp) -> Tensor:
    """softmax(q k^T / sqrt(D) + causal mask) v for the block's T queries over the cache's start_pos+T keys: (B, T, C).
    Scores (their products too) and softmax in float32. q.k is written as a product summed over D, not a matmul:
    tinygrad indexes a transposed view of the cache's symbolic length through a division per element."""
    B, T, _ = qkv.shape
    H, D, S = self.n_head, self.head_dim, start_pos + T
    q = qkv.reshape(B, T, 3, H, D)[:, :, 0].transpose(1, 2)                                    # (B, H, T, D)
    keys, values = self.cache_kv[0, :, :, :S], self.cache_kv[1, :, :, :S]                       # (B, H, S, D)
    scores = (q.float().unsqueeze(-2) * keys.float().unsqueeze(-3)).sum(-1) / math.sqrt(D)        # (B, H, T, S)
    # causal: only the block's own T x T corner is masked (a triu over all S columns is an arange of symbolic length)
    if T > 1: scores = scores + Tensor.full((1, 1, T, T), -math.inf).triu(1).pad((None, None, None, (start_pos, 0)))
    probs = scores.softmax(-1).cast(qkv.dtype)                                                  # (B, H, T, S)
    y = (probs.unsqueeze(-1) * values.unsqueeze(2)).sum(-2)                                     # (B, H, T, D)
    return y.transpose(1, 2).reshape(B, T, H * D)

class MLP:
  def __init__(self, cfg:GPT2Config):
    self.c_fc, self.c_proj = nn.Linear(cfg.n_embd, 4*cfg.n_embd), nn.Linear(4*cfg.n_embd, cfg.n_embd)

  def __call__(self, x:Tensor) -> Tensor: return self.c_proj(self.c_fc(x).gelu())  # tanh GELU, GPT-2's gelu_new

class LayerNorm(nn.LayerNorm):
  """nn.LayerNorm with its statistics in float32, cast back: in half, (x - mean)^2 overflows past 256, and GPT-2's
  residual stream carries values in the thousands ("massive activations"): the variance was inf and the row zeroed."""
  def __call__(self, x:Tensor) -> Tensor: return super().__call__(x.float()).cast(x.dtype)

class Block:
  def __init__(self, cfg:GPT2Config, dtype:DType):
    self.ln_1, self.ln_2 = LayerNorm(cfg.n_embd, cfg.layer_norm_epsilon), LayerNorm(cfg.n_embd, cfg.layer_norm_epsilon)
    self.attn, self.mlp = Attention(cfg, dtype), MLP(cfg)

  def __call__(self, x:Tensor, start_pos:int|UOp) -> Tensor:
    x = x + self.attn(self.ln_1(x), start_pos)
    return (x + self.mlp(self.ln_2(x))).contiguous()

class GPT2:
  def __init__(self, cfg:GPT2Config, dtype:DType=dtypes.float32):
    self.cfg, self.dtype = cfg, dtype
    # wte has padded_vocab rows: the ones past vocab_size are zero, never looked up, and their logits dropped
    self.wte, self.wpe = nn.Embedding(cfg.padded_vocab, cfg.n_embd), nn.Embedding(cfg.n_positions, cfg.n_embd)
    self.h = [Block(cfg, dtype) for _ in range(cfg.n_layer)]
    self.ln_f = LayerNorm(cfg.n_embd, cfg.layer_norm_epsilon)
    for name, t in get_state_dict(self).items():
      if "cache_kv" not in name: t.replace(t.cast(dtype))                  # weights, and so activations, in dtype
    self.positions = UOp.variable("start_pos", 0, cfg.n_positions - 1)    # the JIT's symbolic start position
    self.jits: dict[tuple, TinyJit] = {}                                   # this instance's own (jit())

  def forward(self, tokens:Tensor, start_pos:int|UOp, last:bool=False) -> Tensor:
    """tokens (1, T) at positions start_pos .. start_pos+T-1 -> float32 logits (T, vocab) for the token after each;
    last: for the token after the last only (1, vocab), all a draft's step needs."""
    x = self.blocks(tokens, start_pos)[0]
    # materialized: a reduction over the logits (greedy's argmax) would otherwise compute the lm_head inside its own
    # kernel, one that a GPU runs on a few hundred threads
    return self.lm_head(self.ln_f(x[-1:] if last else x)).contiguous()[:, :self.cfg.vocab_size]

  def blocks(self, tokens:Tensor, start_pos:int|UOp) -> Tensor:
    """The embeddings through every block, filling the KV cache: (1, T, C)."""
    T = tokens.shape[1]
    # the lookup indexes the vocabulary's rows only: over all padded_vocab rows tinygrad splits it into a slow reduce
    # (1, T, C)
    x = self.wte.weight[:self.cfg.vocab_size][tokens] + self.wpe.weight.shrink(((start_pos, start_pos+T), None))
    for block in self.h: x = block(x, start_pos)
    return x

  def lm_head(self, x:Tensor) -> Tensor:
    """x (T, C) -> float32 logits (T, padded_vocab): the output layer, tied to wte, accumulated in float32."""
    return x.matmul(self.wte.weight.T, dtype=dtypes.float32)

  def fill(self, tokens:Tensor, start_pos:int|UOp) -> Tensor:
    """A prefill pass: the KV cache filled at tokens' positions, no logits."""
    return self.blocks(tokens, start_pos)[:, -1].contiguous()

  def jit(self, fn, T:int, passes:tuple[int, ...]=(), **static):
    """fn(model, ...) JIT-compiled for this instance, once per input width T and static arguments (a TinyJit freezes
    Python values; one on the class would be shared by draft and target). passes: the widths of the model's passes in
    fn where they are not just T (the engine chooses kernels for each before it captures)."""
    key = (fn.__name__, T, *sorted(static.items()))
    if key not in self.jits: self.jits[key] = self.compile(functools.partial(fn, **static), key, passes or (T,))
    return self.jits[key]

  def compile(self, fn, key:tuple, passes:tuple[int, ...]):   # the engine compiles through its store and choices
    return TinyJit(fn)

  def read(self, t:Tensor) -> list:   # a step's output on the host (the engine copies its buffer out directly)
    return t.tolist()

  def __call__(self, tokens:Tensor|list[int], start_pos:int) -> Tensor:
    """The JIT-compiled forward of tokens (1, T) or a list: after a width's first calls nothing compiles again."""
    if isinstance(tokens, list): tokens = Tensor([tokens], dtype=dtypes.int32)
    check_positions(self, start_pos, tokens.shape[1])
    # a fresh buffer: one input layout, whoever made tokens
    return self.jit(GPT2.forward, tokens.shape[1])(self, tokens.clone(), self.positions.bind(start_pos))

  def prefill(self, tokens:list[int]) -> None:
    """The cache filled with tokens at positions 0..len-1, in passes of PREFILL_WIDTH and a last of the power of two
    that holds the rest, padded (100 tokens: 64, then 36 in a pass of 64): a prompt runs one or two compiled passes,
    the same for every length between two powers of two. The padding's keys and values lie past the sequence, where
    nothing reads before the next pass overwrites them; near the context's end the rest goes in exact widths."""
    start = 0
    while start < len(tokens):
      T = min(PREFILL_WIDTH, 1 << (len(tokens) - start - 1).bit_length())
      if start + T > self.cfg.n_positions: T = 1 << (len(tokens) - start).bit_length() - 1
      check_positions(self, start, T)
      block = tokens[start:start+T]
      block = Tensor([block + block[-1:] * (T - len(block))], dtype=dtypes.int32)
      self.jit(GPT2.fill, T)(self, block, self.positions.bind(start)).realize()
      start += T

# wider passes were barely faster, and each captured one holds larger buffers (docs/engine.md)
PREFILL_WIDTH = 64

def check_positions(model:GPT2, start_pos:int, T:int) -> None:
  if not 0 <= start_pos <= model.cfg.n_positions - T:
    raise ValueError(f"positions {start_pos}..{start_pos+T-1} are outside the model's context of "
                     f"{model.cfg.n_positions}")

# ***** loading *****

class CheckpointError(Exception):
  """A model that cannot be loaded: the message names the file (or model name) and the problem."""

CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")  # stored (in, out)

def load(name_or_dir:str, dtype:DType=dtypes.float32, dummy:bool=False) -> GPT2:
  """A model by name (gpt2 .. gpt2-xl: from the Hugging Face cache, else downloaded into it) or from a local Hugging
  Face checkpoint directory (config.json + model.safetensors), in dtype. dummy: random weights of that shape."""
  path = pathlib.Path(name_or_dir)
  if name_or_dir in CONFIGS and not path.is_dir():
    if dummy: return randomize(GPT2(CONFIGS[name_or_dir], dtype))
    try: path = hub.snapshot(f"openai-community/{name_or_dir}")
    except hub.HubError as e: raise CheckpointError(str(e)) from None
  elif not path.is_dir():
    if "/" in name_or_dir or name_or_dir.startswith("."):
      raise CheckpointError(f"{name_or_dir}: no such checkpoint directory")
    raise CheckpointError(f"unknown model {name_or_dir!r}: use one of {', '.join(CONFIGS)} or a local checkpoint "
                          "directory")
  model = GPT2(read_config(path / "config.json"), dtype)
  return randomize(model) if dummy else load_weights(model, path / "model.safetensors")

def read_config(fn:pathlib.Path) -> GPT2Config:
  try: raw = json.loads(fn.read_text())
  except FileNotFoundError:
    raise CheckpointError(f"{fn}: missing (a checkpoint directory needs config.json and model.safetensors)") from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e: raise CheckpointError(f"{fn}: not valid JSON ({e})") from None
  missing = [k for k in ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions") if k not in raw]
  if missing: raise CheckpointError(f"{fn}: missing {', '.join(missing)}")
  if raw.get("activation_function", "gelu_new") != "gelu_new":
    raise CheckpointError(f"{fn}: activation {raw['activation_function']} is not gelu_new")
  if raw["n_embd"] % raw["n_head"]:
    raise CheckpointError(f"{fn}: n_embd {raw['n_embd']} is not a multiple of n_head {raw['n_head']}")
  return GPT2Config(**{k: raw[k] for k in ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions")},
                    layer_norm_epsilon=raw.get("layer_norm_epsilon", 1e-5))

def load_weights(model:GPT2, fn:pathlib.Path) -> GPT2:
  """The checkpoint's weights into model, each in turn read from the file (not mapped), laid out in host memory
  (transposed, padded), then cast and realized on the device: a load holds the weights and one tensor's copies."""
  if not fn.is_file(): raise CheckpointError(f"{fn}: missing")
  try:
    end, size = hub.safetensors_extent(fn)
    if end > size: raise ValueError(f"truncated: the header describes {end} bytes, the file has {size}")
    stored, data_start = hub.safetensors_header(fn)
    stored = {k.removeprefix("transformer."): v for k, v in stored.items()}
  except Exception as e: raise CheckpointError(f"{fn}: not a valid safetensors file ({e})") from None
  params = {k: t for k, t in get_state_dict(model).items() if "cache_kv" not in k and not k.startswith("jits.")}
  for k, param in params.items():   # every name and shape checked before anything is read
    if k not in stored: raise CheckpointError(f"{fn}: missing weight {k}")
    expected = (model.cfg.vocab_size, param.shape[1]) if k == "wte.weight" else param.shape  # wte: unpadded
    shape = tuple(stored[k]["shape"])[::-1] if k.endswith(CONV1D) else tuple(stored[k]["shape"])
    if shape != expected: raise CheckpointError(f"{fn}: {k} has shape {shape}, expected {expected}")
    if stored[k]["dtype"] not in safe_dtypes: raise CheckpointError(f"{fn}: {k} has dtype {stored[k]['dtype']}")
  # LRU=0: a tensor's buffers freed as it is cast, not kept for reuse by later buffers of their size
  with open(fn, "rb") as f, Context(LRU=0):
    for k, param in params.items():
      bits = read_bits(f, data_start, stored[k])
      # laid out in host memory, so that the device holds one copy: the model's layout, not a view of the file's
      if k.endswith(CONV1D): bits = np.ascontiguousarray(bits.T)
      if k == "wte.weight": bits = np.pad(bits, ((0, param.shape[0] - bits.shape[0]), (0, 0)))  # to padded_vocab
      param.replace(on_device(bits, safe_dtypes[stored[k]["dtype"]]).cast(param.dtype).contiguous().realize())
      Device[param.device].synchronize()   # the device has copied the tensor: its host memory can go
  return model

def on_device(bits:np.ndarray, dtype:DType) -> Tensor:
  """bits as dtype's values on the device: viewed as them in numpy where it has the dtype (one copy to the device), else
  (bfloat16) reinterpreted there."""
  return Tensor(bits.view(np.dtype(dtype.fmt))) if dtype.fmt else Tensor(bits).bitcast(dtype)

def read_bits(f, data_start:int, entry:dict) -> np.ndarray:
  """One tensor of a safetensors file (its header's entry) read, not mapped, as unsigned integers of its dtype's size:
  numpy lays out any dtype's bits (bfloat16's too), the device casts them."""
  begin, end = entry["data_offsets"]
  size = safe_dtypes[entry["dtype"]].itemsize
  f.seek(data_start + begin)
  bits = np.fromfile(f, np.dtype(f"<u{size}"), (end - begin) // size)
  if bits.nbytes != end - begin: raise CheckpointError(f"{f.name}: truncated")
  return bits.reshape(entry["shape"])

def randomize(model:GPT2, seed:int=0) -> GPT2:
  """Random weights of GPT-2's initial scale, std 0.02, for benchmarks without a download: U(-a, a), each weight a
  window of one pool of uniform values drawn once, at a random start within its first million (drawing every weight's
  values anew took gpt2-xl 50 s on 2 cores)."""
  a = 0.02 * math.sqrt(3)  # U(-a, a) has std a / sqrt(3)
  params = {k: t for k, t in get_state_dict(model).items() if "cache_kv" not in k and not k.startswith("jits.")}
  rng, starts = np.random.default_rng(seed), 1 << 20
  pool = rng.random(max(t.numel() for t in params.values()) + starts, dtype=np.float32) * np.float32(2 * a)
  pool -= np.float32(a)
  # the constructor's lazy initializers dropped first: each realize below walks every live tensor's graph
  for t in params.values(): t.replace(Tensor.empty(*t.shape, dtype=t.dtype))
  for k, t in params.items():
    if k.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")): values = np.ones(t.shape, np.float32)
    else: values = pool[(start := int(rng.integers(starts))):start + t.numel()].reshape(t.shape)
    t.replace(Tensor(values).cast(t.dtype).contiguous().realize())   # one at a time: no peak of temporaries
  return model

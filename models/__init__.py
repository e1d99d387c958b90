"""GPT-2 for spec: the port (gpt2.py), its engine (engine/), loading by name (hub.py) and GPT-2's tokenizer.

  models.load("gpt2-xl")                                 the port with the engine applied
  models.load("path/to/checkpoint_dir", plain=True)      the port alone, on tinygrad's own kernels and executor
  models.draft_dtype("auto", target.dtype)               the dtype a draft runs in beside that target
"""
import os
from tinygrad import Tensor, Context, dtypes
from tinygrad.dtype import DType
from models import engine, gpt2
from models.gpt2 import GPT2, GPT2Config, CONFIGS, EOT, CheckpointError, vocab_width

DTYPES = {"float32": dtypes.float32, "float16": dtypes.float16}

def resolve_dtype(name:str, plain:bool=False) -> DType:
  """"auto" is float16 where the engine measures its kernels in half clearly faster than in float32 (engine.half_pays():
  a GPU, a CPU with F16C), else float32; with plain=True nothing is measured, and auto is float32."""
  if name == "auto": name = "float16" if not plain and engine.half_pays() else "float32"
  if name not in DTYPES: raise ValueError(f"dtype must be auto, {' or '.join(DTYPES)}, got {name!r}")
  return DTYPES[name]

def draft_dtype(name:str, target:DType, plain:bool=False) -> str:
  """The draft's dtype (a name of DTYPES) beside a target in dtype target: "auto" is float16 where half measures faster
  on the device (resolve_dtype()), else the target's. A draft's precision moves only how often its tokens are
  accepted, never the distribution of the output; in float16 it reads half the bytes a round."""
  if name == "auto": return "float16" if not plain and engine.half_pays() else dtype_name(target)
  if name not in DTYPES: raise ValueError(f"draft dtype must be auto, {' or '.join(DTYPES)}, got {name!r}")
  return name

def dtype_name(dtype:DType) -> str: return next(name for name, d in DTYPES.items() if d == dtype)   # its DTYPES name

def load(name_or_dir:str, dtype:str="auto", dummy:bool=False, search:int=0, plain:bool=False) -> GPT2:
  """A model by name (gpt2, gpt2-medium, gpt2-large, gpt2-xl: the Hugging Face cache, else a download into it) or a
  local Hugging Face checkpoint directory, its weights in dtype ("auto", "float32", "float16"). dummy: random weights of
  that shape, nothing read. search: the BEAM width of the engine's kernel search for its steps. plain: no engine."""
  if plain and search: raise ValueError("search is the engine's kernel search: it needs the engine (plain=False)")
  model = gpt2.load(name_or_dir, resolve_dtype(dtype, plain), dummy)
  return model if plain else engine.apply(model, search)

def tokenizer():
  """GPT-2's BPE from tiktoken (r50k_base is identical to "gpt2"); offline, TIKTOKEN_CACHE_DIR names a cache holding
  it."""
  import tiktoken
  try: return tiktoken.get_encoding("r50k_base")
  except Exception as e:
    now = os.environ.get("TIKTOKEN_CACHE_DIR", "unset")
    raise CheckpointError(f"cannot load GPT-2's tokenizer r50k_base ({e}): offline? set TIKTOKEN_CACHE_DIR to a "
                          f"directory holding tiktoken's r50k_base file (now {now})") from None

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
    raise OSError(f"no usable tinygrad device (DEV {asked}; {why}): install clang for the CPU backend (Linux: "
                  "apt-get install clang) or a GPU backend, and choose it with DEV=CPU, DEV=CUDA, DEV=METAL, DEV=CL, "
                  "...") from None
  finally: os.dup2(saved, 2); os.close(saved); os.close(devnull)

__all__ = ["GPT2", "GPT2Config", "CONFIGS", "DTYPES", "EOT", "CheckpointError", "check_device", "draft_dtype",
           "dtype_name", "load", "resolve_dtype", "tokenizer", "vocab_width"]

"""Measured choices: which of two or more ways is fastest on this machine, asked once and kept in tinygrad's disk
cache."""
from __future__ import annotations
import hashlib, importlib.metadata, sys, time
from tinygrad import Tensor, TinyJit, Device, Context, dtypes
from tinygrad.helpers import diskcache_get, diskcache_put

def faster(kind:str, what:tuple, kernel, formula, name:str) -> bool:
  """Whether kernel() measures fewer seconds than formula(), asked once per machine: cached in tinygrad's disk cache
  under kind by machine_key(*what) (what holds the kernel's code: a changed kernel is measured again). A kernel that
  fails to compile or run loses, uncached, and one line on stderr names it (name) and says why."""
  disk = machine_key(*what)
  if (ret := diskcache_get(kind, disk)) is not None: return ret
  try: seconds = kernel()
  except Exception as e:
    why = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
    print(f"spec: the {name} cannot run on {Device.DEFAULT} ({why}); tinygrad's kernels run instead",
          file=sys.stderr, flush=True)
    return False
  return diskcache_put(kind, disk, seconds < formula())

def fastest(kind:str, what:tuple, candidates:dict, name:str):
  """The key of the candidate (a function that runs and returns its seconds) that measures fewest seconds, asked once
  per machine like faster(); a candidate that fails to compile or run drops out, and one line on stderr names it (name
  and its key) and says why."""
  disk = machine_key(*what)
  if (ret := diskcache_get(kind, disk)) is not None: return ret[0]
  costs = {}
  for key, fn in candidates.items():
    try: costs[key] = fn()
    except Exception as e:
      why = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
      print(f"spec: the {name} {key} cannot run on {Device.DEFAULT} ({why})", file=sys.stderr, flush=True)
  return diskcache_put(kind, disk, (min(costs, key=costs.get) if costs else None,))[0]

def work_groups() -> bool:
  """Whether the device runs work-groups with shared memory (GPUs, OpenCL; not tinygrad's CPU backend): where the
  engine's GPU kernels are candidates."""
  renderer = Device[Device.DEFAULT].renderer
  return renderer.has_local and renderer.has_shared

def group_sizes(steps:int, near:tuple[int, ...], most:int) -> list[int]:
  """Work-group sizes to measure: for each of near, the divisor of steps in 8..most closest to it."""
  divisors = [d for d in range(8, most + 1) if steps % d == 0]
  return sorted({min(divisors, key=lambda d: abs(d - g)) for g in near}) if divisors else []

def machine_key(*what) -> str:
  """A disk-cache key for a measurement on this machine: tinygrad's version, the device, its compiler target, and
  what."""
  target = Device[Device.DEFAULT].renderer.target
  key = (importlib.metadata.version("tinygrad"), Device.DEFAULT, target, *what)
  return hashlib.sha256(repr(key).encode()).hexdigest()

def best_seconds(fn, reps:int=3) -> float:
  """The fastest of reps synchronized calls of fn: its cost without the noise of whatever else the machine does."""
  def once() -> float: t0 = synchronize(); fn(); return synchronize() - t0
  return min(once() for _ in range(reps))

def captured_seconds(fn, *args) -> float:
  """fn(*args) captured by a TinyJit on tinygrad's default kernels, then timed: best of 3."""
  step = TinyJit(fn)
  with Context(BEAM=0):
    for _ in range(2): step(*args)                 # a TinyJit captures on its second call
  return best_seconds(lambda: step(*args))

def synchronize() -> float: Device[Device.DEFAULT].synchronize(); return time.perf_counter()

def half_pays() -> bool:
  """Whether this device multiplies a row by half weights clearly faster (1.25x) than by float32 ones, as tinygrad's
  matmul: where half is native (a GPU) it reads half the bytes; where tinygrad converts every half value (its CPU
  backend) or emulates half (pocl) it does not. 8 weights of 1024 x 4096 timed in turn; once per machine."""
  if dtypes.half not in Device[Device.DEFAULT].renderer.supported_dtypes(): return False
  disk = machine_key()
  if (pays := diskcache_get("spec_half", disk)) is None:
    weights = [Tensor.ones(1024, 4096).contiguous().realize() for _ in range(8)]
    def cost(dtype) -> float:
      x = Tensor.ones(1, 4096, dtype=dtype).contiguous().realize()
      ws = [w.cast(dtype).contiguous().realize() for w in weights]
      return captured_seconds(lambda x: [x.matmul(w.T).realize() for w in ws], x)
    pays = diskcache_put("spec_half", disk, cost(dtypes.half) * 1.25 < cost(dtypes.float32))
  return pays

"""Measured choices: which of two or more ways is fastest on this machine, asked once and kept in tinygrad's disk
cache."""
from __future__ import annotations
import hashlib, importlib.metadata, math, sys, time
import numpy as np
from tinygrad import Tensor, TinyJit, Device, Context, dtypes
from tinygrad.helpers import CACHELEVEL, db_connection, diskcache_get, diskcache_put

# a candidate's outputs may differ from the reference's by this fraction of the reference's largest value (the dtype of
# the pass: its kernels sum in another order, and round half once where tinygrad's round each step)
TOLERANCE = {dtypes.float32: 1e-4, dtypes.float16: 1e-2}
PRUNE = 1.5   # a family's later options are measured only while its first is within this of the fastest so far

def fastest(kind:str, what:tuple, candidates:dict, name:str, dtype, family=lambda key: None, costs:dict|None=None):
  """The key of the fastest candidate whose outputs agree with the first's (the reference, tinygrad's own kernels),
  asked once per machine: cached in tinygrad's disk cache under kind by machine_key(*what) (what holds the kernels'
  code: a changed kernel is measured again). A candidate is a function that runs and returns (seconds, outputs). One
  that fails to compile or run, or whose outputs differ by more than TOLERANCE[dtype], drops out with one line on
  stderr naming it (name and its key) and why, and then nothing is cached: the next process measures again. Candidates
  of one family (family(key), not None) after its first are measured only while the first is within PRUNE of the
  fastest so far: options of a kernel that loses clearly are not all timed. costs, if given, receives every candidate's
  seconds (those that ran and agreed)."""
  disk = machine_key(*what)
  if (ret := diskcache_get(kind, disk)) is not None: return ret[0]
  reference, expected, failed, firsts = next(iter(candidates)), None, False, {}
  costs = {} if costs is None else costs
  def pruned(f) -> bool: return f in firsts and costs.get(firsts[f], math.inf) > PRUNE * min(costs.values(), default=0)
  for key, fn in candidates.items():
    if (f := family(key)) is not None and pruned(f): continue
    try: seconds, outputs = fn()
    except Exception as e:
      say(f"the {name} {key} cannot run on {Device.DEFAULT} ({why(e)})")
      failed = True
      continue
    if f is not None: firsts.setdefault(f, key)
    if key == reference: expected = outputs
    elif expected is None or (err := error(outputs, expected)) > TOLERANCE[dtype]:
      why_ = "tinygrad's did not run" if expected is None else f"{err:.1e} of the largest, over {TOLERANCE[dtype]:.0e}"
      say(f"the {name} {key} computes other values than tinygrad's on {Device.DEFAULT} ({why_})")
      failed = True
      continue
    costs[key] = seconds
  best = min(costs, key=costs.get) if costs else reference
  return best if failed else first_stored(kind, disk, (best,))[0]

def first_stored(kind:str, key:str, value):
  """value put in tinygrad's disk cache under kind and key unless a value is there already, and whichever is there
  then: read and written under the cache's write lock, so that processes that measured the same at once all keep the
  first one stored (tinygrad's put replaces), and choose, and name their steps (store.step_name()), alike."""
  if CACHELEVEL.value < 1: return value
  db = db_connection()
  db.execute("BEGIN IMMEDIATE")   # the write lock, held until diskcache_put commits
  try:
    if (stored := diskcache_get(kind, key)) is not None:
      db.rollback()
      return stored
    return diskcache_put(kind, key, value)
  except BaseException:
    db.rollback()
    raise

def error(outputs:list[np.ndarray], expected:list[np.ndarray]) -> float:
  """The largest difference between an output and its expected array over that array's largest magnitude, the worst
  of the outputs (each layer, context and cache alone: a small one wrong is not hidden by a large one right); inf
  where the shapes differ or a value is not finite where expected's is."""
  if len(outputs) != len(expected) or any(a.shape != b.shape for a, b in zip(outputs, expected)): return math.inf
  def one(got:np.ndarray, want:np.ndarray) -> float:
    got, want = got.astype(np.float64), want.astype(np.float64)
    if (np.isfinite(got) != np.isfinite(want)).any(): return math.inf
    finite = np.isfinite(want)
    return float(np.abs(got[finite] - want[finite]).max(initial=0) / max(np.abs(want[finite]).max(initial=0), 1e-30))
  return max((one(a, b) for a, b in zip(outputs, expected)), default=0.0)

def say(text:str) -> None: print(f"spec: {text}", file=sys.stderr, flush=True)
def why(e:Exception) -> str: return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"

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

def best_seconds(fn, reps:int=3, before=None) -> float:
  """The fastest of reps synchronized calls of fn: its cost without the noise of whatever else the machine does; each
  after before() (untimed) where given."""
  def once() -> float:
    if before: before()
    t0 = synchronize(); fn(); return synchronize() - t0
  return min(once() for _ in range(reps))

def captured(fn, *args, before=None) -> tuple[float, list[np.ndarray]]:
  """fn(*args) (a list of Tensors) captured by a TinyJit on tinygrad's default kernels, then timed: best of 3, each
  after before() where given, and the outputs of the last call."""
  step = TinyJit(fn)
  with Context(BEAM=0):
    for _ in range(2): step(*args)                 # a TinyJit captures on its second call
  seconds = best_seconds(lambda: step(*args), before=before)
  return seconds, [t.numpy() for t in step(*args)]

MEASURE_BYTES = 256 << 20   # a candidate is timed over this many bytes of weights (or all of them): past every cache

def enough(tensors:list[Tensor]) -> list[Tensor]:
  """The first of tensors whose bytes reach MEASURE_BYTES, at least one: what a candidate is timed over, so that it
  streams from memory as in a pass while a first run's measurements stay short."""
  out, total = [], 0
  for t in tensors:
    if total >= MEASURE_BYTES: break
    out.append(t); total += t.nbytes()
  return out

def evictor():
  """A function that reads MEASURE_BYTES of the device's memory through a buffer of its own (held while the function
  is): run ahead of a timed call, it leaves none of the weights timed in a cache (a CPU's last level, a GPU's L2), so
  that they stream from memory as in a pass, also a small model's, whose one role a cache would hold."""
  evict, held = TinyJit(lambda x: x.sum().realize()), []
  def run():
    # made at the first call (a choice read from the disk times nothing); written: untouched pages all read one page
    if not held: held.append(Tensor.zeros(MEASURE_BYTES // 4).contiguous().realize())
    evict(held[0])
  return run

def random(*shape:int, dtype=dtypes.float32, seed:int=0, mean:float=0.0) -> Tensor:
  """Normal values of this mean from numpy (nothing compiled for them but a cast): a measurement's inputs, so that wrong
  kernels give other outputs."""
  return Tensor((np.random.default_rng(seed).standard_normal(shape) + mean).astype(np.float32)).cast(dtype).realize()

MASSIVE = 3000.0   # GPT-2's residual stream carries a few dimensions in the thousands ("massive activations")

def activations(T:int, C:int, dtype=dtypes.float32, seed:int=0) -> Tensor:
  """Rows as a layer norm meets them in GPT-2: N(0, 1) with a dimension at -MASSIVE and, in every other row, the
  first element at +MASSIVE; every third row's mean far from 0."""
  x = np.random.default_rng(seed).standard_normal((T, C))
  for t in range(T):
    x[t, (C // 3 + t) % C] = -MASSIVE
    if t % 2 == 0: x[t, 0] = MASSIVE
    if t % 3 == 1: x[t] += 20
  return Tensor(x.astype(np.float32)).cast(dtype).realize()

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
      return captured(lambda x: [x.matmul(w.T).realize() for w in ws], x)[0]
    pays = first_stored("spec_half", disk, cost(dtypes.half) * 1.25 < cost(dtypes.float32))
  return pays

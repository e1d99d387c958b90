"""Measured choices: which of two or more ways is fastest on this machine, asked once and kept in tinygrad's disk
cache."""
from __future__ import annotations
import hashlib, importlib.metadata, inspect, math, sys, time
import numpy as np
from tinygrad import Tensor, TinyJit, Device, Context, dtypes
from tinygrad.helpers import CACHELEVEL, db_connection, diskcache_get, diskcache_put

PRUNE = 1.5   # a family's later options are measured only while its first is within this of the fastest so far

def tolerance(dtype, length:int) -> float:
  """How far a candidate's outputs may be from the reference's, a fraction of each output row's largest value
  (error()): what rounding alone moves them in a pass of dtype, whose unit roundoff is u (2^-11 in half, 2^-24 in
  float32). Each side rounds its outputs to dtype once: 2u. The reference rounds its inputs to dtype once where a
  candidate keeps them in float32 (a layer norm's output, GELU's input): a sum of `length` terms each off by up to u
  of itself, a random walk whose 4 standard deviations are 4u of the row's scale. Both sum in float32 in other orders:
  4 sqrt(length) 2^-24. At least 1e-4: in float32 a one-pass variance of a row with a massive value differs from the
  two passes' by up to 1e-5 of the row (norm.shift()). In half 2.9e-3 at every width GPT-2 has, where a kernel that
  drops one term in a hundred is off by 0.07 or more (docs/engine.md)."""
  u = 2.0 ** -(dtypes.finfo(dtype)[1] + 1)
  return max(6 * u + 4 * math.sqrt(length) * 2.0 ** -24, 1e-4)

def fastest(kind:str, what:tuple, candidates:dict, name:str, dtype, family=lambda key: None, costs:dict|None=None,
            length:int=1):
  """The key of the fastest candidate whose outputs agree with the first's (the reference, tinygrad's own kernels),
  asked once per machine: cached in tinygrad's disk cache under kind by machine_key(*what) (what holds the kernels'
  code: a changed kernel is measured again). A candidate is a function that runs and returns (seconds, outputs). One
  that fails to compile or run, or whose outputs differ by more than tolerance(dtype, length) (the reduction's
  length), drops out with one line on
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
    elif expected is None or (err := error(outputs, expected)) > tolerance(dtype, length):
      why_ = "tinygrad's did not run" if expected is None else \
        f"{err:.1e} of a row's largest, over {tolerance(dtype, length):.1e}"
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
  """The largest difference between an output and its expected array over the largest magnitude of its row (the last
  axis), the worst of the rows of every output (each layer, context and cache alone, each row alone: a row of ordinary
  values wrong is not hidden by a massive one right); inf where the shapes differ or a value is not finite where
  expected's is."""
  if len(outputs) != len(expected) or any(a.shape != b.shape for a, b in zip(outputs, expected)): return math.inf
  def one(got:np.ndarray, want:np.ndarray) -> float:
    got, want = got.astype(np.float64).reshape(-1, want.shape[-1] if want.ndim else 1), want.astype(np.float64)
    want = want.reshape(got.shape)
    if (np.isfinite(got) != np.isfinite(want)).any(): return math.inf
    finite = np.isfinite(want)
    diff, scale = np.where(finite, np.abs(got - want), 0), np.where(finite, np.abs(want), 0)
    return float((diff.max(-1, initial=0) / np.maximum(scale.max(-1, initial=0), 1e-30)).max(initial=0))
  return max((one(a, b) for a, b in zip(outputs, expected)), default=0.0)

def sources(*modules:str) -> str:
  """The source of these modules (names) and of every module of this project they use, however they name it (a helper
  imported by name, a module): what a measured choice's key holds, so that a change to any code that computes a
  candidate measures it again."""
  seen, todo = {}, list(modules)
  while todo:
    if (name := todo.pop()) in seen or name not in sys.modules: continue
    seen[name] = inspect.getsource(module := sys.modules[name])
    for v in vars(module).values():
      dep = v.__name__ if inspect.ismodule(v) else getattr(v, "__module__", None)
      if isinstance(dep, str) and dep.split(".")[0] == "models": todo.append(dep)
  return "".join(seen[name] for name in sorted(seen))

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

def captured(fn, *args, before=None, also=()) -> tuple[float, list[np.ndarray]]:
  """fn(*args) (a list of Tensors) captured by a TinyJit on tinygrad's default kernels, then timed: best of 3, each
  after before() where given, and the outputs of the last call, then of a call on each tuple of arguments in also
  (inputs of other kinds, the same shapes)."""
  step = TinyJit(fn)
  with Context(BEAM=0):
    for _ in range(2): step(*args)                 # a TinyJit captures on its second call
  seconds = best_seconds(lambda: step(*args), before=before)
  return seconds, [t.numpy() for call in (args, *also) for t in step(*call)]

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

def activations(T:int, C:int, dtype=dtypes.float32, seed:int=0) -> list[Tensor]:
  """Rows as a layer norm meets them in GPT-2, in two sets of T: massive rows (N(0, 1) with a dimension at -MASSIVE
  and, in every other row, the first element at +MASSIVE), and ordinary ones (N(0, 1)) with, where T > 1, one massive
  row among them; every third row's mean far from 0 in both. A massive row's variance hides a wrong epsilon, an
  ordinary row hides a massive value handled wrong: a pass meets both."""
  rng = np.random.default_rng(seed)
  massive, ordinary = rng.standard_normal((T, C)), rng.standard_normal((T, C))
  for t in range(T):
    massive[t, (C // 3 + t) % C] = -MASSIVE
    if t % 2 == 0: massive[t, 0] = MASSIVE
  if T > 1: ordinary[T // 2] = massive[T // 2]
  for x in (massive, ordinary): x[1::3] += 20
  return [Tensor(x.astype(np.float32)).cast(dtype).realize() for x in (massive, ordinary)]

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

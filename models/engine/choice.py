"""Measured choices: which way of computing a layer is fastest on this machine, among those that compute what tinygrad's
own kernels compute, asked once and kept in a file beside tinygrad's disk cache (path()).

  Way, TINYGRAD    how a layer is computed: tinygrad's kernels, or one of the engine's with its option
  CHOSEN           this process's choices (a Choices), which the layers ask as they are built
  fastest()        the mechanism: every candidate run, compared with tinygrad's, timed, the fastest kept
  activations()... what candidates are timed and compared on
"""
from __future__ import annotations
import contextlib, hashlib, importlib.metadata, inspect, math, os, pickle, sqlite3, sys
from typing import NamedTuple
import numpy as np
from tinygrad import Tensor, TinyJit, Device, Context, dtypes
from models.engine import internals, replay
from models.engine.device import say, why
from models.timing import best_seconds

class Way(NamedTuple):
  """How a layer is computed: by `kernel`, "tinygrad" (its own kernels: the formula) or one of the engine's, with its
  option: a lanes layout ("lanes"), the matvec kernel's (group, outputs) ("matvec"), the chunk length of attention's
  GPU design ("chunks"), the stats kernel's work-group size ("stats"); "rows" (attention's CPU design) and "row" (the
  norm kernel) have none."""
  kernel: str
  option: str|int|tuple|None = None
  def __str__(self) -> str: return self.kernel if self.option is None else f"{self.kernel} {self.option}"

TINYGRAD = Way("tinygrad")

class Choices:
  """The ways this process measured, by kind ("linear", "attention", "norm") and key; while a rule (a function of kind
  and key) is set by fixed(), it answers instead and nothing is measured."""
  def __init__(self): self.measured, self.rule = {"linear": {}, "attention": {}, "norm": {}}, None
  def way(self, kind:str, key:tuple) -> Way:
    return self.rule(kind, key) if self.rule is not None else self.measured[kind].get(key, TINYGRAD)
  def needs(self, kind:str, key:tuple) -> bool: return self.rule is None and key not in self.measured[kind]
  @contextlib.contextmanager
  def fixed(self, rule):
    saved, self.rule = self.rule, rule
    try: yield
    finally: self.rule = saved

CHOSEN = Choices()

# ***** the mechanism *****

PRUNE = 1.5   # a kernel's later options are measured only while its first is within this of the fastest so far
# timings of each candidate after the first (one call each, the first the best of 3), taken in turn: a burst of other
# work on the machine during one candidate's timing does not choose (docs/engine.md)
ROUNDS = 2

def fastest(kind:str, what:tuple, candidates:dict, name:str, dtype, family=lambda key: None, costs:dict|None=None,
            length:int=1):
  """The key of the fastest candidate whose outputs agree with the first's (the reference, tinygrad's own kernels),
  asked once per machine: kept under kind by machine_key(*what) (what holds the candidates' code: sources()). A
  candidate is a function that runs and returns (seconds, outputs, again), again() timing it once more: every candidate
  that agrees is timed ROUNDS more times, in turn after all ran, and keeps its fastest. One that fails to compile or
  run, or whose outputs differ by more than tolerance(dtype, length) (the reduction's length), drops out with one line
  on stderr naming it (name and its key) and why, and then nothing is cached: the next process measures again.
  Candidates of one family (family(key), not None) after its first are measured only while the first is within PRUNE
  of the fastest so far: options of a kernel that loses clearly are not all timed. costs, if given, receives every
  candidate's seconds (those that ran and agreed)."""
  disk = machine_key(*what)
  if (ret := cached(kind, disk)) is not None: return ret[0]
  reference, expected, failed, firsts, again = next(iter(candidates)), None, False, {}, {}
  costs = {} if costs is None else costs
  def pruned(f) -> bool: return f in firsts and costs.get(firsts[f], math.inf) > PRUNE * min(costs.values(), default=0)
  for key, fn in candidates.items():
    if (f := family(key)) is not None and pruned(f): continue
    try: seconds, outputs, again[key] = fn()
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
  for _ in range(ROUNDS):
    for key in costs: costs[key] = min(costs[key], again[key]())
  best = min(costs, key=costs.get) if costs else reference
  return best if failed else first_stored(kind, disk, (best,))[0]

def compile_together(outputs:list) -> None:
  """The kernels of these candidates (each a function returning its outputs, unrealized) compiled as one schedule:
  tinygrad lowers and compiles a schedule's new kernels in parallel (its pool of worker processes, one a core), where
  one candidate's at a time leave a core idle; each candidate's capture then finds them compiled. Where one fails to
  build, compile or run, its own capture says why."""
  tensors = []
  for fn in outputs:
    with contextlib.suppress(Exception): tensors += fn()
  with contextlib.suppress(Exception), Context(BEAM=0): Tensor.realize(*tensors)

def path() -> str|None:
  """Where measured choices are kept: SPEC_CHOICES (empty: nowhere, each process measures), by default beside
  tinygrad's disk cache; nowhere with CACHELEVEL=0. Its own file, not tinygrad's: the test suite, whose measurements
  share the cores among its workers, keeps its own (tests/conftest.py), and removing it measures everything again."""
  where = os.environ.get("SPEC_CHOICES", os.path.join(internals.cache_folder(), "spec-choices.db"))
  return where if where and internals.caching() else None

@contextlib.contextmanager
def database(where:str):
  """An SQLite connection to the choices at where, its table made, closed after."""
  os.makedirs(os.path.dirname(os.path.abspath(where)), exist_ok=True)
  db = sqlite3.connect(where, timeout=60, isolation_level=None)   # transactions begun and ended here
  try:
    db.execute("CREATE TABLE IF NOT EXISTS choices (kind TEXT, key TEXT, value BLOB, PRIMARY KEY (kind, key))")
    yield db
  finally: db.close()

def read(db, kind:str, key:str):
  """The value under kind and key in db, or None."""
  row = db.execute("SELECT value FROM choices WHERE kind = ? AND key = ?", (kind, key)).fetchone()
  return None if row is None else pickle.loads(row[0])

def cached(kind:str, key:str):
  """The choice kept under kind and key: one another process made on this machine, or None."""
  if (where := path()) is None: return None
  with database(where) as db: return read(db, kind, key)

def first_stored(kind:str, key:str, value):
  """value kept under kind and key unless a value is there already, and whichever is there then (read and written
  under the database's write lock), so that processes that measured the same at once all keep the first one stored,
  and choose, and name their steps (store.step_name()), alike."""
  if (where := path()) is None: return value
  with database(where) as db:
    db.execute("BEGIN IMMEDIATE")
    if (stored := read(db, kind, key)) is not None:
      db.execute("ROLLBACK")
      return stored
    db.execute("INSERT INTO choices VALUES (?, ?, ?)", (kind, key, pickle.dumps(value)))
    db.execute("COMMIT")
    return value

def machine_key(*what) -> str:
  """A disk-cache key for a measurement on this machine: tinygrad's version, the device, its compiler target, and
  what."""
  key = (importlib.metadata.version("tinygrad"), Device.DEFAULT, internals.target(), *what)
  return hashlib.sha256(repr(key).encode()).hexdigest()

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

def captured(fn, calls:list[tuple], timed:int=1, before=None, after=list):
  """fn (a list of Tensors, each realized apart: a layer's graph is scheduled once, its copies found in tinygrad's
  schedule cache) captured by a TinyJit on tinygrad's default kernels, on the first tuple of arguments in calls; its
  calls on the first `timed` timed (best of 3, each after before() where given; without before(), of as many as take
  SAMPLED, at most 30) and summed, each as a step's later calls run (replay.Shortcut, where it has one: TinyJit's own
  call adds more Python than a small layer's kernels differ by, docs/engine.md); the outputs of a call on each, then
  after()'s (what the call left behind); and a function that times it again, one call each (or as many as take
  SAMPLED)."""
  step = TinyJit(lambda *args: [t.realize() for t in fn(*args)])
  internals.capture_next(step)
  with Context(BEAM=0): step(*calls[0])
  def run(args):
    shortcut = replay.shortcut(step.captured, args)
    return (lambda: shortcut(args)) if shortcut else (lambda: step(*args))
  runs = [run(args) for args in calls[:timed]]
  def best(run, reps:int) -> float:
    first = best_seconds(run, reps, before)
    more = 0 if before else min(SAMPLES, int(SAMPLED / max(first, 1e-7))) - reps
    return min(first, best_seconds(run, more)) if more > 0 else first
  def seconds(reps:int=3) -> float: return sum(best(run, reps) for run in runs)
  return seconds(), [out for args in calls for out in [t.numpy() for t in step(*args)] + after()], lambda: seconds(1)

# a timing without a flush before each call takes the best of the calls that fill this, at most SAMPLES: best of 3, a
# small model's attention chose the slower of its ways (docs/engine.md)
SAMPLED, SAMPLES = 2e-3, 30

# ***** what candidates are timed and compared on *****

TIMED_BYTES = 64 << 20    # a candidate is timed over this many bytes of weights (or all of them): milliseconds a call
TIMED_LAYERS = 8          # and over at most this many layers: each is a capture's scheduling, a first run's cost
EVICT_BYTES = 256 << 20   # what a flush reads before each timed call: past every cache

def enough(tensors:list[Tensor]) -> list[Tensor]:
  """The first of tensors whose bytes reach TIMED_BYTES, at least one and at most TIMED_LAYERS: what a candidate is
  timed over, streaming from memory after a flush (evictor()) as in a pass, long enough that a call's launches are a
  small part of it (as many a layer as in a pass where the layers are small), short enough that a first run schedules
  and times few layers."""
  out, total = [], 0
  for t in tensors:
    if total >= TIMED_BYTES or len(out) == TIMED_LAYERS: break
    out.append(t); total += t.nbytes()
  return out

def evictor():
  """A function that reads EVICT_BYTES of the device's memory through a buffer of its own (held while the function
  is): run ahead of a timed call, it leaves none of the weights timed in a cache (a CPU's last level, a GPU's L2), so
  that they stream from memory as in a pass, also a small model's, whose one role a cache would hold."""
  evict, held = TinyJit(lambda x: x.sum().realize()), []
  def run():
    # made at the first call (a choice read from the disk times nothing); written: untouched pages all read one page
    if not held: held.append(Tensor.zeros(EVICT_BYTES // 4).contiguous().realize())
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

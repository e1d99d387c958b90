"""One native call a step on tinygrad's CPU backend: a captured step's kernels run in order by a small C runner, each
kernel's thread splits shared among the cores.

replay.py's graph still calls each kernel from Python (a few microseconds each), and tinygrad's CPU backend runs a
kernel's thread splits one after another on one core. Here the step's kernels become a table of commands (the kernel's
address, its arguments, its thread splits), prepared at capture; a call writes what changes (the input buffers' and the
variables' values) into the table and makes one call into the runner, which walks the table on every core: each
thread claims a kernel's splits until none is left and waits until all are done before the next kernel, so a thread
that has not woken (or was descheduled) is not waited for: the others take its splits. The runner is compiled once per
machine (tinygrad's disk cache); its kernels are the step's own, as tinygrad compiled them, so its outputs are its
executor's to the bit. Whether it is faster than replay.py is measured per step (choose()); a prefill's pass runs on it
untimed.
"""
from __future__ import annotations
import ctypes, functools, hashlib, os, pathlib, platform, subprocess, sys, tempfile, time
import numpy as np
from tinygrad import Tensor, Device
from models.engine import choice, internals
from models.engine.device import say, why
from models.engine.replay import LOCK, Replay
from models.timing import timed

MAX_ARGS, HEADER = 63, 6   # tinygrad's CPU programs take at most 63 arguments; a command's words before them
SPIN_US = 200   # how long the runner's threads wait for the next step or a kernel's splits before they sleep or yield
WORD = 2**64 - 1   # a variable's value as a 64-bit word, as tinygrad passes it (ctypes.c_uint64 wraps a negative one)

def source(max_args:int=MAX_ARGS) -> str:
  """The runner in C: run(table) walks a table of commands (its first word their number), each [kernel, arguments n,
  thread splits, the argument slot of the split's index (-1: none), splits claimed, splits done, arguments...], on
  threads() threads: each thread claims a command's splits until none is left, then waits until all are done. A thread
  that has not woken is not waited for: the others take its splits."""
  def case(n:int) -> str:
    types, args = ", ".join(["u64"] * n) or "void", ", ".join(f"a[{i}]" for i in range(n))
    return f"    case {n}: ((void(*)({types}))f)({args}); break;"
  calls = "\n".join(map(case, range(max_args + 1)))
  return f"""#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sched.h>
#include <unistd.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
typedef uint64_t u64;
/* a waiting thread's loop pauses: a core that spins flat out takes power (and on some CPUs issue slots) from the one
   running the step or Python */
#if defined(__x86_64__) || defined(__i386__)
#define relax() __builtin_ia32_pause()
#elif defined(__aarch64__) || defined(__arm__)
#define relax() __asm__ volatile("yield")
#else
#define relax() ((void)0)
#endif
static void call(u64 f, int n, const u64 *a) {{
  switch (n) {{
{calls}
    default: abort();   /* never: a table holds at most max_args arguments a command (Native) */
  }}
}}
static u64 *_Atomic table; static int threads = 1, started; static pid_t owner;
static atomic_uint generation, finished, inside;
static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER; static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static u64 now_us(void) {{
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000ull + t.tv_nsec / 1000;
}}
static void walk(u64 *t) {{
  u64 *c = t + 1;
  for (u64 i = 0; i < t[0]; i++) {{
    int n = (int)c[1], slot = (int)(int64_t)c[3];
    u64 splits = c[2], s, args[{max_args + 1}];
    _Atomic u64 *claimed = (_Atomic u64 *)&c[4], *done = (_Atomic u64 *)&c[5];
    while ((s = atomic_fetch_add(claimed, 1)) < splits) {{
      memcpy(args, c + {HEADER}, n * sizeof(u64));
      if (slot >= 0) args[slot] = s;
      call(c[0], n, args);
      atomic_fetch_add(done, 1);
    }}
    if (atomic_load(done) < splits) {{   /* the next command reads what this one's splits write */
      u64 start = now_us();
      for (unsigned k = 1; atomic_load(done) < splits; k++) {{
        relax();
        if (!(k & 255) && now_us() - start > {SPIN_US}) sched_yield();   /* a partner descheduled: let it run */
      }}
    }}
    c += {HEADER} + n;
  }}
}}
static void *worker(void *arg) {{
  unsigned seen = 0;
#ifdef __linux__
  prctl(PR_SET_NAME, "spec-native");   /* the name ps, top and the tests see */
#endif
  for (;;) {{
    u64 start = now_us();
    for (unsigned i = 1; atomic_load(&generation) == seen; i++) {{
      relax();
      if (!(i & 255) && now_us() - start > {SPIN_US}) {{
        pthread_mutex_lock(&mutex);
        while (atomic_load(&generation) == seen) pthread_cond_wait(&wake, &mutex);
        pthread_mutex_unlock(&mutex);
      }}
    }}
    seen = atomic_load(&generation);
    atomic_fetch_add(&inside, 1);   /* a run that finished before this thread woke is left alone */
    if (atomic_load(&finished) != seen) walk(atomic_load(&table));
    atomic_fetch_sub(&inside, 1);
  }}
  return 0;
}}
int start(int n) {{
  if (started && owner == getpid()) return threads;
  /* a first call, or in a forked child: the parent's threads are not here, and its mutex may have been held */
  pthread_mutex_init(&mutex, 0); pthread_cond_init(&wake, 0);
  threads = n < 1 ? 1 : n; started = 1; owner = getpid();
  atomic_store(&generation, 0); atomic_store(&finished, 0); atomic_store(&inside, 0);
  /* the threads block every signal (they inherit the mask) but a fault's own: Python handles a signal only on its main
     thread, and one caught on another thread waits until that thread notices it; a fault (a kernel's bad address) is
     the faulting thread's, where Python's fault handler reports it */
  sigset_t all, old;
  sigfillset(&all);
  int faults[] = {{SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP}};
  for (unsigned i = 0; i < sizeof(faults) / sizeof(*faults); i++) sigdelset(&all, faults[i]);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  for (int t = 1; t < threads; t++) {{
    pthread_t thread;
    if (pthread_create(&thread, 0, worker, (void *)(intptr_t)t)) {{ threads = t; break; }}
    pthread_detach(thread);
  }}
  pthread_sigmask(SIG_SETMASK, &old, 0);
  return threads;
}}
void run(u64 *t) {{
  if (owner != getpid()) start(threads);
  u64 *c = t + 1;
  for (u64 i = 0; i < t[0]; i++) {{ c[4] = c[5] = 0; c += {HEADER} + c[1]; }}   /* no other thread is in a walk */
  if (threads > 1) {{
    atomic_store(&table, t);
    pthread_mutex_lock(&mutex);
    atomic_fetch_add(&generation, 1);
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&mutex);
  }}
  walk(t);
  if (threads > 1) {{
    atomic_store(&finished, atomic_load(&generation));
    while (atomic_load(&inside)) sched_yield();   /* a thread still in the walk reads the table: wait till it leaves */
  }}
}}
"""

_runner = None

def runner():
  """The runner's library, compiled once per machine into tinygrad's cache folder and loaded once per process, its
  threads started (tinygrad's thread count: NUM_CPU_THREADS); named by its code, compiler and architecture (a home
  folder shared by x86 and Arm machines holds one of each)."""
  global _runner
  if _runner is None:
    code, cc, arch = source(), os.environ.get("CC", "clang"), platform.machine()
    name = hashlib.sha256((code + cc + sys.platform + arch).encode()).hexdigest()[:16]
    lib = pathlib.Path(internals.cache_folder()) / "spec-native" / f"runner-{arch}-{name}.so"
    if not lib.is_file():
      lib.parent.mkdir(parents=True, exist_ok=True)
      with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
        out = pathlib.Path(tmp) / lib.name
        subprocess.run([cc, "-shared", "-fPIC", "-O2", "-pthread", "-x", "c", "-", "-o", str(out)], input=code.encode(),
                       check=True, capture_output=True)
        os.replace(out, lib)
    _runner = ctypes.CDLL(str(lib))
    _runner.run.argtypes, _runner.run.restype = [ctypes.c_void_p], None
    _runner.start.argtypes, _runner.start.restype = [ctypes.c_int], ctypes.c_int
    _runner.start(internals.cpu_threads())
  return _runner

@functools.cache
def fits(device:str) -> bool:
  """tinygrad's CPU backend with its C renderer (its programs are functions taking each argument as a 64-bit word),
  off Windows (another calling convention), and the runner compiles and loads; where it does not, one line on stderr
  says why and replay.py replays the steps."""
  if sys.platform == "win32" or not internals.runs_c_functions(device): return False
  try: runner()
  except Exception as e:
    say(f"native.py's step runner cannot run on {device} ({why(e)}): replay.py replays the steps")
    return False
  return True

class Native(Replay):
  """replay.py's batch as one table of commands for the runner; `native` False replays it as replay.py does, and so
  does a batch with a kernel of more arguments than the runner passes (`fits` False)."""
  native = True
  def __init__(self, linear, input_uops=()):
    super().__init__(linear, input_uops)
    words, self.base = [len(self.launches)], []
    for program, bufs, (global_size, _), vals in self.launches:
      self.base.append(len(words) + HEADER)
      address, split_slot = internals.c_entry(program)
      args = [internals.address(b) for b in bufs] + [(v or 0) & WORD for v in vals]   # the split's index: the runner's
      splits = global_size[0] if split_slot >= 0 else 1
      words += [address, len(args), splits, split_slot & WORD, 0, 0, *args]   # 0, 0: splits claimed and done
    self.fits = all(len(bufs) + len(vals) <= MAX_ARGS for _, bufs, _, vals in self.launches)
    if not self.fits: self.native = False
    self.table, self.inputs_written = np.array(words, dtype=np.uint64), None
    self.lib, self.ptr = runner(), self.table.ctypes.data
    # the variables' slots in the table (after a kernel's buffers), and which of a call's values each takes
    self.var_slots = np.array([self.base[j] + len(self.launches[j][1]) + i for j, i, _ in self.variable_slots],
                              dtype=np.intp)
    self.var_index = np.array([k for _, _, k in self.variable_slots], dtype=np.intp)

  def __call__(self, input_uops, var_vals, wait=False) -> float|None:
    if not self.native or self.sizes_vary: return super().__call__(input_uops, var_vals, wait)
    with LOCK:   # the runner's table and threads are the process's: one step at a time
      if input_uops is not self.inputs_written:   # a shortcut passes its own list, of the same buffers, every call
        for j in self.reading_inputs:
          handles = self.handles_of(j, input_uops)
          self.table[self.base[j]:self.base[j] + len(handles)] = [internals.address(h) for h in handles]
        self.inputs_written = input_uops
      if len(self.var_slots):
        values = np.array([v & WORD for v in self.values(var_vals)], dtype=np.uint64)
        self.table[self.var_slots] = values[self.var_index]
      t0 = time.perf_counter()
      self.lib.run(self.ptr)   # returns when every kernel has run
      return time.perf_counter() - t0 if wait else None

def graphs(captured) -> list[Native]:
  """A captured step's batches that run as Native."""
  return [g for g in internals.batches(captured) if isinstance(g, Native)]

def choose(captured, run, name:str) -> bool|None:
  """Whether a step's batches run natively: the faster of the runner and replay.py, each timed on run() (a call of the
  step, each way 1 + choice.ROUNDS times in turn, its fastest kept: a runner's first call wakes its threads, and one
  burst of other work in its second chose replay.py; its outputs from its first), once per machine and step (name:
  store.step_name()); None where none is Native.
  The runner runs the step's own kernels: its outputs must be replay.py's to the bit, else replay.py runs it, and one
  line says so. Batches that do not fit the runner (`fits`) are replayed whatever is chosen."""
  if not (batches := graphs(captured)): return None
  disk = choice.machine_key("native", name, source(), choice.sources(__name__), internals.cpu_threads())
  if (way := choice.cached("spec_native", disk)) is None:
    seconds, outputs = {False: [], True: []}, {}
    for way in (False, True) * (1 + choice.ROUNDS):
      for g in batches: g.native = way and g.fits
      cost, ret = timed(run)
      seconds[way].append(cost)
      outputs.setdefault(way, [t.numpy().tobytes() for t in tensors(ret)])
    if outputs[True] != outputs[False]:
      say(f"native.py's runner computes other values than replay.py for a step on {Device.DEFAULT}: replayed")
      way = False
    else: way = choice.first_stored("spec_native", disk, min(seconds[True]) < min(seconds[False]))
  for g in batches: g.native = way and g.fits
  return way

def tensors(ret) -> list:
  """The Tensors a step returns (one, or a tuple of them and None)."""
  return [t for t in (ret if isinstance(ret, (tuple, list)) else (ret,)) if isinstance(t, Tensor)]

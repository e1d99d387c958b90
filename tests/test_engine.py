"""The engine (models/engine/): each kernel against the formula it replaces, measured choices, the replay graph, the
stored steps, the fallback where a kernel cannot run, and the engine against the port alone (plain)."""
import contextlib, itertools, json, os, pathlib, signal, struct, subprocess, sys, threading, time, types
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, UOp, Device, Context, dtypes, nn
from tinygrad.engine.realize import get_graph_runtime
from tinygrad.uop.ops import AxisType, KernelInfo, Ops
from tinygrad.codegen import to_program_cache
from tinygrad.helpers import GlobalCounters, NUM_CPU_THREADS
import models, spec
from models import GPT2, GPT2Config, engine
from models.engine import attention, choice, device, internals, lanes, linear, matvec, native, norm, replay, store
from models.engine.choice import CHOSEN, TINYGRAD, Way
from conftest import ROOT, TINY, dtype, load, np_gpt2_logits, random_weights, shared_dir, tolerance, write_checkpoint

def logits(model, tokens, start_pos=0) -> np.ndarray:
  return model.forward(Tensor([tokens], dtype=dtypes.int32), start_pos).numpy()

def assert_close(actual, expected):
  """Agreement relative to the logit scale, within the suite's dtype's tolerance."""
  err = np.abs(actual - expected).max() / np.abs(expected).max()
  assert err < tolerance(), f"max error {err:.2e} of the logit scale"

@pytest.fixture
def disk(monkeypatch):
  """tinygrad's disk cache of measured choices, empty and this test's own."""
  table = {}
  monkeypatch.setattr(choice, "cached", lambda kind, key: table.get((kind, key)))
  monkeypatch.setattr(choice, "first_stored", lambda kind, key, val: table.setdefault((kind, key), val))
  return table

def fresh_choices(monkeypatch) -> None:
  """This process's choices empty meanwhile, and the widths where the matvec kernel lost: the next choice measures it
  all."""
  monkeypatch.setattr(CHOSEN, "measured", {kind: {} for kind in CHOSEN.measured})
  monkeypatch.setattr(linear, "matvec_outpaced", set())

def layer(H:int, P:int, D:int, cache:Tensor|None=None) -> models.gpt2.Attention:
  """An attention layer of H heads of D over P positions, its cache given."""
  attn = models.gpt2.Attention(GPT2Config(n_layer=1, n_head=H, n_embd=H * D, n_positions=P), dtypes.float32)
  if cache is not None: attn.cache_kv = cache
  return attn

def runner_way(monkeypatch, way:bool) -> None:
  """Every step's batches run by native.py's runner (way True) or as replay.py replays them, nothing measured."""
  def forced(captured, run, name):
    for g in native.graphs(captured): g.native = way
    return way
  monkeypatch.setattr(native, "choose", forced)

@pytest.mark.backend
def test_steps_replay_their_kernels_as_tinygrads_executor_runs_them(tiny_dir, monkeypatch):
  """A captured step on a device without a graph of its own runs as models/engine/replay.py's batches, and computes what
  tinygrad's own executor computes (JIT=2: no graph) to the bit, as its input buffer, start position and widths change
  (each call where the cache ends: a position never written holds whatever its memory held). Where native.py's runner
  fits the device (tinygrad's CPU backend) both ways run: the runner, with kernels split over the cores, and replay;
  a prefill's pass, once per prompt, runs on the runner untimed (its kernels split over the cores), either way."""
  seq = [int(t) for t in np.random.default_rng(9).integers(0, 64, 40)]
  def run(model, jit:int) -> list[np.ndarray]:
    with Context(JIT=jit):
      model.prefill(seq[:4])
      return [model(seq[p:p+w], p).numpy() for p, w in ((4, 1), (5, 5), (10, 1), (11, 3), (14, 1), (15, 5), (20, 1))]
  theirs = load(tiny_dir / "target")
  expected = run(theirs, 2)
  calls = lambda model: [call.src[0] for step in model.jits.values() for call in step.captured.linear.src]
  for way in [True, False] if native.fits(Device.DEFAULT) else [None]:
    if way is not None: runner_way(monkeypatch, way)
    ours = load(tiny_dir / "target")
    got = run(ours, 1)
    for a, b in zip(got, expected): np.testing.assert_array_equal(a, b)
    graphs = [c for c in calls(ours) if c.op is Ops.CUSTOM_FUNCTION and c.arg == "graph"]
    assert graphs and not any(c.op is Ops.CUSTOM_FUNCTION for c in calls(theirs))
    if Device[Device.DEFAULT].graph is None:   # replay.py's device
      assert all(isinstance(get_graph_runtime(g), replay.Replay) for g in graphs)
    if way is not None:
      batches = {name: [b for key, step in ours.jits.items() if key[0] == name for b in native.graphs(step.captured)]
                 for name in ("fill", "forward")}
      assert sum(map(len, batches.values())) == len(graphs) and {key[0] for key in ours.jits} == batches.keys()
      assert all(b.native is way for b in batches["forward"]) and all(b.native for b in batches["fill"])
      batches = batches["forward"] + batches["fill"]
      # kernels split over the cores, which the runner's threads share (the lanes kernel, attention's 2 heads)
      assert NUM_CPU_THREADS.value == 1 or max(launch[2][0][0] for b in batches for launch in b.launches) > 1

@pytest.mark.backend
@pytest.mark.quick
def test_a_step_called_again_on_its_inputs_skips_tinygrads_jit(tiny_dir, monkeypatch):
  """A captured step called again on the same input Tensors runs its replay batches directly (replay.Shortcut), not
  through TinyJit's call, and computes what TinyJit's call computes to the bit as the bound position moves; new input
  Tensors go through TinyJit once, then have a shortcut of their own, and the first ones keep theirs (on native.py's
  runner, which writes the inputs' addresses into its table only for another list of them, and on replay.py). A call
  on the same Tensors without the bound position fails as TinyJit's does: a shortcut never replays another call's
  values."""
  from tinygrad.engine.jit import _TinyJit
  seq = [int(t) for t in np.random.default_rng(5).integers(0, 64, 12)]
  entered, plain_call = [], _TinyJit.__call__
  def spied(self, *args, **kwargs):
    if entered: entered[-1] = True   # a step's call of this test's, not the prefill's
    return plain_call(self, *args, **kwargs)
  monkeypatch.setattr(_TinyJit, "__call__", spied)
  def run() -> tuple[list[np.ndarray], list[bool]]:
    entered.clear()
    model = load(tiny_dir / "target")
    model.prefill(seq[:4])
    step, xs, out = model.jit(GPT2.forward, 1), [Tensor([[t]], dtype=dtypes.int32).realize() for t in seq[4:6]], []
    for pos, i in ((4, 0), (5, 0), (6, 0), (7, 1), (8, 1), (9, 0), (10, 1)):
      entered.append(False)
      out.append(step(model, xs[i], model.positions.bind(pos)).numpy())
    return out, list(entered)
  ways = {}
  for way in [True, False] if native.fits(Device.DEFAULT) else [None]:
    if way is not None: runner_way(monkeypatch, way)
    with monkeypatch.context() as patched:
      got, through_jit = run()
      assert through_jit == [True, False, False, True, False, False, False]
      model = load(tiny_dir / "target")
      step, x = model.jit(GPT2.forward, 1), Tensor([[seq[4]]], dtype=dtypes.int32).realize()
      for pos in (8, 9, 9): step(model, x, model.positions.bind(pos))
      with pytest.raises(Exception, match="start_pos"): step(model, x, 5)   # as TinyJit refuses it, never at 9
      patched.setattr(replay, "shortcut", lambda captured, args: None)
      expected, through_jit = run()
    assert all(through_jit)
    for a, b in zip(got, expected): np.testing.assert_array_equal(a, b, err_msg=f"runner: {way}")
    assert len({a.tobytes() for a in got}) == len(got), "the same logits at another position"
    ways[way] = got
  for a, b in zip(ways.get(True, []), ways.get(False, [])):
    np.testing.assert_array_equal(a, b, err_msg="the runner's against replay.py's")

def test_a_step_runs_natively_where_the_runner_measures_faster(monkeypatch, disk, capfd):
  """native.choose() times a step by both ways (its batches run by the runner, or as replay.py replays them) and keeps
  the faster, once per machine and step: a second process measures nothing; another step measures again. A batch the
  runner cannot take (a kernel of too many arguments) replays whatever is chosen; a runner whose outputs are not
  replay.py's to the bit is not chosen, with one line."""
  batches = [types.SimpleNamespace(native=None, fits=True) for _ in range(2)] + [types.SimpleNamespace(native=None,
                                                                                                         fits=False)]
  monkeypatch.setattr(native, "graphs", lambda captured: batches)
  timed, wrong = [], []
  run = lambda: Tensor([1.0, 2.0 + (batches[0].native and bool(wrong))])
  def costs(replay_s, native_s):
    seconds = lambda run: (timed.append(batches[0].native) or (native_s if batches[0].native else replay_s), run())
    monkeypatch.setattr(native, "timed", seconds)
  costs(2e-3, 1e-3)
  assert native.choose(None, run, "step a") is True and [b.native for b in batches] == [True, True, False] and timed
  assert timed == [False, True] * (1 + choice.ROUNDS), "each way timed in turn, as often as the other choices"
  timed.clear(); costs(1e-3, 2e-3)
  assert native.choose(None, run, "step a") is True and timed == [], "measured again"
  assert native.choose(None, run, "step b") is False and all(b.native is False for b in batches)
  assert set(timed) == {True, False}
  # a burst of other work in the runner's first two timings (its threads waking) does not choose replay.py
  bursts = iter([2e-3, 5e-3, 2e-3, 5e-3, 2e-3, 1e-3])
  monkeypatch.setattr(native, "timed", lambda run: (timed.append(batches[0].native) or next(bursts), run()))
  assert native.choose(None, run, "step e") is True
  wrong.append(True); costs(2e-3, 1e-3)
  stored = len(disk)
  assert native.choose(None, run, "step c") is False and all(b.native is False for b in batches)
  assert "computes other values than replay.py" in capfd.readouterr().err
  assert len(disk) == stored, "a wrong runner's choice was cached"
  monkeypatch.setattr(native, "graphs", lambda captured: [])
  assert native.choose(None, run, "step d") is None

def test_the_runners_threads_leave_every_signal_to_python():
  """native.py's runner threads block every signal, so that the kernel hands a Ctrl-C to Python's own thread: Python
  handles a signal only on its main thread, and one a runner thread caught would wait for that thread to notice it.
  Linux shows each thread's blocked signals and name in /proc."""
  if not (native.fits(Device.DEFAULT) and pathlib.Path("/proc/self/task").is_dir()):
    pytest.skip("the runner runs only on tinygrad's CPU backend; threads' signal masks are read from Linux's /proc")
  native.runner()
  named = lambda: [t for t in pathlib.Path("/proc/self/task").iterdir()
                   if (t / "comm").read_text().strip() == "spec-native"]
  for _ in range(100):   # a thread names itself as it starts
    if len(tasks := named()) == NUM_CPU_THREADS.value - 1: break
    time.sleep(0.05)
  blocked = lambda task: int(next(l for l in (task / "status").read_text().splitlines() if l.startswith("SigBlk:"))
                             .split()[1], 16)
  assert len(tasks) == NUM_CPU_THREADS.value - 1
  assert all(blocked(t) >> (signal.SIGINT - 1) & 1 and blocked(t) >> (signal.SIGTERM - 1) & 1 for t in tasks)
  assert not blocked(pathlib.Path(f"/proc/self/task/{threading.get_native_id()}")) >> (signal.SIGINT - 1) & 1

def test_the_runner_takes_the_splits_of_a_thread_that_lags(tiny_dir):
  """native.py's runner shares a kernel's splits among its threads as each claims them, so that a thread that has not
  woken, or was descheduled, is not waited for: the caller takes its splits, and the thread joins the run where it
  is. With its thread starved (pinned to the caller's core at Linux's lowest priority, SCHED_IDLE: it runs while the
  caller waits, and runs late) the steps compute what replay.py computes, to the bit, and a run returns only once
  every kernel has run: each of its commands' splits claimed and done, each once."""
  if not (native.fits(Device.DEFAULT) and hasattr(os, "SCHED_IDLE") and pathlib.Path("/proc/self/task").is_dir()):
    pytest.skip("the runner runs only on tinygrad's CPU backend; a thread is starved through Linux's scheduler")
  out = subprocess.run([sys.executable, "-c", f"""
import os, pathlib, sys
import numpy as np
sys.path.insert(0, {str(ROOT)!r})
import models
from models.engine import native
seq = [int(t) for t in np.random.default_rng(3).integers(0, 64, 40)]
def run(way):
  native.choose = lambda captured, run, name: [setattr(g, "native", way) for g in native.graphs(captured)] and way
  model = models.load({str(tiny_dir / "target")!r}, {dtype()!r})
  model.prefill(seq[:4])
  got = [model(seq[p:p + 1], p).numpy() for p in range(4, 36)]
  return got, [g for step in model.jits.values() for g in native.graphs(step.captured)]
expected, _ = run(False)
core = min(os.sched_getaffinity(0))
os.sched_setaffinity(0, {{core}})
native.runner()
for task in pathlib.Path("/proc/self/task").iterdir():
  if (task / "comm").read_text().strip() == "spec-native":
    os.sched_setaffinity(int(task.name), {{core}})
    os.sched_setscheduler(int(task.name), os.SCHED_IDLE, os.sched_param(0))
got, graphs = run(True)
assert all(g.native for g in graphs) and any(len(g.launches) > 1 for g in graphs)
for a, b in zip(got, expected): np.testing.assert_array_equal(a, b)
for g in graphs:
  for base in g.base:
    splits, claimed, done = g.table[base - 4], g.table[base - 2], g.table[base - 1]
    assert done == splits and claimed >= splits, (splits, claimed, done)
print("same")"""], env={**os.environ, "NUM_CPU_THREADS": "2"}, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0 and out.stdout.split()[-1:] == ["same"], out.stderr[-3000:]

@pytest.mark.backend
def test_two_threads_stepping_at_once_get_the_logits_each_gets_alone(tiny_dir, monkeypatch):
  """Two models stepped from two Python threads at once compute, to the bit, what each computes stepped alone, by the
  native runner (one table, threads and barrier for the process) and by replay.py (OpenCL's kernels, shared by steps
  of the same code, take their arguments as they are enqueued): one batch at a time. The steps' calls hit their
  shortcuts (no tinygrad scheduling in the threads)."""
  seq = [int(t) for t in np.random.default_rng(11).integers(0, 64, 40)]
  positions = list(range(4, 36))
  for way in [True, False] if native.fits(Device.DEFAULT) else [None]:
    if way is not None: runner_way(monkeypatch, way)
    pair = [load(tiny_dir / name) for name in ("target", "draft")]
    steps = [m.jit(GPT2.forward, 1) for m in pair]
    xs = [Tensor([[seq[i]]], dtype=dtypes.int32).realize() for i in range(2)]
    def run(i, out, read=contextlib.nullcontext()):
      model, step = pair[i], steps[i]
      for pos in positions:
        ret = step(model, xs[i], model.positions.bind(pos))
        with read: out.append(ret.numpy())
    for m in pair: m.prefill(seq[:4])
    alone = [[], []]
    for i in range(2): run(i, alone[i])
    for m in pair: m.prefill(seq[:4])
    together, read, start = [[], []], threading.Lock(), threading.Barrier(2)
    threads = [threading.Thread(target=lambda i=i: (start.wait(), run(i, together[i], read))) for i in range(2)]
    for t in threads: t.start()
    for t in threads: t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), f"the steps hung (runner: {way})"
    for a, b in zip(alone, together):
      assert len(a) == len(b) == len(positions)
      for x, y in zip(a, b): np.testing.assert_array_equal(x, y)

@pytest.mark.backend
def test_negative_and_64_bit_variables_reach_the_kernels_as_tinygrad_passes_them():
  """A bound variable's value reaches a step's kernels as tinygrad's executor passes it, negative or past 32 bits,
  by native.py's runner and by replay.py alike (NumPy 2 refuses a negative value as an unsigned word)."""
  offset = UOp.variable("offset", -2**40, 2**40)
  x = Tensor(np.arange(4, dtype=np.float32)).realize()
  twice = lambda x, o: ((x + Tensor(o).float()).contiguous() * 2 + Tensor(o).float()).realize()
  values = (1, 2, -3, -5, 2**33, -2**33)
  for runner in [native.Native, replay.Replay] if native.fits(Device.DEFAULT) else [replay.Replay]:
    step = TinyJit(twice)
    with replay.graph(Device.DEFAULT, runner): got = [step(x, offset.bind(v)).numpy() for v in values]
    for v, g in zip(values, got):
      v32 = np.float32(v)
      np.testing.assert_array_equal(g, (np.arange(4, dtype=np.float32) + v32) * 2 + v32, err_msg=f"{runner} {v}")
    if runner is native.Native: assert [g.native for g in native.graphs(step.captured)] == [True]

def test_the_runner_stops_on_a_fault_or_too_many_arguments_as_pythons_fault_handler_reports():
  """A kernel that faults on one of the runner's threads (a bad address) stops the process as Python's fault handler
  reports it, on that thread ("Fatal Python error"), not silently; a command of more arguments than the runner passes
  aborts, never runs a kernel without its arguments. The runner's library is named for its architecture."""
  if not native.fits(Device.DEFAULT): pytest.skip("the runner runs only on tinygrad's CPU backend")
  import platform
  assert f"runner-{platform.machine()}-" in native.runner()._name
  run = lambda words: subprocess.run([sys.executable, "-c", f"""
import ctypes, faulthandler, sys
import numpy as np
sys.path.insert(0, {str(ROOT)!r})
faulthandler.enable()
from models.engine import native
memset = ctypes.cast(ctypes.CDLL(None).memset, ctypes.c_void_p).value
table = np.array({words}, np.uint64)
native.runner().run(table.ctypes.data)
print("ran")"""], env={**os.environ, "NUM_CPU_THREADS": "2"}, capture_output=True, text=True, timeout=120)
  # one command, memset(NULL, 0, split): split 0 writes nothing, split 1 faults (on whichever thread claims it)
  fault = run("[1, memset, 3, 2, 2, 0, 0, 0, 0, 0]")
  assert fault.returncode != 0 and "Fatal Python error: Segmentation fault" in fault.stderr, fault.stderr[-2000:]
  many = run(f"[1, memset, {native.MAX_ARGS + 1}, 1, 2**64 - 1, 0, 0] + [0] * {native.MAX_ARGS + 1}")
  assert many.returncode != 0 and "ran" not in many.stdout and "Fatal Python error: Aborted" in many.stderr, many

def test_the_native_runner_steps_aside_with_one_line_where_it_cannot_run(tiny_dir, monkeypatch, capfd):
  """Where native.py's runner does not compile or load (no C compiler, say), one line on stderr says so and why, the
  steps are replayed by replay.py, and the logits are a numpy GPT-2's. On a device the runner never fits (a GPU,
  OpenCL) nothing is said."""
  from tinygrad.runtime.ops_cpu import CPUProgram
  monkeypatch.setenv("SPEC_STEP_CACHE", "")
  def broken(): raise OSError("no compiler here")
  monkeypatch.setattr(native, "runner", broken)
  native.fits.cache_clear()
  seq = [int(t) for t in np.random.default_rng(4).integers(0, 64, 6)]
  try:
    model = load(tiny_dir / "target")
    model.prefill(seq[:5])
    got = [model(seq[5:], 5).numpy() for _ in range(3)][-1]
  finally: native.fits.cache_clear()
  assert_close(got, np_gpt2_logits(random_weights(TINY, seed=1), TINY["n_head"], seq)[5:])
  lines = [l for l in capfd.readouterr().err.splitlines() if "runner" in l]
  if Device[Device.DEFAULT].runtime_t is CPUProgram:
    assert len(lines) == 1 and "cannot run" in lines[0] and "no compiler here" in lines[0], lines
  else: assert lines == []
  assert not [b for step in model.jits.values() for b in native.graphs(step.captured)]

C_LAYOUTS = ("row_ahead", "wide_ahead", "vectors", "vectors_wide")   # the lanes layouts whose kernels hold C

def lanes_programs() -> set[str]: return {p.arg.name for p in to_program_cache.values() if p.arg.name.startswith("lanes_")}

def lanes_prefetching() -> dict[str, bool]:
  """Whether each compiled lanes kernel's source asks for its weight's next rows (__builtin_prefetch)."""
  return {p.arg.name: "__builtin_prefetch" in p.src[2].arg for p in to_program_cache.values()
          if p.arg.name.startswith("lanes_")}

def lanes_rows_dtypes(T:int, vectors:bool) -> set:
  """The dtypes of the rows (the second buffer) that the lanes kernels of T rows read, the vectors layout's or the
  others'."""
  programs = [p for p in to_program_cache.values() if p.arg.name.startswith("lanes") and
              p.arg.name.split("_")[-3] == str(T) and ("_vectors_" in p.arg.name) == vectors]
  return {u.dtype for p in programs for u in p.src[0].toposort() if u.op is Ops.PARAM and u.arg.slot == 1}

@pytest.mark.backend
@pytest.mark.parametrize("T", [pytest.param(1, marks=pytest.mark.gpu), 2, 3, pytest.param(5, marks=pytest.mark.gpu), 9, 16])
def test_lanes_kernel_computes_the_matmul(T):
  """The lanes kernel in each layout is x @ w.T (+ b) (+ a residual) for every width a step may run (its rows in
  chunks: 9 = 3 x 3, 16 = 2 x 8), in the suite's dtype: inputs in it, float32 inside, the result in the output dtype.
  The kernel reads its rows in float32: where rows and weights were both half, clang converted and multiplied one
  element at a time; the vectors layouts in their dtype, converted a vector at a time (half rows: the MLP's hidden)."""
  rng, prefetches = np.random.default_rng(T), internals.runs_c_functions(Device.DEFAULT)
  for N, C in ((96, 32), (64, 64), (256, 128), (98, 48)):
    x, w, b, r = (Tensor(rng.standard_normal(shape).astype(np.float32)).cast(dtype()).realize()
                  for shape in ((1, T, C), (N, C), (N,), (1, T, N)))
    expected = x.float().numpy().astype(np.float64) @ w.float().numpy().astype(np.float64).T
    bias64 = b.float().numpy().astype(np.float64)
    layouts = [l for l in lanes.LAYOUTS if lanes.fits(N, C, l, Device.DEFAULT)]
    fitting = {(98, 48): ["row", "row_ahead", "vectors"],
               (64, 64): ["lanes", "four", "row", "wide", "row_ahead", "wide_ahead", "vectors", "vectors_wide"]}
    assert layouts == [l for l in fitting.get((N, C), lanes.LAYOUTS) if prefetches or l not in C_LAYOUTS]
    x32 = x.float().realize()
    for layout, out in itertools.product(layouts, (None, dtypes.float32)):
      got = lanes.linear(x, w, out, layout)
      assert got.shape == (1, T, N) and got.dtype == (out or x.dtype)
      if layout in lanes.VECTORS and out is dtypes.float32:   # float32 rows to float32 sums, contiguous (the logits)
        for bias in ([], [b]):   # and with a bias, added inside (c_attn's float32 qkv)
          kernels = GlobalCounters.kernel_count
          lanes.linear(x32, w, out, layout, *bias).contiguous().realize()
          assert GlobalCounters.kernel_count - kernels == 1, ("the vectors layout's sums copied", bias)
      assert np.abs(got.float().numpy() - expected).max() / np.abs(expected).max() < tolerance(), (layout, out)
      with_bias = lanes.linear(x, w, out, layout, b).float().numpy()
      assert np.abs(with_bias - (expected + bias64)).max() / np.abs(expected).max() < tolerance(), (layout, out, "bias")
      for bias, plus in ((None, 0), (b, bias64)):   # and a residual added (the vectors layout: inside, in one kernel)
        residual = r.cast(out or x.dtype).realize()
        kernels = GlobalCounters.kernel_count
        with_residual = lanes.linear(x32, w, out, layout, bias, residual=residual).realize()
        assert layout not in lanes.VECTORS or GlobalCounters.kernel_count - kernels == 1, ("the residual's", bias)
        want = expected + plus + r.float().numpy()
        assert np.abs(with_residual.float().numpy() - want).max() / np.abs(want).max() < tolerance(), (layout, out)
    assert {f"lanes{'' if l == 'lanes' else '_' + l}_{T}_{N}_{C}" for l in layouts} <= lanes_programs()
  assert lanes_rows_dtypes(T, vectors=False) == {dtypes.float32}
  assert lanes_rows_dtypes(T, vectors=True) == ({x.dtype, dtypes.float32} if prefetches else set())
  assert {name: name.split("_")[2] == "ahead" for name in lanes_programs()} == lanes_prefetching(), "prefetch: C only"
  assert not lanes.fits(98, 32) and not lanes.fits(96, 44) and lanes.fits(96, 40) and not lanes.fits(100, 64)
  assert lanes.fits(98, 32, "row") and not lanes.fits(96, 40, "row")
  assert lanes.fits(36, 16, "four") and not lanes.fits(38, 16, "four") and not lanes.fits(36, 8, "four")
  assert lanes.fits(98, 32, "wide") and not lanes.fits(98, 48, "wide")
  assert lanes.fits(98, 32, "row_ahead") and lanes.fits(98, 32, "row_ahead", Device.DEFAULT) == prefetches
  assert lanes.fits(98, 48, "vectors") and not lanes.fits(98, 40, "vectors")
  assert lanes.fits(98, 64, "vectors_wide") and not lanes.fits(98, 48, "vectors_wide")
  assert lanes.fits(98, 32, "vectors", Device.DEFAULT) == prefetches

@pytest.mark.backend
@pytest.mark.parametrize("T", [1, 3, 8])
def test_lanes_gelu_kernel_finishes_the_layer(T):
  """With GELU after it, the lanes kernel's sums (a row's eight) are finished by gelu_kernel() (bias, GELU, the output
  dtype, in one kernel of its own), the vectors layout's inside its own C (one kernel, where C runs): GELU(x @ w.T + b),
  and without a bias GELU(x @ w.T), in the suite's dtype; inputs up to 60 (tanh's tails, where GELU is x or 0). The
  vectors layout's rows each as they are alone."""
  rng = np.random.default_rng(T)
  x, w, b = (Tensor(rng.standard_normal(shape).astype(np.float32)).cast(dtype()).realize()
             for shape in ((1, T, 64), (96, 64), (96,)))
  b = (b * Tensor([60.0 if i % 16 == 0 else -60.0 if i % 16 == 1 else 1.0 for i in range(96)])).cast(dtype()).realize()
  xw = x.float().numpy().astype(np.float64) @ w.float().numpy().astype(np.float64).T
  x32 = x.float().realize()
  gelu = lambda y: 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))
  layouts = [l for l in ("row", *lanes.VECTORS) if lanes.fits(96, 64, l, Device.DEFAULT)]
  assert "row" in layouts and ("vectors_wide" in layouts) == internals.runs_c_functions(Device.DEFAULT)
  for layout, (bias, expected) in itertools.product(layouts, ((b, gelu(xw + b.float().numpy())), (None, gelu(xw)))):
    kernels = GlobalCounters.kernel_count
    got = lanes.linear(x32, w, x.dtype, layout, bias, gelu=True).realize()   # the rows float32, as a block gives them
    assert layout not in lanes.VECTORS or GlobalCounters.kernel_count - kernels == 1, "the vectors layouts' GELU inside"
    assert got.shape == (1, T, 96) and got.dtype == x.dtype
    err = np.abs(got.float().numpy() - expected) / np.maximum(np.abs(expected).max(-1, keepdims=True), 1e-30)
    assert err.max() < tolerance(), (layout, err.max())
    if layout in lanes.VECTORS:   # the rows' GELU as one vector: each row as it is alone
      alone = [lanes.linear(x32[:, t:t+1], w, x.dtype, layout, bias, gelu=True).float().numpy() for t in range(T)]
      np.testing.assert_array_equal(got.float().numpy(), np.concatenate(alone, 1))
  assert f"gelu_{T}_96" in {p.arg.name for p in to_program_cache.values()}

def outputs(value:float): return [np.full((2, 3), value, np.float32)]
def ran(seconds:float, value:float): return lambda: (seconds, outputs(value), lambda: seconds)   # a candidate's run

def test_fastest_measures_once_per_machine(disk, capfd):
  """choice.fastest() runs every candidate, keeps the fastest of those whose outputs agree with the first's (tinygrad's
  kernels), and caches it on disk: a second process (the same disk) measures nothing, and says nothing."""
  timed = []
  def candidate(key, seconds, value=1.0): return lambda: timed.append(key) or (seconds, outputs(value), lambda: seconds)
  candidates = {None: candidate(None, 2.0), "a": candidate("a", 1.0, 1.00001), "b": candidate("b", 1.5)}
  assert choice.fastest("spec_test", ("k",), candidates, "test kernel", dtypes.float32) == "a" and timed == [None, "a", "b"]
  assert choice.fastest("spec_test", ("k",), candidates, "test kernel", dtypes.float32) == "a" and len(timed) == 3
  assert capfd.readouterr().err == "" and list(disk.values()) == [("a",)]

def test_a_burst_during_one_timing_does_not_choose(disk):
  """Every candidate that agrees is timed choice.ROUNDS more times, in turn after all ran once, and keeps its fastest:
  a candidate whose first timing other work on the machine slowed (3x) still wins, and each is timed again in turn."""
  timed = []
  def candidate(key, first, then):
    def again(): timed.append(key); return then
    return lambda: (first, outputs(1.0), again)
  candidates = {None: candidate(None, 2.0, 2.0), "slowed": candidate("slowed", 3.0, 1.0), "b": candidate("b", 1.5, 1.5)}
  assert choice.fastest("spec_test", ("k",), candidates, "test kernel", dtypes.float32) == "slowed"
  assert timed == [None, "slowed", "b"] * choice.ROUNDS and choice.ROUNDS >= 2

RACE = """
import os, sys, time
from models.engine import choice
read = choice.read
def slow_read(db, kind, key):   # a put between read and write
  value = read(db, kind, key); time.sleep(0.5); return value
choice.read = slow_read
time.sleep(max(0.0, float(sys.argv[1]) - time.time()))
print(choice.first_stored("spec_test", "k", (os.getpid(),))[0])
"""

def test_a_choice_another_process_stored_first_stands(tmp_path):
  """Processes measuring one choice at once (pytest-xdist's workers, a run and its child) keep the answer stored first:
  their kernels agree, and so do their steps' names. Three processes store at once, each reading slowly (half a second
  between its read and its write): all keep one answer, the one stored, in the file SPEC_CHOICES names."""
  env = {**os.environ, "SPEC_CHOICES": str(tmp_path / "choices.db")}
  start = str(time.time() + 10)   # past every process's imports
  runs = [subprocess.Popen([sys.executable, "-c", RACE, start], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
          for _ in range(3)]
  kept = {int(run.communicate(timeout=120)[0]) for run in runs}
  read = "from models.engine import choice; print(choice.cached('spec_test', 'k')[0])"
  stored = subprocess.run([sys.executable, "-c", read], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=True).stdout
  assert kept == {int(stored)} and kept <= {run.pid for run in runs}, (kept, stored)

def test_choices_are_kept_where_spec_choices_says(tmp_path, monkeypatch):
  """SPEC_CHOICES names the file of measured choices (tests/conftest.py gives the suite its own); empty, none is kept
  and each process measures."""
  monkeypatch.setenv("SPEC_CHOICES", str(tmp_path / "choices.db"))
  assert choice.cached("spec_test", "k") is None and choice.first_stored("spec_test", "k", ("a",)) == ("a",)
  assert choice.first_stored("spec_test", "k", ("b",)) == ("a",) and choice.cached("spec_test", "k") == ("a",)
  monkeypatch.setenv("SPEC_CHOICES", "")
  assert choice.first_stored("spec_test", "k", ("b",)) == ("b",) and choice.cached("spec_test", "k") is None

def test_a_fast_candidate_with_other_values_never_wins(disk, capfd):
  """A candidate whose outputs differ from tinygrad's by more than the dtype's tolerance (or are not finite where
  tinygrad's are) drops out however fast, with one line naming it and the error; nothing is cached, so the next
  process measures again. Within the tolerance (half: 2.9e-3 of a row's largest value, what rounding alone moves)
  a candidate counts as agreeing."""
  candidates = {None: ran(2.0, 1.0), "wrong": ran(0.1, 1.5), "nan": ran(0.1, np.nan), "right": ran(1.0, 1.0)}
  assert choice.fastest("spec_test", ("k",), candidates, "test kernel", dtypes.float32) == "right" and disk == {}
  lines = capfd.readouterr().err.splitlines()
  assert len(lines) == 2 and all("test kernel" in l and "computes other values" in l for l in lines)
  assert "wrong" in lines[0] and "5.0e-01" in lines[0] and "nan" in lines[1] and "inf" in lines[1]
  half = {None: ran(2.0, 1.0), "close": ran(1.0, 1.002)}
  assert choice.fastest("spec_test", ("h",), half, "test kernel", dtypes.float16, length=6400) == "close"
  assert choice.fastest("spec_test", ("f",), half, "test kernel", dtypes.float32, length=6400) is None
  dropped = {None: ran(2.0, 1.0), "off": ran(1.0, 1.005)}   # 1e-2 let it through
  assert choice.fastest("spec_test", ("d",), dropped, "test kernel", dtypes.float16, length=768) is None

def test_a_candidate_that_cannot_run_drops_out_and_nothing_is_cached(disk, capfd):
  """A candidate that fails to compile or run drops out with one line naming it and the error; the fastest of the
  rest is used, and nothing is cached, so a transient failure (or a device error that makes every later candidate
  fail) does not fix the choice for good: the next process measures again and says so again."""
  runs = []
  def broken(): runs.append("broken"); raise RuntimeError("too many resources requested for launch")
  candidates = {None: ran(2.0, 1.0), (8, 2): broken, (8, 1): ran(1.0, 1.0)}
  for _ in range(2):
    assert choice.fastest("spec_test", ("k",), candidates, "matvec kernel", dtypes.float32) == (8, 1)
    lines = [l for l in capfd.readouterr().err.splitlines() if "cannot run" in l]
    assert len(lines) == 1 and "matvec kernel (8, 2)" in lines[0] and "too many resources" in lines[0]
  assert runs == ["broken", "broken"] and disk == {}

def test_a_family_that_loses_clearly_is_not_timed_whole(disk):
  """Options of one family after its first are timed only while the first is within choice.PRUNE of the fastest so
  far: the matvec kernel's options on a device where it loses (a CPU's OpenCL) cost one measurement, not six."""
  timed = []
  def candidate(key, seconds): return lambda: timed.append(key) or (seconds, outputs(1.0), lambda: seconds)
  family = lambda key: "m" if isinstance(key, tuple) else None
  slow = {None: candidate(None, 1.0), "lanes": candidate("lanes", 0.5), (1,): candidate((1,), 2.0), (2,): candidate((2,), 0.1)}
  assert choice.fastest("spec_test", ("slow",), slow, "test", dtypes.float32, family) == "lanes" and timed == [None, "lanes", (1,)]
  close = {None: candidate(None, 1.0), (1,): candidate((1,), 1.2), (2,): candidate((2,), 0.9)}
  assert choice.fastest("spec_test", ("close",), close, "test", dtypes.float32, family) == (2,) and timed[3:] == [None, (1,), (2,)]

def test_linear_choose_measures_every_way_that_fits(monkeypatch, disk):
  """linear.choose() times tinygrad's matmul, the lanes kernel in each layout that fits ("four" where "lanes" does not;
  the vectors layouts alone where they fit, C, the wide for half weights) and the matvec kernel's options where the
  device has work-groups, over enough of the weights (choice.enough()) on random rows, and keeps the fastest; a second
  process reads the disk."""
  fresh_choices(monkeypatch)
  monkeypatch.setattr(matvec, "fits", lambda N, C: True)
  monkeypatch.setattr(matvec, "options", lambda N, C: [(64, 1), (32, 1)])
  lanes_, matvec_ = lambda layout: Way("lanes", layout), lambda option: Way("matvec", option)
  c = internals.runs_c_functions(Device.DEFAULT)
  layouts = [lanes_("vectors")] if c else [lanes_("lanes"), lanes_("row"), lanes_("wide")]
  costs = {TINYGRAD: 2.0, **dict(zip(layouts, (1.5, 1.75, 1.8))), matvec_((64, 1)): 1.0, matvec_((32, 1)): 0.5}
  timed = []
  monkeypatch.setattr(linear, "apply", lambda x, w, b, dtype, ln, gelu, r, way: timed.append((way, x.shape)) or x)
  def captured(fn, calls, before):
    seconds = costs[fn(*calls[0]) and timed[-1][0]]
    return seconds, [np.ones(3)], lambda: seconds
  monkeypatch.setattr(linear, "captured", captured)
  monkeypatch.setattr(choice, "TIMED_BYTES", 24 * 64 * 4 * 2)
  monkeypatch.setattr(choice, "compile_together", lambda outputs: None)
  weights, biases = [Tensor.empty(24, 64)] * 3, [Tensor.empty(24)] * 3
  assert linear.choose(3, weights, biases, dtypes.float32) == matvec_((32, 1))
  assert timed == [(way, (3, 64)) for way in costs for _ in range(2)], "not the two first weights, or not every way"
  fresh_choices(monkeypatch)
  assert linear.choose(3, weights, biases, dtypes.float32) == matvec_((32, 1)) and len(timed) == 2 * len(costs), \
    "measured again"
  assert linear.ways(1, 24, 32) == [TINYGRAD, *layouts, matvec_((64, 1)), matvec_((32, 1))]
  if c: assert linear.ways(1, 36, 32)[:2] == [TINYGRAD, lanes_("vectors")], "vectors alone where it fits"
  else: assert linear.ways(1, 36, 32)[:3] == [TINYGRAD, lanes_("four"), lanes_("row")], "four only where lanes does not"
  wide = [lanes_("vectors"), lanes_("vectors_wide")] if c else layouts
  assert [w for w in linear.ways(1, 24, 64, dtypes.half) if w.kernel == "lanes"] == wide, "the wide for half weights"
  assert lanes_("lanes") not in linear.ways(1, 24, 36) and lanes_("vectors") not in linear.ways(1, 24, 40)
  assert lanes_("lanes") in linear.ways(1, 24, 40), "the other layouts where vectors does not fit"
  lanes_ways = lambda T: [w for w in linear.ways(T, 24, 32) if w.kernel == "lanes"]
  assert lanes_ways(linear.PREFILL_ROWS) == lanes_ways(1) and lanes_ways(64) == [lanes_("row")], "a prefill's rows"
  # where the matvec kernel's first option loses clearly to one role, the process times it on no other of that width
  costs[matvec_((64, 1))] = 3.0
  assert linear.choose(3, [Tensor.empty(40, 64)], None, dtypes.float32) == layouts[0]
  assert linear.matvec_outpaced == {(3, dtypes.float32)}
  del timed[:]
  assert linear.choose(3, [Tensor.empty(56, 64)], None, dtypes.float32) == layouts[0]
  assert [w for w, _ in timed] == [TINYGRAD, *layouts]
  del timed[:]
  linear.choose(1, [Tensor.empty(56, 64)], None, dtypes.float32)
  assert [w for w, _ in timed] == [TINYGRAD, *layouts, matvec_((64, 1))], \
    "another width: the matvec kernel timed again"

def test_linear_choose_times_each_call_after_a_flush(monkeypatch, disk):
  """linear.choose() times every call of a candidate after choice.evictor()'s flush, a read of EVICT_BYTES of the
  device's memory through a buffer of its own: a small model's weights are timed streaming from memory, as in a pass
  (its whole model is past the caches), not from the cache that would hold one role's (docs/engine.md). The flush
  allocates nothing before it is called: a choice read from the disk times nothing."""
  fresh_choices(monkeypatch)
  monkeypatch.setattr(choice, "EVICT_BYTES", 1 << 16)
  events, evictor = [], choice.evictor
  def recording():
    flush = evictor()
    return lambda: (events.append("flush"), flush())
  monkeypatch.setattr(choice, "evictor", recording)
  best = choice.best_seconds
  monkeypatch.setattr(choice, "best_seconds", lambda fn, reps=3, before=None: best(lambda: (events.append("call"),
                      fn()), reps, before))
  w = Tensor(np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)).realize()
  linear.choose(1, [w], None, dtypes.float32)
  assert events and events == ["flush", "call"] * (len(events) // 2), "a timed call without a flush before it"
  assert len(events) // 2 == (3 + choice.ROUNDS) * len(linear.ways(1, 64, 32)), "each way: 3 calls, then 1 a round"
  before = GlobalCounters.mem_used
  flush = evictor()
  assert GlobalCounters.mem_used == before, "a flush's buffer made before its first call"
  flush()
  assert GlobalCounters.mem_used >= before + choice.EVICT_BYTES, "a flush reads less than EVICT_BYTES"

def test_a_choice_times_each_call_as_a_steps_later_calls_run(monkeypatch, disk):
  """Under the engine's graph every timed call of a candidate is one call of its replay.Shortcut, as a step's later
  calls run: TinyJit's own call adds 0.1-0.3 ms of Python, which hid a 3x between a small layer's kernels (the draft's
  128 x 128 c_proj chose tinygrad's kernel, 47 us a call in generation against 2-4, as often as the engine's)."""
  fresh_choices(monkeypatch)
  shortcuts, made = [], []
  call = replay.Shortcut.__call__
  monkeypatch.setattr(replay.Shortcut, "__call__", lambda self, args: (shortcuts.append(1), call(self, args))[1])
  best = choice.best_seconds
  def counting(fn, reps=3, before=None):
    def one():
      n = len(shortcuts)
      fn()
      made.append(len(shortcuts) - n)
    return best(one, reps, before)
  monkeypatch.setattr(choice, "best_seconds", counting)
  w = [Tensor(np.random.default_rng(i).standard_normal((64, 32)).astype(np.float32)).realize() for i in range(2)]
  with engine.graph(): linear.choose(1, w, None, dtypes.float32)   # two layers: a batch (one kernel alone is not)
  assert made and made == [1] * len(made), made

def np_attention(qkv:np.ndarray, cache:np.ndarray, start:int) -> np.ndarray:
  """Causal attention of rows start..start+T-1 over the cache's first start positions and the block's own keys and
  values (qkv's), in float64: (T, C)."""
  _, T, C3 = qkv.shape
  _, _, H, _, D = cache.shape
  q, k, v = (qkv[0, :, i * C3 // 3:(i + 1) * C3 // 3].reshape(T, H, D).transpose(1, 0, 2) for i in range(3))  # (H, T, D)
  keys, values = np.concatenate([cache[0, 0, :, :start], k], 1), np.concatenate([cache[1, 0, :, :start], v], 1)
  scores = q @ keys.transpose(0, 2, 1) / np.sqrt(D)                                 # (H, T, S)
  scores[:, np.arange(T)[:, None] < np.arange(start + T)[None, :] - start] = -np.inf
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  return (probs / probs.sum(-1, keepdims=True) @ values).transpose(1, 0, 2).reshape(T, C3 // 3)

ATTENTION = ("scores_", "values_", "attention_", "wide_scores_", "chunks_", "combine_")   # the attention kernels' names
def attention_programs() -> set[str]:
  return {p.arg.name for p in to_program_cache.values() if p.arg.name.startswith(ATTENTION)}

@pytest.mark.backend
@pytest.mark.parametrize("T", [pytest.param(1, marks=pytest.mark.gpu), 2, 3, pytest.param(5, marks=pytest.mark.gpu), 9, 16])
def test_attention_kernels_compute_attention(T):
  """Every way of attention.apply() (tinygrad's, the CPU design's kernels, where C runs the fused kernel, and where
  the device has work-groups the GPU design at each chunk length) writes the block's keys and values into the cache
  and computes causal attention over it, for every width a step may run (rows in chunks: 9 = 3 x 3, 16 = 2 x 8), at
  the first positions and deep in the cache (chunks empty, short and clamped), with the position a bound variable (a
  captured step: one compile for every position), an expression of one (a draft's later steps run at start_pos + 1,
  ...) or a Python int (an eager pass: at 0, T = 1 is a range of one position); c_attn's output in float32 (as
  engine.Block passes it, rounded to the suite's dtype first), the cache in the suite's."""
  rng = np.random.default_rng(T)
  H, P, D = 3, 96, 32
  start_pos, earlier_pos = UOp.variable("start_pos", 0, P - T), UOp.variable("start_pos", 0, P - T - 2)
  for way in attention.ways(D, (getattr(dtypes, dtype()), dtypes.float32)):
    qkv = Tensor(rng.standard_normal((1, T, 3 * H * D)).astype(np.float32)).cast(dtype()).realize().float().realize()
    block = qkv.float().numpy()[0, :, H * D:].reshape(T, 2, H, D).transpose(1, 2, 0, 3)   # (2, H, T, D): k, v
    attn = layer(H, P, D, Tensor(rng.standard_normal((2, 1, H, P, D)).astype(np.float32)).cast(dtype()).realize())
    step = TinyJit(lambda qkv, pos: attention.apply(attn, qkv, pos, way).realize())
    later = TinyJit(lambda qkv, pos: attention.apply(attn, qkv, pos + 2, way).realize())
    for start in (0, 2, P - T - 7, P - T):
      before = attn.cache_kv.float().numpy().astype(np.float64)
      expected = np_attention(qkv.float().numpy().astype(np.float64), before, start)
      results = [step(qkv, start_pos.bind(start))] + ([later(qkv, earlier_pos.bind(start - 2))] if start >= 2 else [])
      for got in results + ([attention.apply(attn, qkv, start, way)] if start == 0 else []):
        assert got.shape == (1, T, H * D) and got.dtype == dtypes.float32
        assert np.abs(got.float().numpy()[0] - expected).max() / np.abs(expected).max() < tolerance(), (way, start)
      after = attn.cache_kv.float().numpy()
      np.testing.assert_array_equal(after[:, 0, :, start:start + T], block, err_msg=f"{way}: the block's keys and values")
      np.testing.assert_array_equal(np.delete(after, np.s_[start:start + T], 3), np.delete(before, np.s_[start:start + T], 3))
  c = internals.runs_c_functions(Device.DEFAULT)
  kinds = ["scores", "values"] + ["wide_scores", "chunks", "combine"] * device.work_groups() + ["attention"] * c
  assert {f"{k}_{T}_{H}_{D}" for k in kinds} <= attention_programs()
  assert len(attention.ways(D, (getattr(dtypes, dtype()), dtypes.float32))) == 2 + 2 * device.work_groups() + c

def undefined_symbols(obj:bytes) -> list[str]:
  """The names an ELF64 object file leaves undefined: its symbol table's entries in no section."""
  shoff, (shentsize, shnum) = struct.unpack_from("<Q", obj, 0x28)[0], struct.unpack_from("<HH", obj, 0x3A)
  sections = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)]
  names = []
  for _, kind, _, _, offset, size, link, _, _, entsize in sections:
    if kind != 2: continue   # SHT_SYMTAB
    strings = sections[link][4]
    for j in range(1, size // entsize):
      name, _, _, section = struct.unpack_from("<IBBH", obj, offset + j * entsize)
      if section == 0 and name: names.append(obj[strings + name:obj.index(b"\0", strings + name)].decode())
  return names

@pytest.mark.backend
def test_the_engines_c_links_nothing():
  """Where C runs, the engine's own C (the vectors layout, with GELU too; attention's fused kernel), compiled as tinygrad
  compiles it, calls no function: its programs link no libc, and clang called memset for a 32-row prefill's zeroed
  arrays, which resolved to no code (the process jumped into unmapped memory). At the widest rows each kernel is built
  for."""
  if not internals.runs_c_functions(Device.DEFAULT): return
  H, P, D = 4, 128, 64
  qkv = Tensor(np.random.default_rng(0).standard_normal((1, 64, 3 * H * D)).astype(np.float32)).realize()
  attn = layer(H, P, D, Tensor.zeros(2, 1, H, P, D).cast(dtype()).contiguous().realize())
  attention.apply(attn, qkv, 0, Way("fused")).realize()
  x, w = Tensor.ones(16, 256).contiguous().realize(), Tensor.ones(64, 256).cast(dtype()).contiguous().realize()
  lanes.linear(x, w, dtypes.float32, "vectors", Tensor.ones(64).contiguous(), residual=Tensor.ones(16, 64)).realize()
  lanes.linear(x, w[:32].contiguous(), dtypes.float32, "vectors", Tensor.ones(32).contiguous(), gelu=True).realize()
  names = ("attention_64_4_64", "lanes_vectors_16_64_256", "lanes_vectors_16_32_256")   # the last with GELU's exp
  programs = {p.arg.name: p for p in to_program_cache.values() if p.arg.name in names}
  assert len(programs) == 3
  for name, p in programs.items():
    source = next(s.arg for s in p.src if isinstance(s.arg, str) and "void" in s.arg)
    assert undefined_symbols(Device[Device.DEFAULT].compiler.compile(source)) == [], name

def test_attention_choose_measures_every_way_at_two_contexts(monkeypatch, disk):
  """attention.choose() times every way that fits over some of the layers (on caches of their own: the model's stay as
  they are) at a short and a long context, and keeps the fastest; a second process reads the disk."""
  fresh_choices(monkeypatch)
  monkeypatch.setattr(attention, "ways", lambda D, dtypes_: [TINYGRAD, Way("rows"), Way("chunks", 32)])
  costs, runs = {TINYGRAD: 2.0, Way("rows"): 1.5, Way("chunks", 32): 1.0}, []
  layers = [layer(2, 128, 16) for _ in range(10)]
  caches = [a.cache_kv for a in layers]
  ways = iter(costs)
  def captured(fn, calls, timed, after):
    way = next(ways)
    runs.extend((way, pos.unbind()[1], qkv.shape) for qkv, pos in calls[:timed])
    return costs[way], [np.ones(3)], lambda: costs[way]
  monkeypatch.setattr(attention, "captured", captured)
  assert attention.choose(3, layers, dtypes.float32) == Way("chunks", 32)
  assert runs == [(w, p, (1, 3, 96)) for w in costs for p in (8, 96)], "not one capture a way, timed at both contexts"
  assert [a.cache_kv for a in layers] == caches, "the model's caches were replaced"
  fresh_choices(monkeypatch)
  assert attention.choose(3, layers, dtypes.float32) == Way("chunks", 32) and len(runs) == 6, "measured again"

@pytest.mark.backend
@pytest.mark.parametrize("T", [pytest.param(1, marks=pytest.mark.gpu), 2, pytest.param(5, marks=pytest.mark.gpu), 16])
def test_norm_kernel_computes_layer_norm(T):
  """Every way of norm.layer_norm() (tinygrad's, the row kernel, and where the device has work-groups the stats kernel
  at each work-group size) computes the port's LayerNorm over each row, for every width a step may run, in the suite's
  dtype, on rows whose mean is far from 0 (a mean taken carelessly would cancel); each also written in float32 (the
  lanes kernel's rows)."""
  rng = np.random.default_rng(T)
  for C in (32, 768):
    x = Tensor((rng.standard_normal((1, T, C)) * 3 + 20).astype(np.float32)).cast(dtype()).realize()
    w, b = (Tensor(rng.standard_normal(C).astype(np.float32)).cast(dtype()).realize() for _ in range(2))
    xs = x.float().numpy().astype(np.float64)
    expected = (xs - xs.mean(-1, keepdims=True)) / np.sqrt(xs.var(-1, keepdims=True) + 1e-5) * w.float().numpy() + b.float().numpy()
    for way in norm.ways(C):
      for out_dtype in (None, dtypes.float32):
        got = norm.layer_norm(x, w, b, 1e-5, way, out_dtype)
        assert got.shape == x.shape and got.dtype == (out_dtype or x.dtype)
        assert np.abs(got.float().numpy() - expected).max() / np.abs(expected).max() < tolerance(), (C, way, out_dtype)
    names = {p.arg.name for p in to_program_cache.values()}
    assert f"norm_{T}_{C}" in names and (f"stats_{T}_{C}" in names) == bool(norm.groups(C))
    assert bool(norm.groups(C)) == Device[Device.DEFAULT].renderer.has_local

def test_norm_choose_measures_every_way(monkeypatch, disk):
  """norm.choose() times every way that fits over the norms given on massive rows, compares them on ordinary rows too,
  and keeps the fastest; a second process reads the disk."""
  fresh_choices(monkeypatch)
  monkeypatch.setattr(norm, "groups", lambda C: [32, 64])
  costs, timed = {TINYGRAD: 2.0, Way("row"): 1.5, Way("stats", 32): 1.0, Way("stats", 64): 1.2}, []
  ways = iter(costs)
  def captured(fn, calls):
    (x,), *also = calls
    timed.append((next(ways), x.shape, [o.shape for o, in also], x.numpy().max() > 1000))
    return costs[timed[-1][0]], [np.ones(3)], lambda: costs[timed[-1][0]]
  monkeypatch.setattr(norm, "captured", captured)
  norms = [norm.LayerNorm(models.gpt2.LayerNorm(48)) for _ in range(3)]
  assert norm.choose(5, norms, dtypes.float32) == Way("stats", 32)
  assert timed == [(w, (5, 48), [(5, 48)], True) for w in costs]
  fresh_choices(monkeypatch)
  assert norm.choose(5, norms, dtypes.float32) == Way("stats", 32) and len(timed) == 4, "measured again"

def test_auto_dtype_is_half_where_half_measures_faster(monkeypatch, disk):
  """--dtype auto asks a measurement, not the device's name: half where a row times half weights by the engine's
  fastest way is clearly faster (each dtype timed in turn, 1 + ROUNDS times, its fastest kept; once per machine, then
  read from the choices' file), float32 where it is not or the device has no half; with plain=True nothing is
  measured and auto is float32."""
  timed = []
  renderer = Device[Device.DEFAULT].renderer
  monkeypatch.setattr(type(renderer), "supported_dtypes", lambda self: [dtypes.float32, dtypes.half])
  def timers(seconds):   # each dtype's timings in the order they are taken
    return lambda dtype: (lambda left=list(seconds[dtype]): timed.append(dtype) or left.pop(0))
  monkeypatch.setattr(linear, "half_timer", timers({dtypes.half: [1.0] * 3, dtypes.float32: [2.0] * 3}))
  assert models.resolve_dtype("auto", plain=True) == dtypes.float32 and timed == []
  assert models.resolve_dtype("auto") == dtypes.half and timed == [dtypes.half, dtypes.float32] * 3, "not in turn"
  assert models.resolve_dtype("auto") == dtypes.half and len(timed) == 6, "measured again"
  assert models.resolve_dtype("float32") == dtypes.float32 and len(timed) == 6
  disk.clear()
  monkeypatch.setattr(linear, "half_timer", timers({dtypes.half: [1.0] * 3, dtypes.float32: [1.2] * 3}))   # not clearly
  assert models.resolve_dtype("auto") == dtypes.float32
  disk.clear()
  # a burst of other work during one timing (half's first: 3x its cost), then the machine quiet: its fastest decides
  monkeypatch.setattr(linear, "half_timer", timers({dtypes.half: [3.0, 1.0, 1.0], dtypes.float32: [2.0] * 3}))
  assert models.resolve_dtype("auto") == dtypes.half
  disk.clear()
  monkeypatch.setattr(type(renderer), "supported_dtypes", lambda self: [dtypes.float32])
  monkeypatch.setattr(linear, "half_timer", lambda dtype: pytest.fail("measured a dtype the device does not have"))
  assert models.resolve_dtype("auto") == dtypes.float32

@pytest.mark.backend
def test_half_timer_times_the_engines_way(monkeypatch):
  """half_timer() times a row by the weights through the way choose() measured for them in that dtype, on this
  device, and again on each call."""
  monkeypatch.setattr(linear, "HALF_SHAPE", (64, 32))
  fresh_choices(monkeypatch)
  ways, apply = [], linear.apply
  monkeypatch.setattr(linear, "apply", lambda *args, way=None, **kw: ways.append(way) or apply(*args, way=way, **kw))
  for dt in (dtypes.float32, getattr(dtypes, dtype())):
    timer = linear.half_timer(dt)
    assert timer() > 0 and timer() > 0
    chosen = CHOSEN.measured["linear"][(1, 64, 32, dt, dt, False, linear.Form(False, False, False, dt))]
    assert ways[-linear.HALF_LAYERS:] == [chosen] * linear.HALF_LAYERS, "not timed through the way chosen"

@pytest.mark.backend
@pytest.mark.quick
def test_a_model_on_its_own_kernels(tiny_dir, monkeypatch):
  """Where the choices pick this project's kernels (engine.engine_kernels(): for passes of several rows the work-group
  kernels where the device has them, for one row the others), every linear layer and the lm_head of a pass run the
  matvec kernel (with the layer norm, GELU or the residual add fused in) or the lanes kernel, every layer's attention
  the GPU or the CPU design's kernels and every layer norm a norm kernel: the logits of a plain forward and of captured
  steps (a decode and a 5-token verify pass) are the numpy GPT-2's."""
  monkeypatch.setenv("SPEC_STEP_CACHE", "")                       # steps captured here, none loaded
  weights = random_weights(TINY, seed=1)
  seq = [int(t) for t in np.random.default_rng(9).integers(0, 64, 11)]
  expected = np_gpt2_logits(weights, TINY["n_head"], seq)
  with engine.engine_kernels():
    model = load(tiny_dir / "target")
    assert_close(logits(model, seq[:5]), expected[:5])
    model.prefill(seq[:5])
    five = [model(seq[5:10], 5).numpy() for _ in range(2)][-1]
    one = [model(seq[10:], 10).numpy() for _ in range(2)][-1]
  assert_close(np.concatenate([five, one]), expected[5:])
  names = {p.arg.name for p in to_program_cache.values()}
  wide, c = device.work_groups(), internals.runs_c_functions(Device.DEFAULT)   # C: the vectors layout, which fits
  linear = lambda T, N, C: f"{'matvec' if wide and T > 1 else 'lanes_vectors' if c else 'lanes'}_{T}_{N}_{C}"
  assert {linear(5, 96, 32), linear(1, 32, 32), linear(1, 128, 32), linear(5, 32, 128), linear(1, 64, 32)} <= names
  five = ["wide_scores_5_2_16", "chunks_5_2_16", "combine_5_2_16"] if wide else ["scores_5_2_16", "values_5_2_16"]
  one = ["attention_1_2_16"] if c else ["scores_1_2_16", "values_1_2_16"]   # C: the fused kernel for one row
  assert {*five, *one} <= attention_programs()
  assert {"stats_5_32" if wide else "norm_5_32", "norm_1_32"} <= names

def test_steps_choose_their_linear_kernels_and_search_the_rest(tiny_dir, monkeypatch):
  """Every step pass (at most STEP_WIDTH tokens) has the kernels of its linear layers, attention and layer norms chosen by
  measurement (models/engine/linear.py, attention.py, norm.py) for its width and for one token, whatever the
  search; with search > 0 its other kernels come from tinygrad's BEAM search (which caches its result on disk: a machine
  searches a kernel once). A prefill's pass of any width runs the kernels chosen for passes of PREFILL_CHOICE (the
  linear layers but the lm_head, which it does not run), searched nothing; a wider pass chooses nothing. The logits do
  not change."""
  import tinygrad.codegen.opt.search as tinygrad_search
  beams, beam_search = [], tinygrad_search.beam_search  # the beam width of every kernel search
  monkeypatch.setattr(tinygrad_search, "beam_search", lambda *a, **kw: beams.append(a[3]) or beam_search(*a, **kw))
  fresh_choices(monkeypatch)
  unsearched, searched = load(tiny_dir / "target"), load(tiny_dir / "target", search=1)
  seq = [int(t) for t in np.random.default_rng(6).integers(0, 64, 7)]
  searched.prefill(seq[:-1])
  chosen = lambda: [{T for T, *_ in table} for table in CHOSEN.measured.values()]
  P = engine.PREFILL_CHOICE
  assert beams == [] and chosen() == [{P}] * 3, "a prefill searched, or chose for its own width"
  assert {(N, C) for T, N, C, *_ in CHOSEN.measured["linear"]} == {(96, 32), (32, 32), (128, 32), (32, 128)}, "lm_head"
  assert searched.jit(GPT2.forward, engine.STEP_WIDTH + 1).search == 0 and chosen() == [{P}] * 3
  step = [searched(seq[-1:], len(seq) - 1).numpy() for _ in range(3)]    # captured on the first call
  assert beams and set(beams) == {1}
  measured = {kind: {key for key in table if key[0] == 1} for kind, table in CHOSEN.measured.items()}
  assert {(T, N, C) for T, N, C, *_ in measured["linear"]} == \
    {(1, 96, 32), (1, 32, 32), (1, 128, 32), (1, 32, 128), (1, 64, 32)}
  assert measured["attention"] == {(1, 2, 256, 16, searched.dtype, dtypes.float32)}
  assert measured["norm"] == {(1, 32, searched.dtype)}
  unsearched.prefill(seq[:-1])
  beams.clear()
  expected = unsearched(seq[-2:], len(seq) - 2).numpy()
  assert beams == [] and chosen() == [{1, 2, P}] * 3, "search 0 searched, or did not choose"
  two = [searched(seq[-2:], len(seq) - 2).numpy() for _ in range(3)]
  assert beams and set(beams) == {1}
  np.testing.assert_allclose(np.concatenate([step[-1], two[-1]]), np.concatenate([expected[-1:], expected]),
                             atol=tolerance() * np.abs(expected).max())

def test_a_prefill_pass_of_any_width_runs_the_ways_chosen_for_prefill_width(monkeypatch):
  """widths_as(T): every width asks the way measured at T (a prefill's passes, the powers of two up to 64, measured
  once at PREFILL_CHOICE), tinygrad's where none was."""
  fresh_choices(monkeypatch)
  CHOSEN.measured["linear"][(64, 96, 32, "form")] = Way("lanes", "row")
  with engine.widths_as(64):
    assert [CHOSEN.way("linear", (T, 96, 32, "form")) for T in (1, 8, 64)] == [Way("lanes", "row")] * 3
    assert CHOSEN.way("linear", (8, 96, 64, "form")) == TINYGRAD and CHOSEN.way("norm", (8, 32, "dtype")) == TINYGRAD
  assert CHOSEN.way("linear", (8, 96, 32, "form")) == TINYGRAD

@pytest.mark.backend
@pytest.mark.quick
def test_captured_steps_are_stored_and_run_on_the_loading_models_weights(tiny_dir, tmp_path, monkeypatch):
  """A captured step is stored (engine.Step, store.step_path) and a later instance of the same shape loads it instead of capturing:
  it runs on that instance's own weights and KV cache (stored by name), exactly as a step it captured itself would. An
  unreadable file is captured again and rewritten; SPEC_STEP_CACHE="" stores nothing."""
  monkeypatch.setenv("SPEC_STEP_CACHE", str(tmp_path / "steps"))
  seq = [int(t) for t in np.random.default_rng(7).integers(0, 64, 9)]
  def decode(model):  # a prefill's pass of 8 tokens, then a one-token step, each captured on its first call
    model.prefill(seq[:-1])
    return [model(seq[-1:], len(seq) - 1).numpy() for _ in range(3)][-1]
  step = lambda model: model.jit(GPT2.forward, 1)
  prefill = lambda model: model.jit(GPT2.fill, 8)
  captured = decode(load(tiny_dir / "target"))
  stored = sorted((tmp_path / "steps").iterdir())
  assert [f.suffix for f in stored] == [".pkl", ".pkl"], "the step and the prefill's pass"
  other = load(tiny_dir / "other")                                  # same shape, other weights
  assert step(other).captured is not None and prefill(other).captured is not None, "not loaded"
  loaded = decode(other)
  monkeypatch.setenv("SPEC_STEP_CACHE", "")
  fresh = load(tiny_dir / "other")
  assert step(fresh).path is None and step(fresh).captured is None
  np.testing.assert_array_equal(loaded, decode(fresh))              # the same kernels on the same weights: bit for bit
  assert_close(loaded, logits(fresh, seq)[-1:])
  assert not np.allclose(loaded, captured)
  assert sorted((tmp_path / "steps").iterdir()) == stored, "SPEC_STEP_CACHE='' wrote a file"
  monkeypatch.setenv("SPEC_STEP_CACHE", str(tmp_path / "steps"))
  for f in stored: f.write_bytes(f.read_bytes()[:1000])              # interrupted writes
  again = load(tiny_dir / "other")
  assert step(again).captured is None and prefill(again).captured is None
  np.testing.assert_array_equal(decode(again), loaded)
  assert step(load(tiny_dir / "other")).captured is not None, "not rewritten"

def anon_huge_kb(address:int) -> int:
  """The huge pages, in kB, that back the mapping holding address (/proc/self/smaps)."""
  inside = False
  for line in pathlib.Path("/proc/self/smaps").read_text().splitlines():
    if (fields := line.split())[0].count("-") == 1 and len(fields) >= 5 and ":" not in fields[0]:
      start, end = (int(a, 16) for a in fields[0].split("-"))
      inside = start <= address < end
    elif inside and fields[0] == "AnonHugePages:": return int(fields[1])
  raise AssertionError(f"no mapping holds {address:#x}")

class State:
  """A model's weights in small: one over several huge pages, a bias, an int32 table."""
  def __init__(self):
    rng = np.random.default_rng(3)
    self.weight = Tensor(rng.standard_normal((1024, 2048), dtype=np.float32)).realize()
    self.bias = Tensor(rng.standard_normal(7, dtype=np.float32)).realize()
    self.table = Tensor(np.arange(5, dtype=np.int32)).realize()

@pytest.mark.quick
@pytest.mark.backend
def test_the_state_moves_into_huge_pages_with_its_values(capfd):
  """Where the device's buffers are the process's memory (tinygrad's CPU backend), pages.move() puts each of a model's
  weights into one mapping, values unchanged: what is written into the mapping is what the tensor holds; the
  system backs it with huge pages where it gives them, else one line says why and nothing moves. On another device
  nothing moves and nothing is said."""
  import ctypes
  from models.engine import pages
  model = State()
  before = {name: t.numpy() for name, t in vars(model).items()}
  pages.move(model)
  for name, t in vars(model).items(): np.testing.assert_array_equal(t.numpy(), before[name])
  if not internals.host_buffers(Device.DEFAULT) or pages.refused() is not None:
    assert model not in pages.mappings
    lines = [l for l in capfd.readouterr().err.splitlines() if "4 KB pages" in l]
    assert len(lines) == (internals.host_buffers(Device.DEFAULT) and pages.refused() is not None), lines
    return
  base = ctypes.addressof(ctypes.c_char.from_buffer(pages.mappings[model]))
  base += -base % pages.HUGE_PAGE
  first = pages.weights(model)[0]
  assert first is model.weight
  ctypes.c_float.from_address(base).value = 42.0
  assert first.numpy()[0, 0] == 42.0, "the weight is no view of the mapping"
  assert anon_huge_kb(base) >= 4096, "no huge pages back the weight's 8 MB"

def test_where_the_system_gives_no_huge_pages_the_state_stays_with_one_line(tmp_path, monkeypatch, capfd):
  from models.engine import pages
  (thp := tmp_path / "enabled").write_text("always madvise [never]\n")
  monkeypatch.setattr(pages, "THP", str(thp))
  pages.refused.cache_clear()
  try:
    model, other = State(), State()
    pages.move(model)
    pages.move(other)
  finally: pages.refused.cache_clear()
  assert model not in pages.mappings and other not in pages.mappings
  lines = [l for l in capfd.readouterr().err.splitlines() if "4 KB pages" in l]
  if internals.host_buffers(Device.DEFAULT): assert lines == [f"spec: a model's weights stay in 4 KB pages: "
                                                              f"transparent huge pages are off ({thp}: never)"]
  else: assert lines == []

@pytest.mark.backend
@pytest.mark.parametrize("T", [pytest.param(1, marks=pytest.mark.gpu), pytest.param(3, marks=pytest.mark.gpu), 16])
def test_matvec_kernel_computes_the_formula(T):
  """The matvec kernel is x @ w.T + b (and x @ w.T in float32, the lm_head's), and with what it fuses: the layer norm
  before it (on rows with a mean far from 0 and, at one row, GPT-2's massive activations), GELU and the residual add
  after it, for every width a step may run, the widths together covering every option of each shape, where the
  device has work-groups (a GPU; CI's GPU suite, DEV=PYTHON::sm_80, in float16 at 1 and 3 rows, which cover every
  option; 16 rows on pocl, in float32). Where it has none (tinygrad's CPU backend) the kernel is no candidate."""
  rng = np.random.default_rng(T)
  half = lambda a: Tensor(a.astype(np.float32)).cast(models.DTYPES[dtype()]).realize()
  f64 = lambda t: t.float().numpy().astype(np.float64)
  # 800: 200 vectors, padded for every group; not at 16 rows, which CUDA's emulator takes minutes over
  for N, C, widths in ((24, 32, (1, 3, 16)), (40, 256, (1, 3, 16)), (16, 800, (1, 3))):
    if T not in widths: continue
    if not matvec.fits(N, C):
      assert not device.work_groups() and not any(w.kernel == "matvec" for w in linear.ways(T, N, C))
      continue
    rows = rng.standard_normal((T, C)) * 3 + 20
    if T == 1: rows[0, 7] = 3000
    x, w, b, r, g, h = (half(a) for a in (rows, rng.standard_normal((N, C)) * 0.1, rng.standard_normal(N),
                                          rng.standard_normal((T, N)), 1 + 0.1 * rng.standard_normal(C), 0.1 * rng.standard_normal(C)))
    ln = types.SimpleNamespace(weight=g, bias=h, eps=1e-5)
    X = f64(x)
    Xn = (X - X.mean(-1, keepdims=True)) / np.sqrt(X.var(-1, keepdims=True) + 1e-5) * f64(g) + f64(h)
    gelu = lambda y: 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))
    cases = [({}, X @ f64(w).T + f64(b)), ({"dtype": dtypes.float32, "b": None}, X @ f64(w).T),
             ({"ln": ln}, Xn @ f64(w).T + f64(b)), ({"ln": ln, "gelu": True}, gelu(Xn @ f64(w).T + f64(b))),
             ({"residual": r}, X @ f64(w).T + f64(b) + f64(r))]
    kernels = matvec.options(N, C)[widths.index(T)::len(widths)] or matvec.options(N, C)[:1]
    for j, kernel in enumerate(kernels):   # every case with the first option, one each with the others: emulated, minutes
      for kw, expected in cases if j == 0 else cases[j % len(cases):][:1]:
        got = matvec.linear(x, w, **{"b": b, **kw}, kernel=kernel)
        assert got.shape == (T, N) and got.dtype == kw.get("dtype", x.dtype)
        assert np.abs(f64(got) - expected).max() < tolerance() * np.abs(expected).max(), (kernel, kw.keys())
    assert f"matvec_{T}_{N}_{C}" in {p.arg.name for p in to_program_cache.values()}

def test_matvec_options_fit_the_shape():
  """Work-groups of 32, 64 and 128 threads that pad the row's 4-wide vectors by less than a third and, where they pad,
  into more than one load a thread; outputs dividing N; a row too short for them gets the largest power of two in it."""
  assert matvec.options(4800, 1600) == list(matvec.OPTIONS)                           # gpt2-xl: 400 vectors, 416 .. 512
  assert matvec.options(2304, 768) == [(64, 1), (32, 1), (64, 2), (32, 2)]             # gpt2: 192 vectors
  assert matvec.options(50257, 768) == [(64, 1), (32, 1)] and matvec.options(24, 30) == []
  assert matvec.options(96, 32) == [(8, 1)] and matvec.options(96, 16) == []
  # 104 vectors: 128 threads would pad them into one load each, which sums unwritten shared memory
  assert matvec.options(48, 416) == [(64, 1), (32, 1), (64, 2), (32, 2)]

# a decode's kernels (float16, CUDA sm_90), engine and plain; more is a regression, fewer a new pin. The engine's: 7 a
# layer (the four linear layers, the norms and GELU and the residual adds fused in; attention's scores, chunks and
# their combination, which writes the cache) and 10 around them (the host's token written, embedding, ln_f, lm_head,
# greedy verification)
DECODE_KERNELS = {"gpt2-xl": {"engine": 7 * 48 + 10, "plain": 779}, "gpt2": {"engine": 7 * 12 + 10, "plain": 203}}

def test_a_decode_launches_its_pinned_kernel_count(tmp_path):
  """tools/gpu_profile.py's capture of gpt2-xl's and gpt2's float16 decodes on tinygrad's NULL device for CUDA sm_90
  (NVRTC from pip's nvidia-cuda-nvrtc, which .ci/run installs; its profile stage runs float32): their kernel counts
  pinned, and the engine's predicted time below the port's."""
  try: import nvidia   # noqa: F401
  except ImportError:
    if os.environ.get("CI") == "true": pytest.fail("CI must have pip's nvidia-cuda-nvrtc")
    pytest.skip("NVIDIA's compiler from pip (nvidia-cuda-nvrtc) is not installed")
  root, out = pathlib.Path(__file__).resolve().parent.parent, tmp_path / "profile.json"
  run = subprocess.run([sys.executable, str(root / "tools" / "gpu_profile.py"), "--models", *DECODE_KERNELS, "--widths", "1",
                        "--dtypes", "float16", "--json", str(out)], env={**os.environ, "DEV": "NULL:CUDA:sm_90"},
                       capture_output=True, text=True, cwd=root)
  assert run.returncode == 0, run.stderr[-2000:]
  for name, pinned in DECODE_KERNELS.items():
    passes = {layer: p["1"] for layer, p in json.loads(out.read_text())[name]["float16"].items()}
    assert {layer: p["kernels"] for layer, p in passes.items()} == pinned, name
    assert passes["engine"]["predicted_ms"] < passes["plain"]["predicted_ms"]
    assert all(p["floor_ms"] == pytest.approx(p["weight_bytes"] / p["bandwidth"] * 1e3) for p in passes.values())

# ***** the engine against the port alone *****

@pytest.mark.backend
@pytest.mark.parametrize("kernel", ["lanes", "attention", "norm"])
def test_a_kernel_that_cannot_run_falls_back_with_one_line(tiny_dir, monkeypatch, capfd, disk, kernel):
  """A kernel that fails to compile (here: its UOp graph raises as tinygrad builds it) loses its measurement, and
  nothing is cached: the pass runs the fastest of the rest, one line on stderr names the kernel and the error, and the
  logits are the port's."""
  module, fns = {"lanes": (lanes, ["lanes_kernel", "vectors_kernel"]),
                 "attention": (attention, ["scores_kernel", "fused_kernel"]),
                 "norm": (norm, ["norm_kernel"])}[kernel]
  def broken(*args, **kwargs): raise RuntimeError("no such instruction on this device")
  for fn in fns: monkeypatch.setattr(module, fn, broken)
  fresh_choices(monkeypatch)   # earlier tests' choices: measured here afresh
  monkeypatch.setenv("SPEC_STEP_CACHE", "")
  model, plain = load(tiny_dir / "target"), load(tiny_dir / "target", plain=True)
  seq = [int(t) for t in np.random.default_rng(4).integers(0, 64, 6)]
  for m in (model, plain): m.prefill(seq[:-1])
  got, expected = model(seq[-1:], 5).numpy(), plain(seq[-1:], 5).numpy()
  lines = [l for l in capfd.readouterr().err.splitlines() if "cannot run" in l]
  name, way, kind = {"lanes": ("linear kernel", None, "linear"), "attention": ("attention kernels", Way("rows"), "attention"),
                     "norm": ("layer norm kernel", Way("row"), "norm")}[kernel]
  # the lanes kernel's layouts all fail, and attention's CPU designs
  ways = {Way("lanes", l) for l in lanes.LAYOUTS} if kernel == "lanes" else \
         {way, Way("fused")} if kernel == "attention" else {way}
  assert lines and all("no such instruction on this device" in l and name in l and any(f" {w} " in l for w in ways)
                       for l in lines)
  assert CHOSEN.measured[kind] and not ways & set(CHOSEN.measured[kind].values())
  assert not any(kind == f"spec_{'linear' if kernel == 'lanes' else kernel}" for kind, _ in disk), "a failure was cached"
  assert_close(got, expected)

def test_plain_runs_the_port_on_tinygrad_alone(tiny_dir, tmp_path, monkeypatch):
  """plain=True: the port's own modules, tinygrad's TinyJit and executor (no replay graph), nothing measured, stored or
  loaded, and every kernel tinygrad's own."""
  monkeypatch.setenv("SPEC_STEP_CACHE", str(tmp_path))
  for module in (linear, attention, norm): monkeypatch.setattr(module, "fastest", lambda *a, **kw: pytest.fail("measured under plain"))
  monkeypatch.setattr(engine, "half_pays", lambda: pytest.fail("measured under plain"))
  model = load(tiny_dir / "target", plain=True)
  assert type(model.h[0]) is models.gpt2.Block and type(model.h[0].attn.c_attn) is nn.Linear and type(model.ln_f) is models.gpt2.LayerNorm
  before = set(to_program_cache)
  spec.speculative_generate(model, load(tiny_dir / "draft", plain=True), [5, 6, 7], 2, 12, spec.Sampling(1.0), eos=None)
  assert all(type(step) is type(TinyJit(lambda: None)) for step in model.jits.values())
  calls = [call.src[0] for step in model.jits.values() if step.captured for call in step.captured.linear.src]
  assert calls and not any(c.op is Ops.CUSTOM_FUNCTION for c in calls) or Device[Device.DEFAULT].graph is not None
  names = {p.arg.name for k, p in to_program_cache.items() if k not in before}
  assert names and not any(n.startswith(("lanes_", "matvec_", *ATTENTION, "norm_", "stats_")) for n in names)
  assert list(tmp_path.iterdir()) == [], "a plain run stored a step"

GREEDY, SAMPLED, FILTERED = spec.Sampling(0.0), spec.Sampling(1.0), spec.Sampling(0.8, 20, 0.9)

def generations(target, draft, prompt, rounds, n) -> list:
  """Generations at a fixed seed for each (K, sampling) of rounds, and the target alone (K 0) greedy and sampled."""
  return [(K, s, spec.speculative_generate(target, draft, prompt, K, n, s, seed=5, eos=None)[0]) for K, s in rounds] \
    + [(0, s, spec.autoregressive_generate(target, prompt, n, s, seed=5, eos=None)[0]) for s in (GREEDY, SAMPLED)]

@pytest.mark.backend
def test_the_engine_generates_what_the_port_alone_generates(tiny_dir, monkeypatch):
  """With the engine's kernels wherever they fit (not only where they measure faster) and with plain=True, the same
  tokens: sampled at a fixed seed at K 1, greedy and filtered at K 4 (each K's passes, each sampling's rule), the target
  alone; and a (K+1)-wide pass's logits within the dtype's tolerance (the kernels sum in another order)."""
  monkeypatch.setenv("SPEC_STEP_CACHE", "")
  rounds = [(1, SAMPLED), (4, GREEDY), (4, FILTERED)]
  with engine.engine_kernels():
    pairs = [(load(tiny_dir / "target", plain=p), load(tiny_dir / "draft", plain=p)) for p in (False, True)]
    assert generations(*pairs[0], [5, 9, 2], rounds, 40) == generations(*pairs[1], [5, 9, 2], rounds, 40)
    block = [int(t) for t in np.random.default_rng(3).integers(0, 64, 5)]
    assert_close(*[target(block, 0).numpy() for target, _ in pairs])
  wide = device.work_groups()
  c = internals.runs_c_functions(Device.DEFAULT)
  lanes = "lanes_vectors" if c else "lanes"   # C: the vectors layout, and the fused attention for one row
  expected = {"matvec_5_96_32", "chunks_5_2_16", "stats_5_32"} if wide else {f"{lanes}_5_96_32", "scores_5_2_16", "norm_5_32"}
  one = {f"{lanes}_1_96_32", "attention_1_2_16" if c else "scores_1_2_16", "norm_1_32"}
  assert expected | one <= {p.arg.name for p in to_program_cache.values()}

@pytest.mark.backend
def test_the_engine_generates_what_the_port_alone_generates_on_the_shared_pair(enc):
  """The shared pair, the engine's measured choices against plain=True: the same tokens, greedy and sampled."""
  pairs = [(load(shared_dir() / "docs-target", plain=p), load(shared_dir() / "docs-draft", plain=p)) for p in (False, True)]
  prompt = enc.encode("The Python interpreter")
  rounds = [(4, s) for s in (GREEDY, SAMPLED, FILTERED)]
  runs = [generations(target, draft, prompt, rounds, 24) for target, draft in pairs]
  for (K, sampling, ours), (_, _, port) in zip(*runs):
    if ours != port: assert_rounding_apart(*pairs, prompt, ours, port, f"K {K}, {sampling}")

def assert_rounding_apart(engine_pair, plain_pair, prompt, ours, port, what):
  """float32: no difference at all. float16: at the first difference, the engine's and the port's next-token logits (the
  target's and the draft's) agree within the dtype's tolerance: a choice can flip where the two round differently, and
  nothing else may differ."""
  i = next(i for i, (a, b) in enumerate(zip(ours + [None], port + [None])) if a != b)
  assert dtype() == "float16", f"{what}: the engine's tokens differ from the port's at {i}"
  context = prompt + ours[:i]
  for model, reference in zip(engine_pair, plain_pair):
    assert_close(model(context, 0)[-1].numpy(), reference(context, 0)[-1].numpy())

# ***** the measured choice compares what a pass runs *****

def work_groups_or_none(what:str):
  """Where the device has no work-groups (tinygrad's CPU backend) the engine's GPU kernels are no candidate: nothing to
  plant; the test checks that instead."""
  if not device.work_groups():
    wide = linear.ways(1, 64, 64) + attention.ways(16, (dtypes.float32,) * 2)
    assert not any(w.kernel in ("matvec", "chunks") for w in wide), what
    return True
  return False

@pytest.mark.backend
def test_a_matvec_kernel_wrong_only_with_its_layer_norm_never_wins(monkeypatch, disk, capfd):
  """linear.choose() compares each candidate in the form a block runs it: a matvec kernel right as a bare x @ w.T + b
  but wrong with its layer norm folded in (its eps far off) drops out with one line; the bare form still runs it."""
  if work_groups_or_none("matvec"): return
  right = matvec.matvec_kernel
  def planted(*args, norm=None, **kw): return right(*args, norm=None if norm is None else norm + 1e5, **kw)
  monkeypatch.setattr(matvec, "matvec_kernel", planted)
  fresh_choices(monkeypatch)
  # run once: no verdict hangs on times
  monkeypatch.setattr(choice, "best_seconds", lambda fn, reps=3, before=None: (fn(), 1.0)[1])
  rng, half = np.random.default_rng(0), models.DTYPES[dtype()]
  f = lambda *shape: Tensor(rng.standard_normal(shape).astype(np.float32)).cast(half).realize()
  N, C = 16, 128
  weights, biases = [f(N, C) * 0.1], [f(N)]
  lns = [types.SimpleNamespace(weight=f(C), bias=f(C), eps=1e-5)]
  way = linear.choose(3, weights, biases, half, lns=lns)
  lines = [l for l in capfd.readouterr().err.splitlines() if "computes other values" in l]
  assert way.kernel != "matvec" and lines and all("with its layer norm" in l for l in lines), (way, lines)
  assert not any(kind == "spec_linear" for kind, _ in disk), "a choice with a wrong candidate was cached"
  x = f(3, C)
  np.testing.assert_allclose(matvec.linear(x, weights[0], biases[0], kernel=matvec.options(N, C)[0]).float().numpy(),
                             matvec.formula(x, weights[0], biases[0]).float().numpy(), rtol=tolerance(), atol=tolerance())

def planted(wrong:str, x:Tensor, ln):
  """A way's input and layer norm, planted wrong on one kind of row: "ordinary rows" an epsilon of 1 (a massive row's
  variance, 1e5 and more, swamps it; an ordinary row's is 1), "massive rows" the input's massive values dropped."""
  if wrong == "ordinary rows": return x, types.SimpleNamespace(weight=ln.weight, bias=ln.bias, eps=1.0)
  return x * (x.abs() < 1000), ln

@pytest.mark.backend
@pytest.mark.parametrize("wrong", ["ordinary rows", "massive rows"])
def test_a_candidate_wrong_on_one_kind_of_row_never_wins(monkeypatch, disk, capfd, wrong):
  """linear.choose() and norm.choose() compare each candidate on massive rows and on ordinary ones (a pass meets
  both) at each width: every way but tinygrad's, planted wrong only on ordinary rows or only on massive ones
  (planted()), drops out with one line, and tinygrad's is chosen; where the device has work-groups, also the matvec
  kernel with its fused layer norm's epsilon 1e3, in float16 (linear.choose(1, [w], [b], half, lns=[ln]) at width 32,
  96 outputs, which massive rows alone let through)."""
  right_apply, right_norm = linear.apply, norm.layer_norm
  def apply(x, w, b=None, dtype=None, ln=None, gelu=False, residual=None, way=None):
    if way not in (None, TINYGRAD) and ln is not None: x, ln = planted(wrong, x, ln)
    return right_apply(x, w, b, dtype, ln, gelu, residual, way)
  def layer_norm(x, w, b, eps, way=None, dtype=None):
    if way not in (None, TINYGRAD):
      x, ln = planted(wrong, x, types.SimpleNamespace(weight=w, bias=b, eps=eps))
      eps = ln.eps
    return right_norm(x, w, b, eps, way, dtype)
  monkeypatch.setattr(linear, "apply", apply)
  monkeypatch.setattr(norm, "layer_norm", layer_norm)
  fresh_choices(monkeypatch)
  # run once: no verdict hangs on times
  monkeypatch.setattr(choice, "best_seconds", lambda fn, reps=3, before=None: (fn(), 1.0)[1])
  rng, half = np.random.default_rng(0), models.DTYPES[dtype()]
  f = lambda *shape, dt=half: Tensor(rng.standard_normal(shape).astype(np.float32)).cast(dt).realize()
  N, C = 96, 32
  for T in (1, 3):
    ln = types.SimpleNamespace(weight=f(C) * 0.1 + 1, bias=f(C) * 0.1, eps=1e-5)
    ways = {"linear": linear.choose(T, [f(N, C) * 0.1], [f(N)], half, lns=[ln]), "norm": norm.choose(T, [ln], half)}
    err = capfd.readouterr().err
    lines = [l for l in err.splitlines() if "computes other values" in l]
    assert ways == {"linear": TINYGRAD, "norm": TINYGRAD}, (T, ways, lines)
    assert len(lines) == len(linear.ways(T, N, C, half)) - 1 + len(norm.ways(C)) - 1, err
    assert len(lines) == len(linear.ways(T, N, C, half)) - 1 + len(norm.ways(C)) - 1, lines
  assert not disk, "a choice with a wrong candidate was cached"
  if not device.work_groups() or wrong != "ordinary rows": return
  right_kernel = matvec.matvec_kernel
  monkeypatch.setattr(linear, "apply", right_apply); monkeypatch.setattr(norm, "layer_norm", right_norm)
  monkeypatch.setattr(matvec, "matvec_kernel", lambda *a, norm=None, **kw: right_kernel(*a, norm=norm and 1e3, **kw))
  fresh_choices(monkeypatch)
  ln = types.SimpleNamespace(weight=f(C, dt=dtypes.half) * 0.1 + 1, bias=f(C, dt=dtypes.half) * 0.1, eps=1e-5)
  way = linear.choose(1, [f(N, C, dt=dtypes.half) * 0.1], [f(N, dt=dtypes.half)], dtypes.half, lns=[ln])
  lines = [l for l in capfd.readouterr().err.splitlines() if "computes other values" in l]
  assert way.kernel != "matvec" and any("with its layer norm" in l for l in lines), (way, lines)

def test_a_choice_is_keyed_by_all_the_code_that_computes_its_candidates():
  """A measured choice's key holds the source of its module and of every module of the project it uses (helpers
  imported by name too): a change to a helper (device.row_chunk(), core_splits(), split_opts(), lanes.fits(),
  matvec.options(), norm.shift(), the inputs it is measured on, tinygrad's internals) measures the choice again."""
  import inspect
  from models.engine import internals
  splitting = [device.row_chunk, device.core_splits, device.split_opts]
  for module, helpers in (("linear", splitting + [lanes.fits, matvec.options, norm.shift, choice.activations,
                                                  choice.evictor]),
                          ("attention", splitting + [models.gpt2.Attention.attend, internals.custom_call]),
                          ("norm", [norm.shift, choice.activations]), ("native", [internals.Batch.refresh])):
    code = choice.sources(f"models.engine.{module}")
    assert all(inspect.getsource(h) in code for h in helpers), module

def combine_without_its_stores(out:UOp, parts:UOp, qkv:UOp, cache:UOp, pos:UOp, length:int) -> UOp:
  """attention.combine_kernel() planted wrong: the chunks combined, the block's keys and values never written."""
  (_, H, T, _, E), D = parts.shape, parts.shape[-1] - 2
  J = (pos + T + length - 1) // length
  h, t, d = UOp.range(H, 0), UOp.range(T, 1), UOp.range(D, 2, AxisType.LOCAL)
  j1, j2, j3 = (UOp.range(J, 3 + i, AxisType.REDUCE) for i in range(3))
  m = parts[0, h, t, j1, D].reduce(j1, arg=Ops.MAX)
  weight = lambda j: (parts[0, h, t, j, D] - m).exp()
  num = (weight(j2) * parts[0, h, t, j2, d]).reduce(j2, arg=Ops.ADD)
  den = (weight(j3) * parts[0, h, t, j3, D + 1]).reduce(j3, arg=Ops.ADD)
  store = out[0, t, h * D + d].store((num / den).cast(out.dtype))
  return UOp.group(store).end(h, t, d).sink(arg=KernelInfo(name=f"combine_{T}_{H}_{D}", opts_to_apply=()))

@pytest.mark.backend
def test_an_attention_that_leaves_the_cache_unwritten_never_wins(monkeypatch, disk, capfd):
  """attention.choose() counts the cache a candidate writes among its outputs, on fresh caches for each: the GPU
  design with a combine kernel that never stores the block's keys and values (its attention right at the first
  context) drops out with one line."""
  if work_groups_or_none("chunks"): return
  monkeypatch.setattr(attention, "combine_kernel", combine_without_its_stores)
  fresh_choices(monkeypatch)
  # run once: no verdict hangs on times
  monkeypatch.setattr(choice, "best_seconds", lambda fn, reps=3, before=None: (fn(), 1.0)[1])
  layers = [layer(2, 128, 16) for _ in range(2)]
  caches = [a.cache_kv.numpy().tobytes() for a in layers]   # bytes: an unwritten cache may hold NaN's patterns
  way = attention.choose(2, layers, dtypes.float32)
  lines = [l for l in capfd.readouterr().err.splitlines() if "computes other values" in l]
  assert way.kernel != "chunks" and lines and all("attention kernels" in l for l in lines), (way, lines)
  assert [a.cache_kv.numpy().tobytes() for a in layers] == caches, "the model's caches were written"

@pytest.mark.backend
@pytest.mark.parametrize("C", [768, 1600])
def test_one_pass_layer_norms_cancel_nothing_at_a_massive_element(C):
  """The layer norms that sum a row in one pass (the stats kernel, the matvec kernel's fused norm; float32) stay within
  1e-5 of each output row's scale of the float64 definition at gpt2's and gpt2-xl's widths wherever a massive value
  sits: the first element (what the sums were shifted by, which cancelled 3e-4 of the row), the middle, the last,
  elsewhere; beside a row whose mean is far from 0. The row kernel and tinygrad's take two passes."""
  if work_groups_or_none("norms"): return
  rng = np.random.default_rng(C)
  rows = [0, C // 2, C - 1, 7]
  x = rng.standard_normal((len(rows) + 1, C)).astype(np.float32)
  for t, at in enumerate(rows): x[t, at] = choice.MASSIVE * (-1) ** t
  x[-1] += 20
  w, b = 1 + 0.1 * rng.standard_normal(C).astype(np.float32), 0.1 * rng.standard_normal(C).astype(np.float32)
  W = (rng.standard_normal((8, C)) * 0.05).astype(np.float32)
  xs = x.astype(np.float64)
  normed = (xs - xs.mean(-1, keepdims=True)) / np.sqrt(xs.var(-1, keepdims=True) + 1e-5) * w + b
  ln = types.SimpleNamespace(weight=Tensor(w), bias=Tensor(b), eps=1e-5)
  row_error = lambda got, want: (np.abs(got - want).max(-1) / np.abs(want).max(-1)).max()
  for group in norm.groups(C)[:1]:
    assert row_error(norm.layer_norm(Tensor(x), Tensor(w), Tensor(b), 1e-5, Way("stats", group)).numpy(), normed) < 1e-5, group
  kernel = matvec.options(8, C)[0]
  assert row_error(matvec.linear(Tensor(x), Tensor(W), kernel=kernel, ln=ln).numpy(), normed @ W.T.astype(np.float64)) < 1e-5

@pytest.mark.backend
@pytest.mark.quick
def test_a_steps_output_is_read_without_a_copy_scheduled(tiny_dir, monkeypatch):
  """An engine model's read() (the sampler's one host read a round) gives tolist()'s values by copying the step's
  output buffer out (internals.read()), scheduling nothing (Tensor._buffer: 0.5 ms a round on a CPU); what it read stays
  as read when the step rewrites its output; a Tensor not realized yet is read as tolist() reads it."""
  model, plain = load(tiny_dir / "target"), load(tiny_dir / "target", plain=True)
  assert model.read != plain.read
  step = lambda m, t, pos: m.jit(GPT2.forward, 1)(m, Tensor([[t]], dtype=dtypes.int32), m.positions.bind(pos))
  for i in range(3): out = step(model, 5 + i, i)
  want = out.tolist()
  monkeypatch.setattr(Tensor, "_buffer", lambda self: pytest.fail("read() scheduled a copy"))
  got = model.read(out)
  assert got == want and np.array(got).shape == out.shape == (1, model.cfg.padded_vocab)
  step(model, 9, 3)
  assert model.read(out) != got and got == want, "a read shares the step's buffer"
  monkeypatch.undo()
  lazy = Tensor([1.5, 2.5]) * 2
  assert model.read(lazy) == [3.0, 5.0] == plain.read(lazy)

@pytest.mark.backend
@pytest.mark.quick
def test_a_runs_rounds_call_every_step_on_tensors_it_has_seen(tiny_dir, monkeypatch):
  """A second run of the same request, speculative or the target alone, calls no step through tinygrad's JIT in its
  rounds: the key and the sampling's values are the same Tensors (spec.constant()), so every step takes its shortcut
  (a new Tensor costs a step's first call a copy and tinygrad's gathering). The sampling's values stay Tensors of their
  own where two are equal (a step given one Tensor twice fails)."""
  from tinygrad.engine.jit import _TinyJit
  rounds, through_jit, plain_call, plain_sync = [], [], _TinyJit.__call__, spec.synchronize
  monkeypatch.setattr(_TinyJit, "__call__", lambda self, *a, **k: (through_jit.append(bool(rounds)),
                                                                  plain_call(self, *a, **k))[1])
  monkeypatch.setattr(spec, "synchronize", lambda: (rounds.append(1), plain_sync())[1])
  target, draft = load(tiny_dir / "target"), load(tiny_dir / "draft")
  runs = {"speculative": lambda: spec.speculative_generate(target, draft, [1, 2, 3], 2, 12, seed=7, eos=None),
          "the target alone": lambda: spec.autoregressive_generate(target, [1, 2, 3], 12, seed=7, eos=None)}
  for name, run in runs.items():
    first = run()[0]
    rounds.clear(); through_jit.clear()
    assert run()[0] == first, name
    assert through_jit and True not in through_jit, f"{name}: a step called through tinygrad's JIT in the rounds"
  assert spec.seed_key(7) is spec.seed_key(7) and spec.seed_key(7) is not spec.seed_key(8)
  sampling = spec.Sampling(temperature=0.5, top_p=0.5)
  temperature, _, top_p = sampling.tensors(64)
  assert temperature is not top_p and temperature is sampling.tensors(64)[0]

#!/usr/bin/env python3
"""gpt2-xl's and gpt2's step passes profiled for an H100 or H200 without a GPU: their kernels, their bytes, a time.

  python3 tools/gpu_profile.py                          # CI: both models, float16 and float32, engine and --plain
  python3 tools/gpu_profile.py --models gpt2 --widths 1 --kernels   # every kernel of gpt2's decode
  python3 tools/gpu_profile.py --json profile.json
  python3 tools/gpu_profile.py --gpu H200 --widths 1 3   # an H200's copy rate and multiprocessors (GPUS, below)

A step pass is what a round runs on the target: its forward over T tokens and the greedy verification, one JIT call
(spec.Verifier; T 1 is a decode). Each is captured on tinygrad's NULL device for CUDA sm_90 (kernels lowered, rendered
and compiled by NVRTC; nothing runs), dummy weights, the KV cache at CONTEXT positions. Per kernel: the bytes it must
move (tinygrad's estimate, each byte once), its threads and work-groups, the bytes of its widest load from a weight and
its loads in flight, and a predicted time from this model of a Hopper GPU (constants below, GPUS per GPU):

  time = LAUNCH + max(traffic / min(SUSTAINED, in_flight / LATENCY), operations a thread x OPERATION x waves)
  traffic = the bytes of the weight matrices every thread's loads read (a matrix read once per row counts each time),
            the other buffers' bytes once (tinygrad's estimate: vectors shared by the threads, cached)
  in_flight = resident threads x the bytes of a thread's loads in min(UNROLLED, trips) iterations of its loop
  resident threads = min(threads, SMS x min(THREADS_PER_SM, BLOCKS_PER_SM x a work-group's threads))
  waves = threads / (SMS x THREADS_PER_SM), at least 1

(Little's law: the memory runs at its speed only with SUSTAINED x LATENCY bytes requested and not yet returned; an SM
holds at most 32 work-groups, so one-thread work-groups keep 4,224 threads of an H100 busy; a thread's operations run
one after another.) LATENCY, UNROLLED, SUSTAINED and OPERATION are fitted to what an H100 timed (docs/backends.md):
30 matrix-vector kernels (tinygrad's matmul, the lanes kernel, the best of a matvec sweep), within 3.5x of each (the
matvec sweep's within 1.7x), and gpt2-xl's decodes and 3-token pass with --plain, within 1.41x (`--fit` refits them to a device report's kernels). The engine's kernel choices, measured by a clock on a GPU, are made
here by the same model. Per pass: kernels, weight
bytes, the floor (those bytes at BANDWIDTH, a device copy's rate), the predicted time, and the share of weight bytes
read by loads of 16 bytes or more. The model's limits: no cache, no arithmetic. docs/backends.md.
"""
import argparse, contextlib, json, math, os, pathlib, sys, time, types
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "tools"))
if __name__ == "__main__":   # imported (tools/device_report.py), the model only: nothing set
  os.environ.setdefault("DEV", "NULL:CUDA:sm_90")
  os.environ["NULL_ALLOW_COPYOUT"] = "1"          # the round's host read gets zeros
  os.environ["SPEC_STEP_CACHE"] = ""              # every step captured here
  import render_kernels                           # noqa: F401  pip's NVRTC found as render_kernels.py finds it
from tinygrad import Tensor, TinyJit, Context, dtypes   # noqa: E402
from tinygrad.nn.state import get_state_dict   # noqa: E402
from tinygrad.uop.ops import Ops, AddrSpace, UOp, sym_infer   # noqa: E402
import models, spec                             # noqa: E402
from models import engine                       # noqa: E402
from models.engine import attention, choice, linear, norm   # noqa: E402

# per GPU: a device copy's rate (bytes/s, the floor's price) and its multiprocessors. The H100's copy was measured
# (docs/backends.md); the H200's is predicted: its HBM3e's 4.8 TB/s at the share of the H100's 3.35 its copy reached
GPUS = {"H100": (3.0e12, 132), "H200": (4.3e12, 132)}
BANDWIDTH, SMS = GPUS["H100"]
LAUNCH = 2.0e-6       # s a kernel in a CUDA graph on an H100, within what docs/backends.md measured
SUSTAINED = 1.0e12    # bytes/s at most, from every load in flight (fitted, as the three below)
LATENCY = 0.1e-6      # s a load is in flight
UNROLLED = 2          # iterations of a loop whose loads a thread has in flight at once: the compiler's unrolling
OPERATION = 3e-9      # s an operation of a thread takes, one after another
THREADS_PER_SM, BLOCKS_PER_SM = 2048, 32   # what a Hopper multiprocessor holds at once
MATRIX = 1 << 20      # bytes: a weight this large is a matrix, read from memory as often as its loads run
CONTEXT = 256         # cached positions: the start position bound in every pass
WIDE = 16             # bytes: a load this wide or wider is a wide load

def use(gpu:str) -> str:
  """The constants of the GPU named in gpu (as nvidia-smi names it: 'NVIDIA H200', or 'H200'); the H100's where none
  is named. Returns the one used."""
  global BANDWIDTH, SMS
  name = next((k for k in GPUS if k in gpu.upper()), "H100")
  BANDWIDTH, SMS = GPUS[name]
  return name

def kernel_calls(linear):
  """The CALLs of a captured pass in order, batched graphs opened."""
  for call in linear.src:
    ast = call.src[0]
    if ast.op is Ops.CUSTOM_FUNCTION and ast.arg == "graph": yield from kernel_calls(ast.src[0])
    elif ast.op is Ops.PROGRAM: yield call

def loads(program) -> list[tuple[int, int, int]]:
  """(param slot, bytes, times a thread runs it) per global load of a program's linearized code."""
  out, mults = [], [1]
  for u in program.src[1].src:
    if u.op is Ops.RANGE: mults.append(mults[-1] * (int(u.src[0].vmax) if u.dtype is not dtypes.void else 1))
    elif u.op is Ops.END: mults.pop()
    elif u.op is Ops.LOAD and u.src[0].addrspace == AddrSpace.GLOBAL:
      param = u.src[0]
      while param.op is not Ops.PARAM: param = param.src[0]
      out.append((param.arg.slot, u.max_numel() * u.dtype.itemsize, mults[-1]))
  return out

def profile_kernel(call, weights:set, var_vals:dict) -> dict:
  """One kernel's figures and predicted seconds."""
  program = call.src[0]
  info, est = program.arg, program.src[0].arg.estimates
  glob, local = info.launch_dims(var_vals)
  threads, groups = math.prod(glob) * math.prod(local), math.prod(glob)
  moved = sym_infer(est.mem, var_vals)
  args = [a for a in call.src[1:] if not a.is_bound_var]
  is_weight = lambda slot: slot < len(args) and args[slot].op is Ops.BUFFER and args[slot].buffer in weights
  ld = loads(program)
  deepest = max((m for _, _, m in ld), default=1)
  # a weight matrix's bytes as often as threads load them (a matrix read once per row is read that often); the rest,
  # vectors shared by every thread and cached, once (tinygrad's estimate)
  matrix = lambda s: is_weight(s) and args[s].buffer.nbytes >= MATRIX
  reread = threads * sum(b * m for s, b, m in ld if matrix(s))
  features = dict(traffic=reread + moved - sum(args[s].buffer.nbytes for s in {s for s, _, _ in ld if matrix(s)}),
                  threads=threads, ops=sym_infer(est.ops, var_vals),
                  resident=min(threads, SMS * min(THREADS_PER_SM, BLOCKS_PER_SM * math.prod(local))),
                  per_iteration=sum(b for _, b, m in ld if m == deepest),
                  trips=deepest // max((m for _, _, m in ld if m < deepest), default=1))   # the innermost loop's
  weight_loads = [(b, m) for s, b, m in ld if is_weight(s)]
  read, wide = sum(b * m for b, m in weight_loads), sum(b * m for b, m in weight_loads if b >= WIDE)
  weight_bytes = sum(args[s].buffer.nbytes for s in {s for s, _, _ in ld if is_weight(s)})
  return dict(name=info.function_name, bytes=moved, groups=groups, **features,
              load_bytes=max((b for b, _ in weight_loads), default=0), in_flight=in_flight(features),
              weight_bytes=weight_bytes, wide_bytes=weight_bytes * wide / read if read else 0, seconds=seconds(features))

def in_flight(f:dict, unrolled:int=UNROLLED) -> int: return f["resident"] * f["per_iteration"] * min(unrolled, f["trips"])

def seconds(f:dict, latency:float=LATENCY, unrolled:int=UNROLLED, sustained:float=SUSTAINED,
            operation:float=OPERATION) -> float:
  """The model's time for a kernel of these features (profile_kernel())."""
  memory = max(f["traffic"], 1) / min(sustained, max(in_flight(f, unrolled), 1) / latency)
  return LAUNCH + max(memory, f["ops"] / f["threads"] * operation * max(1, f["threads"] / (SMS * THREADS_PER_SM)))

def fit(kernels:list[dict]) -> tuple[float, dict]:
  """LATENCY, UNROLLED, SUSTAINED and OPERATION on a grid, fitted to kernels measured on a GPU (each with its features
  and us): (the largest ratio between a prediction and its measurement either way, the constants)."""
  grid = [dict(latency=l * 1e-7, unrolled=u, sustained=b * 1e11, operation=o * 1e-10) for l in (1, 2, 4, 6, 8, 10)
          for u in (1, 2, 4, 8, 12, 16) for b in (8, 10, 12, 15, 20, 25, 30) for o in (0, 5, 10, 20, 30, 50, 80)]
  worst = lambda c: max(abs(math.log(seconds(k, **c) * 1e6 / k["us"])) for k in kernels)
  best = min(grid, key=worst)
  return math.exp(worst(best)), best

def predicted_seconds(linear, weights:set, var_vals:dict) -> float:
  return sum(profile_kernel(c, weights, var_vals)["seconds"] for c in kernel_calls(linear))

@contextlib.contextmanager
def model_clock(weights:set):
  """The engine's measured choices made by this model: a captured function's predicted seconds (its outputs NULL's
  zeros), nothing cached; a flush before a call (before) changes nothing: the model streams every weight."""
  saved = choice.captured, choice.cached, choice.first_stored
  def captured(fn, calls, timed=1, before=None, after=list):
    step = TinyJit(lambda *args: [t.realize() for t in fn(*args)])
    with Context(BEAM=0):
      for _ in range(2): step(*calls[0])
    bound = lambda args: {v.expr: value for v, value in (a.unbind() for a in args if isinstance(a, UOp))}
    seconds = sum(predicted_seconds(step.captured.linear, weights, bound(args)) for args in calls[:timed])
    return seconds, [out for args in calls for out in [t.numpy() for t in step(*args)] + after()], lambda: seconds
  # over one layer: the model predicts the same for every layer of a shape, and capturing 48 took minutes
  one_layer = lambda model, widths: choose(types.SimpleNamespace(**{**vars(model), "h": model.h[:1]}), widths)
  choice.cached, choice.first_stored = lambda *a: None, lambda t, k, v: v
  choose, engine.choose_kernels = engine.choose_kernels, one_layer
  for module in (attention, linear, norm): module.captured = captured
  try: yield
  finally:
    choice.captured, choice.cached, choice.first_stored = saved
    engine.choose_kernels = choose
    for module in (attention, linear, norm): module.captured = saved[0]

def profile(name:str, dtype:str, widths:list[int], plain:bool) -> dict[int, dict]:
  """Every width's step pass of one model, dtype and layer: {T: figures, with its kernels}."""
  model = models.load(name, dtype, dummy=True, plain=plain)
  weights = {t.uop.buffer for k, t in get_state_dict(model).items() if "cache_kv" not in k}
  verifier, out = spec.Verifier(model, spec.Sampling(), spec.seed_key(0), "token"), {}
  with model_clock(weights):
    for T in widths:
      for nonce in range(2): verifier([1] * T, None, CONTEXT, nonce)   # captured on the second
      step = verifier.step(T, True, ids=True)
      linear = (step.fn if hasattr(step, "fn") else step).captured.linear
      kernels = [profile_kernel(c, weights, {"start_pos": CONTEXT, "nonce": 1}) for c in kernel_calls(linear)]
      weight_bytes = sum(b.nbytes for b in weights)
      read = max(sum(k["weight_bytes"] for k in kernels), 1)
      out[T] = dict(kernels=len(kernels), weight_bytes=weight_bytes, bandwidth=BANDWIDTH, floor_ms=weight_bytes / BANDWIDTH * 1e3,
                    predicted_ms=sum(k["seconds"] for k in kernels) * 1e3,
                    wide_load_fraction=sum(k["wide_bytes"] for k in kernels) / read, per_kernel=kernels)
  return out

def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--models", nargs="+", default=["gpt2-xl", "gpt2"], help="models by name (default: gpt2-xl gpt2)")
  ap.add_argument("--widths", type=int, nargs="+", default=[1, 2, 3, 5, 9], help="tokens a pass (default: 1 2 3 5 9)")
  ap.add_argument("--dtypes", nargs="+", default=["float16", "float32"], choices=["float16", "float32"],
                  help="weights' precision (default: both)")
  ap.add_argument("--plain", choices=["both", "yes", "no"], default="both", help="--plain, the engine, or both")
  ap.add_argument("--gpu", choices=list(GPUS), default="H100", help="the GPU whose copy rate and multiprocessors "
                  "the model uses (default: H100)")
  ap.add_argument("--kernels", action="store_true", help="print every kernel of every pass")
  ap.add_argument("--json", metavar="FILE", help="write the figures per model, dtype, engine or plain, and width")
  ap.add_argument("--fit", metavar="REPORT_JSON", help="fit the model's constants to the kernels a GPU timed "
                  "(tools/device_report.py's report.json) and exit")
  args = ap.parse_args()
  use(args.gpu)
  if args.fit:
    kernels = json.loads(pathlib.Path(args.fit).read_text())["stages"]["passes"]["decode_kernels"]
    worst, constants = fit(kernels)
    now = max(abs(math.log(k["predicted_us"] / k["us"])) for k in kernels)
    print(f"{len(kernels)} kernels: within {math.exp(now):.2f}x of each now, {worst:.2f}x with {constants}")
    return 0
  result = {}
  for name in args.models:
    for dtype in args.dtypes:
      for plain in {"both": (False, True), "yes": (True,), "no": (False,)}[args.plain]:
        t0, layer = time.perf_counter(), "plain" if plain else "engine"
        passes = profile(name, dtype, args.widths, plain)
        for T, p in passes.items():
          print(f"{name} {dtype} {layer:6} T {T}: {p['kernels']:4} kernels, predicted {p['predicted_ms']:7.3f} ms = "
                f"{p['predicted_ms'] / p['floor_ms']:5.1f}x the floor {p['floor_ms']:.3f} ms, wide loads "
                f"{p['wide_load_fraction']:.0%} of the weight bytes", flush=True)
          if args.kernels:
            for k in p["per_kernel"]:
              print(f"    {k['name'][:40]:40} {k['traffic']:>13,} B read {k['threads']:>8} threads {k['groups']:>6} groups "
                    f"load {k['load_bytes']:2} B in flight {k['in_flight']:>9,} B {k['seconds'] * 1e6:8.1f} µs")
          figures = {k: v for k, v in p.items() if k != "per_kernel" or args.kernels}
          result.setdefault(name, {}).setdefault(dtype, {}).setdefault(layer, {})[T] = figures
        print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
  if args.json: pathlib.Path(args.json).write_text(json.dumps(result, indent=1))
  return 0

if __name__ == "__main__": sys.exit(main())

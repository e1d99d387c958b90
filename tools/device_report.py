#!/usr/bin/env python3
"""Measure spec on the device it runs on: one command for a GPU's user, and the source of every GPU figure in the docs.

  DEV=CUDA python3 tools/device_report.py --out DIR     # 9-10 minutes on a GPU (DEV pinned, as for spec.py)
  python3 tools/device_report.py --out DIR --tiny       # every stage on tiny models: minutes (CI: the CPU)
  python3 tools/device_report.py --pack .pair           # the luggage for a GPU machine without network (below)
  DEV=CUDA python3 tools/device_report.py --out DIR --pair .pair/docs-deep .pair/docs-draft --wheels .pair/wheels

DIR holds two files, DIR/report.md and DIR/report.json (every figure, and what `gpu_profile.py --fit` reads), each
replaced whole (never half written) whenever a stage adds a figure and when it ends: a run cut short keeps every
figure taken, each stage's status (running, done, cut at its limit, failed with its traceback's tail) and the stages
planned but not reached. Caches and scratch go elsewhere (--scratch). Stages, in order, each a process of its own
with a time limit of its own, ended with the command (the first three land within 5 minutes on a cold GPU):
  device   the device, its renderer and compiler, tinygrad and Python, and a device copy's bandwidth, tinygrad's first
           and PyTorch's after: the floor's price
  headline gpt2-xl's decode (random weights of its shape) in float16 with --plain, then with the engine, then float32
           both ways, each against the floor
  pair     the trained deep pair's speculative speedup against the target alone (float16 where the device has it,
           greedy, default flags; --pair, else ../shared/models; --tiny: a tiny pair unless --pair), saved per
           generation
  passes   gpt2-xl's decode and 3-, 5-, 9-token passes and gpt2's decode, engine and --plain, both dtypes, beside the
           GPU profile's prediction (tools/gpu_profile.py); the engine with each table emptied in turn; one decode's
           kernels timed one by one, the memory flushed before each (and from the L2)
  cold     a cold `spec.py --dummy-weights` run (gpt2-xl, gpt2, K 2; empty caches): its first token, or none within
           the stage's limit (at least COLD_WAIT seconds)
  speedup  dummy gpt2-xl/gpt2's speculative speedup at the seed's acceptance, predicted from measured passes, and the
           host's and the device's memory
  choice   the engine's choice step for gpt2-xl and gpt2 at widths 1 and 3, from a cache of its own (a first run's
           cost): each candidate's time, the step's wall time
  kernels  every option of every engine kernel against its formula, at gpt2-xl's and gpt2's shapes, widths 1 3 5 16,
           float16 and float32: error and time a call
  search   gpt2's decode with tinygrad's BEAM search (--search 2): only when asked for (--stages ... search)
The caches (tinygrad's, the engine's choices and stored steps) are the scratch folder's own: the first stages meet a
first run's work. --wheels: a directory of wheels (.whl, or .whl.xz as --pack writes them) installed first where
tinygrad cannot be imported (a machine without network). Exit 1 if a stage failed, was cut short or was not reached.
"""
import argparse, contextlib, hashlib, json, lzma, math, os, pathlib, platform, shutil, signal, subprocess, sys
import tempfile, threading, select, time, traceback
ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "models"
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "tools"))

# seconds each, in order; search (only when asked for: --stages) takes what is left of the budget. On a cold H100
# (docs/backends.md) the engine chose gpt2-xl's kernels in 26-42 s a width and captured a step in 10-17 s: the
# headline's four decodes and the pair's steps each fit their limit, and both land by 300 s into the run
STAGES = {"device": 25, "headline": 125, "pair": 140, "passes": 90, "cold": 150, "speedup": 45, "choice": 60,
          "kernels": 75, "search": 0}
BUDGET = 560   # seconds for the stages: a lease's command runs at most 600, the wheels' install first
COLD_WAIT = 135   # the cold stage waits this long for a first token at least: the target is one within 2 minutes
TRAVELS = 60 << 20   # what travels to a lent machine (the luggage and the code) stays under this: it carries 64 MiB
TINY_SLACK = 3  # --tiny's limits are this many times the stages': a CPU compiles its kernels slowly, beside other work
WIDTHS, PASS_WIDTHS, CHOICE_WIDTHS = (1, 3, 5, 16), (1, 3, 5, 9), (1, 3)
TINY_WIDTHS = (1, 3)   # --tiny's kernels and passes: the paths all run, quickly
FLUSH = 256 << 20   # bytes read and written before a kernel's cold time: over 4x the L2 of an H100 or an H200 (50 MB)

# ***** the stages' environment *****

def bootstrap(wheels:str|None) -> None:
  """Where tinygrad cannot be imported and wheels are given, install them (.whl, or .whl.xz unpacked first) into a
  directory of the report's and run again with it on the path (a GPU machine without network)."""
  try: import tinygrad  # noqa: F401
  except ImportError:
    if not wheels: raise SystemExit("tinygrad is not installed: pip install -r requirements.txt, or give --wheels DIR")
    site = pathlib.Path(tempfile.mkdtemp(prefix="spec-wheels-"))
    found = [*pathlib.Path(wheels).glob("*.whl")]
    for packed in pathlib.Path(wheels).glob("*.whl.xz"):
      found.append(site / packed.name.removesuffix(".xz"))
      found[-1].write_bytes(lzma.decompress(packed.read_bytes()))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target",
                    str(site / "lib"), *map(str, found)], check=True)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site / "lib"), os.environ.get("PYTHONPATH")]))
    os.execv(sys.executable, [sys.executable, *sys.argv])

def tokenizer_dir(pair, environment:str|None, scratch:pathlib.Path) -> str|None:
  """GPT-2's tokenizer for tiktoken: the environment's cache where it holds every file of the carried one (beside a
  packed pair, its files xz-compressed, or ../shared/models), else the carried one, unpacked into scratch (a machine's
  own cache may lack GPT-2's)."""
  places = ([pathlib.Path(pair[0]).parent / "tiktoken"] if pair else []) + [SHARED / "tiktoken"]
  if (carried := next((d for d in places if d.is_dir()), None)) is None: return environment
  names = [f.name.removesuffix(".xz") for f in carried.iterdir()]
  if environment and all((pathlib.Path(environment) / n).is_file() for n in names): return environment
  if all(not f.name.endswith(".xz") for f in carried.iterdir()): return str(carried)
  (here := scratch / "tiktoken").mkdir(parents=True, exist_ok=True)
  for f in carried.iterdir():
    (here / f.name.removesuffix(".xz")).write_bytes(lzma.decompress(f.read_bytes()) if f.suffix == ".xz" else
                                                    f.read_bytes())
  return str(here)

def environment(scratch:pathlib.Path, pair) -> dict[str, str]:
  """The stages' environment: caches of the report's own (tinygrad reads CACHEDB as it is imported), GPT-2's tokenizer,
  and tinygrad's bounds proofs off (they need z3, which a borrowed machine may lack; CI proves bounds on the CPU)."""
  tiktoken = tokenizer_dir(pair, os.environ.get("TIKTOKEN_CACHE_DIR"), scratch)
  return {**os.environ, "CACHEDB": str(scratch / "cache.db"), "SPEC_STEP_CACHE": str(scratch / "steps"),
          "SPEC_CHOICES": str(scratch / "choices.db"), "CHECK_OOB": "0", "POCL_EXTRA_BUILD_FLAGS": os.environ.get("POCL_EXTRA_BUILD_FLAGS", "-w"),
          "PYTHONUNBUFFERED": "1", **({"TIKTOKEN_CACHE_DIR": tiktoken} if tiktoken else {})}

def replace(path:pathlib.Path, text:str) -> None:
  """path's new text, whole or not at all: written beside it, then renamed over it."""
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  tmp.write_text(text)
  os.replace(tmp, path)

def publish(out:pathlib.Path, scratch:pathlib.Path) -> None:
  """DIR/report.json and DIR/report.md from every stage's figures so far, and the plan: the stages not reached."""
  plan = json.loads((scratch / "plan.json").read_text()) if (scratch / "plan.json").is_file() else {}
  planned = plan.get("stages", [n for n in STAGES if (scratch / f"{n}.json").is_file()])
  stages = {n: json.loads((scratch / f"{n}.json").read_text()) for n in planned if (scratch / f"{n}.json").is_file()}
  unreached = [n for n in planned if n not in stages]
  floor = stages.get("device", {}).get("floor_bandwidth")
  replace(out / "report.json", json.dumps({"plan": plan, "stages": stages, "not_reached": unreached}, indent=1,
                                          default=str))
  sections = [md_plan(plan, stages, unreached)] + \
             [MARKDOWN[n](d, floor) + "\n\n" + status(d) for n, d in stages.items()]
  replace(out / "report.md", "\n\n".join(sections) + "\n")

def status(d:dict) -> str:
  s = d.get("status", "running")
  if s == "running": return f"*{d['stage']}: running (started {d.get('started')}); a report that ends here was cut*"
  tail = "".join(f"\n    {line}" for line in d.get("error", "").splitlines())
  return f"*{d['stage']}: {s} after {d.get('seconds', 0):.0f} s (limit {d.get('limit', 0):.0f} s)*{tail}"

class Stage:
  """A stage's figures: the scratch folder's <name>.json, and the report rewritten, whenever it adds some."""
  def __init__(self, out:pathlib.Path, scratch:pathlib.Path, name:str, tiny:bool, pair):
    self.out, self.scratch, self.name, self.tiny, self.pair = out, scratch, name, tiny, pair
    self.data = {"stage": name, "complete": False, "status": "running",
                 "started": time.strftime("%H:%M:%S UTC", time.gmtime())}
  def save(self, **items) -> None:
    self.data.update(items)
    replace(self.scratch / f"{self.name}.json", json.dumps(self.data, indent=1, default=str))
    publish(self.out, self.scratch)

# ***** the models, full size or tiny *****

def configs(tiny:bool) -> dict:
  import models
  if not tiny: return {"gpt2-xl": models.CONFIGS["gpt2-xl"], "gpt2": models.CONFIGS["gpt2"]}
  # GPT-2's vocabulary, so that spec.py takes any prompt; the trained pair's stand-in has gpt2's shape (tiny_pair())
  return {"gpt2-xl": models.GPT2Config(n_layer=4, n_head=4, n_embd=128, vocab_size=50257, n_positions=256),
          "gpt2": models.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=50257, n_positions=256)}

def model(name:str, dtype:str, tiny:bool, plain:bool=False):
  """Dummy weights of name's shape (tiny: a few layers of its kind), through the engine unless plain."""
  import models
  from models import engine, gpt2
  m = gpt2.randomize(gpt2.GPT2(configs(tiny)[name], models.DTYPES[dtype]))
  return m if plain else engine.apply(m)

def dtype_names(tiny:bool=False) -> list[str]:
  """The dtypes the device has, half first; --tiny: the first alone (the paths are the same)."""
  from tinygrad import Device, dtypes
  names = (["float16"] if dtypes.half in Device[Device.DEFAULT].renderer.supported_dtypes() else []) + ["float32"]
  return names[:1] if tiny else names

def auto_dtype() -> str:
  """What --dtype auto resolves to here (measured once per machine)."""
  from models import resolve_dtype
  return "float16" if resolve_dtype("auto").name == "half" else "float32"

def call_seconds(fn, *args, reps:int=5) -> float:
  """fn(*args) captured by a TinyJit, then the fastest of reps synchronized calls."""
  from tinygrad import TinyJit
  from spec import best_seconds
  step = TinyJit(fn)
  for _ in range(2): step(*args)
  return best_seconds(lambda: step(*args), reps)

# ***** (a) the device *****

def device_stage(st:Stage) -> None:
  from tinygrad import Device
  import numpy as np, importlib.metadata
  dev = Device[Device.DEFAULT]
  info = dict(device=Device.DEFAULT, target=str(dev.renderer.target), renderer=type(dev.renderer).__name__,
              compiler=type(dev.compiler).__name__, dev=os.environ.get("DEV"),
              python=platform.python_version(), tinygrad=importlib.metadata.version("tinygrad"), numpy=np.__version__,
              host=platform.node(),
              processor=platform.processor() or platform.machine(), cores=os.cpu_count(), dtypes=dtype_names(),
              date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), commit=git("rev-parse", "--short", "HEAD"),
              modified=bool(git("status", "--porcelain", "--untracked-files=no")), code=code_hash())
  if gpu := nvidia_smi("name,driver_version,memory.total"): info["gpu"] = gpu
  st.save(info=info)
  n = (16 if st.tiny else 1024) << 20
  copies = {"tinygrad copy": tinygrad_copy(n)}
  st.save(copy_bytes=n, copies=copies, floor_bandwidth=max(copies.values()))   # the floor, before PyTorch's import
  if (torch_copy := pytorch_copy(n)) is not None:
    copies |= torch_copy
    st.save(copies=copies, floor_bandwidth=max(copies.values()))

def tinygrad_copy(n:int) -> float:
  """The bytes a second (read and written) of tinygrad's device copy of n bytes, the fastest of 5."""
  from tinygrad import Tensor, TinyJit
  from spec import best_seconds
  a, b = Tensor.ones(n // 4).contiguous().realize(), Tensor.zeros(n // 4).contiguous().realize()
  copy = TinyJit(lambda a: b.assign(a).realize())
  for _ in range(2): copy(a)
  return 2 * n / best_seconds(lambda: copy(a), 5)

def pytorch_copy(n:int) -> dict|None:
  """PyTorch's device copy of n bytes (read and written), where it has this device (a GPU machine's image)."""
  from tinygrad import Device
  if Device.DEFAULT not in ("CUDA", "NV"): return None
  try: import torch
  except ImportError: return None
  if not torch.cuda.is_available(): return None
  x, y = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(n, dtype=torch.uint8, device="cuda")
  times = []
  for _ in range(10):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(); y.copy_(x); end.record(); torch.cuda.synchronize()
    times.append(start.elapsed_time(end) / 1e3)
  return {f"PyTorch {torch.__version__} copy_": 2 * n / min(times)}

def git(*args) -> str:
  """git's answer in the checkout; empty where it fails or there is no git (a lent machine gets the files alone)."""
  try: out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
  except OSError: return ""
  return out.stdout.strip() if out.returncode == 0 else ""

def code_hash() -> str:
  """A hash of the code that runs (spec.py, self_check.py, models/, tools/): it names the code where no git says the
  commit (the same function in a checkout matches it)."""
  files = sorted([ROOT / "spec.py", ROOT / "self_check.py", *(ROOT / "models").rglob("*.py"),
                  *(ROOT / "tools").glob("*.py")])
  code = b"".join(f.relative_to(ROOT).as_posix().encode() + f.read_bytes() for f in files)
  return hashlib.sha256(code).hexdigest()[:12]

# ***** (b) every option of every kernel against its formula *****

def kernels_stage(st:Stage) -> None:
  import types
  from tinygrad import UOp
  import models
  from models.engine import attention, choice, linear, norm
  rows = []
  for dtype in dtype_names(st.tiny):
    for name, cfg in configs(st.tiny).items():
      C, H, P, D = cfg.n_embd, cfg.n_head, cfg.n_positions, cfg.n_embd // cfg.n_head
      def r(*shape, seed=0, scale=1.0):
        return (choice.random(*shape, dtype=models.DTYPES[dtype], seed=seed) * scale).realize()
      ln = types.SimpleNamespace(weight=r(C, seed=1) + 1, bias=r(C, seed=2) * 0.1, eps=1e-5)
      roles = {"c_attn": (3 * C, C, dict(ln=ln)), "attn c_proj": (C, C, dict(residual=True)),
               "c_fc": (4 * C, C, dict(ln=ln, gelu=True)), "mlp c_proj": (C, 4 * C, dict(residual=True)),
               "lm_head": (cfg.padded_vocab, C, dict(dtype=models.DTYPES["float32"], bias=False))}
      for T in TINY_WIDTHS if st.tiny else WIDTHS:
        for role, (N, Cin, ctx) in roles.items():
          x, w, b = r(1, T, Cin, seed=3) * 3, r(N, Cin, seed=4, scale=0.05), r(N, seed=5)
          kw = {k: v for k, v in ctx.items() if k not in ("residual", "bias")} | \
               ({"residual": r(1, T, N, seed=6)} if ctx.get("residual") else {}) | \
               ({"b": b} if ctx.get("bias", True) else {})
          run = lambda way, pos: linear.apply(x, w, way=way, **kw)
          rows += compare(f"linear {role}", (N, Cin), T, dtype, name, run, linear.ways(T, N, Cin, w.dtype), length=Cin)
        cfg1 = models.GPT2Config(n_layer=1, n_head=H, n_embd=C, n_positions=P)
        attn = models.gpt2.Attention(cfg1, models.DTYPES[dtype])
        attn.cache_kv, qkv = r(2, 1, H, P, D, seed=7), r(1, T, 3 * C, seed=8)
        rows += compare("attention", (H, D, P // 4), T, dtype, name,
                        lambda way, pos: attention.apply(attn, qkv, pos, way),
                        attention.ways(D, (attn.cache_kv.dtype, qkv.dtype)),
                        UOp.variable("pos", 0, P - T).bind(P // 4), length=P)
        x = r(1, T, C, seed=9) * 3 + 20
        rows += compare("layer norm", (C,), T, dtype, name,
                        lambda way, pos: norm.layer_norm(x, ln.weight, ln.bias, 1e-5, way), norm.ways(C), length=C)
        st.save(rows=rows)
  st.save(rows=rows, complete=True)

def compare(kernel:str, shape:tuple, T:int, dtype:str, name:str, run, ways:list, pos=None, length:int=1) -> list[dict]:
  """Each way of ways against the first (tinygrad's, the reference): error (within choice.tolerance() of a reduction
  of length) and time a call. run(way, pos) computes it, pos a bound variable (attention's position; a captured call
  takes it as an argument) or None."""
  from models.engine import choice
  from models.engine.device import why
  from tinygrad import dtypes as dt
  reference, rows = run(ways[0], pos).float().numpy(), []
  for way in ways:
    row = dict(model=name, dtype=dtype, T=T, kernel=kernel, shape=shape, way=repr(way))
    try:
      got = run(way, pos).float().numpy()
      row["error"] = choice.error([got], [reference])
      row["ok"] = row["error"] <= choice.tolerance(getattr(dt, dtype), length)
      row["us"] = (call_seconds(lambda p: run(way, p).realize(), pos) if pos is not None else
                   call_seconds(lambda: run(way, None).realize())) * 1e6
    except Exception as e: row |= dict(ok=False, failed=why(e))
    rows.append(row)
  return rows

# ***** (c) the choice step *****

def choice_stage(st:Stage) -> None:
  from models import engine
  from models.engine import attention, linear, norm
  log = []
  for module in (linear, attention, norm): module.fastest = recording(module.fastest, log)
  t0 = time.perf_counter()
  dtype = auto_dtype()
  st.save(auto_dtype=dtype, half_pays_s=time.perf_counter() - t0)
  steps = []
  for name in configs(st.tiny):
    m = model(name, dtype, st.tiny)
    t0, start = time.perf_counter(), len(log)
    engine.choose_kernels(m, set(CHOICE_WIDTHS))
    steps.append(dict(model=name, widths=CHOICE_WIDTHS, wall_s=time.perf_counter() - t0, choices=log[start:]))
    st.save(steps=steps)
    del m
  st.save(steps=steps, complete=True)

def recording(fastest, log:list):
  """choice.fastest(), each candidate's seconds (or failure) and the choice appended to log."""
  def wrapped(kind, what, candidates, name, dtype, *args, **kw):
    timed, t0 = {}, time.perf_counter()
    def timing(key, fn):
      def run():
        try: seconds, outputs, again = fn()
        except Exception as e: timed[repr(key)] = f"failed: {type(e).__name__}"; raise
        timed[repr(key)] = seconds
        def retimed():   # the fastest of its timings
          timed[repr(key)] = min(timed[repr(key)], seconds := again())
          return seconds
        return seconds, outputs, retimed
      return run
    chosen = fastest(kind, what, {k: timing(k, fn) for k, fn in candidates.items()}, name, dtype, *args, **kw)
    log.append(dict(name=name, chosen=repr(chosen), candidates=timed, wall_s=time.perf_counter() - t0))
    return chosen
  return wrapped

# ***** (d) the passes *****

def nvidia_smi(query:str) -> str:
  """nvidia-smi's answer to --query-gpu=query (what it says where it fails); empty without nvidia-smi."""
  if not shutil.which("nvidia-smi"): return ""
  q = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True)
  return q.stdout.strip() or q.stderr.strip()

def passes_stage(st:Stage) -> None:
  import gc
  import benchmark, gpu_profile
  from tinygrad.nn.state import get_state_dict
  from models import GPT2
  from models.engine.choice import CHOSEN, TINYGRAD
  os.environ["SPEC_STEP_CACHE"] = ""   # each pass captured here: a stored one would bring other tables' kernels
  rows, tables = [], []
  st.save(profile_gpu=gpu_profile.use(nvidia_smi("name")))   # the profile's constants for this GPU (H100's elsewhere)
  # gpt2-xl's passes in half with the engine first (a target: a 3- or 5-token pass within 1.25x the decode)
  xl = TINY_WIDTHS if st.tiny else PASS_WIDTHS
  for name, widths, dtype in [("gpt2-xl", xl, d) for d in dtype_names(st.tiny)] + \
                             [("gpt2", (1,), d) for d in dtype_names(st.tiny)]:
    for plain in (False, True):
      m = model(name, dtype, st.tiny, plain)
      weights = {t.uop.buffer for k, t in get_state_dict(m).items() if "cache_kv" not in k}
      floor = sum(b.nbytes for b in weights)
      for T in widths:
        ms = benchmark.forward_time(m, T) * 1e3
        step = m.jit(GPT2.forward, T)
        linear_ = (step.fn if hasattr(step, "fn") else step).captured.linear
        calls = list(gpu_profile.kernel_calls(linear_))
        predicted = sum(gpu_profile.profile_kernel(c, weights, {"start_pos": 100}) ["seconds"] for c in calls) * 1e3
        rows.append(dict(model=name, dtype=dtype, layer="plain" if plain else "engine", T=T, ms=ms,
                         kernels=len(calls), weight_bytes=floor, predicted_ms=predicted))
        st.save(rows=rows)
      del m; gc.collect()
  name, dtype = "gpt2-xl", dtype_names()[0]
  for kind in (None, "linear", "attention", "norm"):   # the engine with each kind's choices tinygrad's in turn
    tinygrads = lambda k, key, kind=kind: TINYGRAD if k == kind else CHOSEN.measured[k].get(key, TINYGRAD)
    with CHOSEN.fixed(tinygrads) if kind else contextlib.nullcontext():
      m = model(name, dtype, st.tiny)
      for T in (1, 3):
        ms = benchmark.forward_time(m, T) * 1e3
        tables.append(dict(model=name, dtype=dtype, emptied=kind or "none", T=T, ms=ms))
      st.save(rows=rows, emptied=tables)
      del m; gc.collect()
  m = model(name, dtype, st.tiny)
  benchmark.forward_time(m, 1)
  step = m.jit(GPT2.forward, 1)
  weights = {t.uop.buffer for k, t in get_state_dict(m).items() if "cache_kv" not in k}
  captured = (step.fn if hasattr(step, "fn") else step).captured
  st.save(rows=rows, emptied=tables, decode_kernels=kernel_times(captured.linear, weights), complete=True)

def kernel_times(linear, weights:set) -> list[dict]:
  """Each kernel of a captured pass run alone (but those reading the pass's input), the fastest of 5 by tinygrad's own
  timer (the device's: CUDA's events, OpenCL's profiling; the CPU's clock), each after FLUSH bytes streamed through
  the memory, so that its weights come from the memory as in a pass (cold, "us"), and the fastest of 5 calls one after
  another (from the L2 where it holds them, "hot_us"); beside the GPU profile's prediction and the features it
  predicts from (`python3 tools/gpu_profile.py --fit report.json` refits the model's constants to the cold times)."""
  import gpu_profile
  from tinygrad import Tensor
  from tinygrad.engine.realize import time_call
  from tinygrad.uop.ops import Ops
  out, var_vals = [], {"start_pos": 100}
  stream = Tensor.ones(FLUSH // 4).contiguous().realize()
  for call in gpu_profile.kernel_calls(linear):
    if any(a.op is Ops.PARAM for a in call.src[1:]): continue   # it reads the pass's input (the embedding): not alone
    timer, cold = time_call(call, var_vals), []
    for _ in range(5):
      (stream + 1).realize()
      cold.append(next(timer))
    hot, model = min(next(timer) for _ in range(5)), gpu_profile.profile_kernel(call, weights, var_vals)
    features = {k: model[k] for k in ("traffic", "threads", "ops", "resident", "per_iteration", "trips")}   # for --fit
    out.append(dict(name=call.src[0].arg.function_name, us=min(cold) * 1e6, hot_us=hot * 1e6,
                    predicted_us=model["seconds"] * 1e6, **features))
  return out

# ***** (e) the headline, and speculative sampling against the target alone *****

def headline_stage(st:Stage) -> None:
  """gpt2-xl's decode in each dtype, half first, --plain before the engine (a fault in the engine's kernels, never run
  on this device before, cannot take the plain figure with it), each row saved as it lands."""
  import gc
  import benchmark
  from tinygrad.nn.state import get_state_dict
  decode = []
  for dtype in dtype_names():
    for plain in (True, False):
      m = model("gpt2-xl", dtype, st.tiny, plain)
      weights = sum(t.nbytes() for k, t in get_state_dict(m).items() if "cache_kv" not in k)
      decode.append(dict(model="gpt2-xl", dtype=dtype, layer="plain" if plain else "engine", weight_bytes=weights,
                         ms=benchmark.forward_time(m, 1) * 1e3))
      st.save(decode=decode, tiny=st.tiny)
      del m; gc.collect()
  st.save(complete=True)

def pair_stage(st:Stage) -> None:
  """The trained pair's greedy speculative sampling (K 2, block rule: spec.py's defaults) against the target alone, in
  float16 where the device has it: prompt by prompt, each generation warmed on its prompt first (its prefill's widths),
  then timed, the target alone and speculative in turn; the totals saved after each."""
  import models, spec
  from benchmark import PROMPTS
  from tinygrad import Device
  pair = st.pair or ([SHARED / "docs-deep", SHARED / "docs-draft"] if (SHARED / "docs-deep").is_dir() else None)
  if st.tiny and not st.pair: pair = tiny_pair(st.scratch / "tiny-pair")
  if not pair: return st.save(pair=None, complete=True)
  dtype = dtype_names()[0]
  target, draft = (models.load(str(unpacked(pathlib.Path(p), st.scratch)), dtype) for p in pair)
  prompts = [[models.EOT] + [t % target.cfg.vocab_size for t in range(5 * i + 1, 5 * i + 6)] for i in range(4)] \
    if st.tiny else [models.tokenizer().encode(p) for p in PROMPTS[:6]]
  n = 16 if st.tiny else 64
  runs = {"target alone": lambda p, k: spec.autoregressive_generate(target, p, k, eos=None),
          "speculative": lambda p, k: spec.speculative_generate(target, draft, p, 2, k, eos=None)}
  done = {name: dict(seconds=0.0, tokens=0, drafted=0, accepted=0) for name in runs}
  result = dict(target=pathlib.Path(pair[0]).name, draft=pathlib.Path(pair[1]).name, dtype=dtype,
                tokens_each=n, prompts=0, K=2, rule="block")
  outputs = {}
  for prompt in prompts:
    for name, run in runs.items():
      run(prompt, 2)
      Device[Device.DEFAULT].synchronize()
      tokens, stats = run(prompt, n)
      outputs[name] = tokens
      d = done[name]
      d["seconds"], d["tokens"] = d["seconds"] + stats.time_total, d["tokens"] + len(tokens)
      d["drafted"], d["accepted"] = d["drafted"] + stats.drafted, d["accepted"] + stats.accepted
    alone, spec_ = (done[k]["tokens"] / done[k]["seconds"] for k in runs)
    result.update(prompts=result["prompts"] + 1, ar_tokens_per_s=alone, spec_tokens_per_s=spec_, speedup=spec_ / alone,
                  alpha=done["speculative"]["accepted"] / max(1, done["speculative"]["drafted"]),
                  identical=result.get("identical", True) and outputs["target alone"] == outputs["speculative"])
    st.save(pair=result)
  st.save(complete=True)

def speedup_stage(st:Stage) -> None:
  from tinygrad.helpers import GlobalCounters
  import benchmark
  result = {}
  dtype = auto_dtype()
  target, draft = model("gpt2-xl", dtype, st.tiny), model("gpt2", dtype, st.tiny)
  held, load_rss = sum(sum(benchmark.sizes(m)) for m in (target, draft)), benchmark.peak_rss()
  t_target, t_draft = benchmark.forward_time(target, 1), benchmark.forward_time(draft, 1)
  r, K = benchmark.SEED_R_PRIME, benchmark.SEED_K
  t_verify = {K: benchmark.forward_time(target, K + 1)}
  predicted = {K: r * (K + 1) * t_target / (K * t_draft + t_verify[K])}
  result["dummy"] = dict(dtype=dtype, t_target_ms=t_target * 1e3, t_draft_ms=t_draft * 1e3,
                         t_verify_ms={k: v * 1e3 for k, v in t_verify.items()}, seed_r_prime=r, seed_K=K,
                         predicted_at_seed=predicted[K], seed_measured=benchmark.SEED_SPEEDUP)
  # host memory (a GPU's device memory is its own: what tinygrad has allocated there is device_bytes)
  result["memory"] = dict(weights_and_kv=held, load_peak_rss=load_rss, peak_rss=benchmark.peak_rss(),
                          device_bytes=GlobalCounters.mem_used)
  st.save(**result, complete=True)

def tiny_pair(root:pathlib.Path) -> list[pathlib.Path]:
  """A tiny random target and a noisy copy of it as its draft (agrees often, not always), of --tiny's gpt2 shape: its
  kernels are those the choice stage chose."""
  from self_check import checkpoint
  c = configs(True)["gpt2"]
  cfg = dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, vocab_size=c.vocab_size, n_positions=c.n_positions)
  return [pathlib.Path(checkpoint(root, name, seed=1, noise=noise, cfg=cfg)) for name, noise in (("target", 0.0),
                                                                                                 ("draft", 0.05))]

# ***** (f) a cold run's first token *****

def cold_stage(st:Stage) -> None:
  """spec.py's first run from empty caches: the seconds to its first token, waited for up to the stage's limit (at least
  COLD_WAIT: the parent runs the stage only with that much left); the run ended here whatever happens."""
  with tempfile.TemporaryDirectory() as d:
    env = {**os.environ, "CACHEDB": os.path.join(d, "cache.db"), "SPEC_STEP_CACHE": os.path.join(d, "steps"),
           "SPEC_CHOICES": os.path.join(d, "choices.db")}
    if st.tiny: target, draft = tiny_pair(pathlib.Path(d))
    else: target, draft = "gpt2-xl", "gpt2"
    cmd = [sys.executable, str(ROOT / "spec.py"), "--target", str(target), "--draft", str(draft), "-K", "2", "-n", "16",
           "--prompt", "The Python interpreter"] + ([] if st.tiny else ["--dummy-weights"])
    wait = max(5.0, st.limit - 10)   # ended here, within the stage's limit: "no token within" says how far it got
    t0, first, rest = time.perf_counter(), b"", b""
    with open(os.path.join(d, "stderr"), "wb") as err:
      proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, cwd=ROOT)
      try:
        # the header and the first token come together (spec.Printer)
        first = proc.stdout.read(1) if select.select([proc.stdout], [], [], wait)[0] else b""
        first_token_s = time.perf_counter() - t0
        if first:
          with contextlib.suppress(subprocess.TimeoutExpired): rest = proc.communicate(timeout=wait - first_token_s)[0]
      finally:
        if killed := proc.poll() is None: proc.kill()
        proc.wait()
    stderr = pathlib.Path(d, "stderr").read_text(errors="replace").splitlines()
    # done: the run ended, or was ended here (a first token, or none within the wait: either is the figure)
    st.save(command=" ".join(cmd[1:]), first_token_s=first_token_s if first else None, total_s=time.perf_counter() - t0,
            returncode=proc.returncode, ended_here=killed, notices=[l for l in stderr if l.startswith("spec")],
            output=(first + rest).decode(errors="replace")[-2000:], waited_s=wait,
            complete=proc.returncode == 0 or killed, **({} if proc.returncode == 0 or killed else
                                                        {"error": "\n".join(stderr[-8:])}))

# ***** (g) BEAM search *****

def search_stage(st:Stage) -> None:
  import benchmark, models
  from models import engine, gpt2
  dtype, rows = auto_dtype(), []
  for search in (0, 2):
    m = gpt2.randomize(gpt2.GPT2(configs(st.tiny)["gpt2"], models.DTYPES[dtype]))
    engine.apply(m, search)
    t0 = time.perf_counter()
    ms = benchmark.forward_time(m, 1) * 1e3
    rows.append(dict(model="gpt2", dtype=dtype, search=search, decode_ms=ms, first_call_s=time.perf_counter() - t0))
    st.save(rows=rows)
  st.save(rows=rows, complete=True)

# ***** markdown *****

def table(header:list[str], rows:list[list]) -> str:
  return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] +
                   ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])

def fmt(v, spec_:str=".2f") -> str: return "-" if v is None else format(v, spec_)

def ratio(ms:float, nbytes:int, floor:float|None) -> str:
  """A pass's time over its weights' bytes at the floor's rate."""
  return f"{ms / 1e3 / (nbytes / floor):.2f}" if floor else "-"

def md_plan(plan:dict, stages:dict, unreached:list[str]) -> str:
  info = stages.get("device", {}).get("info", {})
  commit = info.get("commit") or "unknown (no git where it ran)"
  head = f"# spec on {info.get('gpu') or info.get('device', 'this device')}\n\n" \
         f"{info.get('date', plan.get('started'))}, " \
         f"commit {commit}{' (modified)' if info.get('modified') else ''}, code {info.get('code', '-')}" + \
         (", tiny models (--tiny)" if plan.get("tiny") else "") + \
         f"; stages planned: {', '.join(plan.get('stages', stages))} ({plan.get('budget', 0):.0f} s)."
  return head + (f" **Not reached: {', '.join(unreached)}.**" if unreached else "")

def md_device(d, floor) -> str:
  i, c = d.get("info", {}), d.get("copies", {})
  head = f"{i.get('device')} ({i.get('target')}; DEV={i.get('dev')}, {i.get('renderer')} and {i.get('compiler')}), " \
         f"{i.get('gpu', i.get('processor'))}, {i.get('cores')} cores; Python {i.get('python')}, " \
         f"tinygrad {i.get('tinygrad')}, dtypes {', '.join(i.get('dtypes', []))}."
  copies = [f"- {k}: {v / 1e12:.3f} TB/s (read and written, {d['copy_bytes'] >> 20} MiB)" for k, v in c.items()]
  floor_line = f"\n\nThe floor: {floor / 1e12:.3f} TB/s, the fastest copy." if floor else ""
  return "\n\n".join(["## Device", head, "\n".join(copies) + floor_line])

def md_kernels(d, floor) -> str:
  rows = d.get("rows", [])
  bad = [r for r in rows if not r.get("ok")]
  out = [f"## Every kernel option against its formula\n\n{len(rows)} runs, {len(bad)} wrong or failed."]
  what = lambda r: [r["model"], r["dtype"], r["T"], r["kernel"], r["way"]]
  if bad: out.append(table(["model", "dtype", "T", "kernel", "way", "error or failure"],
                           [what(r) + [r.get("failed") or fmt(r.get("error"), ".1e")] for r in bad]))
  out.append(table(["model", "dtype", "T", "kernel", "way", "shape", "error", "µs a call"],
                   [what(r) + [r["shape"], fmt(r.get("error"), ".1e"), fmt(r.get("us"), ".1f")] for r in rows]))
  return "\n\n".join(out)

def md_choice(d, floor) -> str:
  auto = f"`--dtype auto`: {d.get('auto_dtype')} ({fmt(d.get('half_pays_s'), '.1f')} s to measure)."
  out = [f"## The choice step\n\n{auto}"]
  ms = lambda k, v: f"{k} {v * 1e3:.3f}" if isinstance(v, float) else f"{k} {v}"
  for s in d.get("steps", []):
    rows = [[c["name"], c["chosen"], ", ".join(ms(k, v) for k, v in c["candidates"].items()), f"{c['wall_s']:.1f}"]
            for c in s["choices"]]
    out.append(f"{s['model']}, widths {s['widths']}: **{s['wall_s']:.1f} s**, {len(s['choices'])} choices\n\n" +
               table(["choice", "chosen", "candidates (ms)", "s"], rows))
  return "\n\n".join(out)

def md_passes(d, floor) -> str:
  decode = {(r["model"], r["dtype"], r["layer"]): r["ms"] for r in d.get("rows", []) if r["T"] == 1}
  rows = [[r["model"], r["dtype"], r["layer"], r["T"], f"{r['ms']:.3f}", ratio(r["ms"], r["weight_bytes"], floor),
           fmt(r["ms"] / decode[r["model"], r["dtype"], r["layer"]] if (r["model"], r["dtype"], r["layer"]) in decode
               else None), r["kernels"], f"{r['predicted_ms']:.3f}", f"{r['ms'] / r['predicted_ms']:.2f}"]
          for r in d.get("rows", [])]
  out = ["## Passes (random weights of each model's shape)",
         table(["model", "dtype", "layer", "T", "ms", "x the floor", "x its decode", "kernels",
                f"profile ms ({d.get('profile_gpu', 'H100')}'s)", "measured / profile"], rows)]
  if d.get("emptied"):
    out.append("The engine with one measured table emptied (its kernels tinygrad's):\n\n" +
               table(["model", "dtype", "table emptied", "T", "ms"],
                     [[r["model"], r["dtype"], r["emptied"], r["T"], f"{r['ms']:.3f}"] for r in d["emptied"]]))
  if k := d.get("decode_kernels"):
    total = lambda key: f"{sum(r.get(key, 0) for r in k) / 1e3:.3f} ms"
    out.append(f"One decode's {len(k)} kernels timed alone, the memory flushed before each: {total('us')} in all "
               f"({total('hot_us')} from the L2), the profile {total('predicted_us')}\n\n" +
               table(["kernel", "µs", "µs from the L2", "profile µs"],
                     [[r["name"], f"{r['us']:.1f}", fmt(r.get("hot_us"), ".1f"), f"{r['predicted_us']:.1f}"] for r in k]))
  return "\n\n".join(out)

def md_headline(d, floor) -> str:
  rows = [[r["model"], r["dtype"], r["layer"], f"{r['ms']:.3f}", ratio(r["ms"], r["weight_bytes"], floor),
           f"{r['weight_bytes'] / 1e9:.3f}"] for r in d.get("decode", [])]
  shape = "a tiny model standing in for gpt2-xl (--tiny)" if d.get("tiny") else "gpt2-xl's shape (48 layers x 1600)"
  return "\n\n".join([f"## Headline: gpt2-xl's decode\n\nRandom weights of {shape}: the speed of real weights, not "
                       "their text. A one-token pass after 100 positions, the fastest of 5.",
                       table(["model", "dtype", "layer", "decode ms", "x the floor", "weights GB"], rows)])

def md_pair(d, floor) -> str:
  if not (p := d.get("pair")): return "## The deep pair\n\nNo pair: --pair, or ../shared/models/docs-deep beside it."
  same = "identical" if p.get("identical") else \
    "not identical (float16: a pass of 3 tokens rounds otherwise than a decode)"
  return (f"## The deep pair\n\n{p['target']} / {p['draft']} (trained), {p['dtype']}, greedy, K {p['K']} "
          f"({p['rule']}), "
          f"{p['prompts']} prompts x {p['tokens_each']} tokens: **{p['speedup']:.2f}x** the target alone "
          f"({p['spec_tokens_per_s']:.1f} against {p['ar_tokens_per_s']:.1f} tokens/s), alpha {p['alpha']:.3f}; "
          f"the greedy outputs {same}.")

def md_speedup(d, floor) -> str:
  out = ["## Speculative sampling against the target alone, predicted"]
  if m := d.get("dummy"):
    verify = ", ".join(f"{int(k) + 1}: {v:.3f} ms" for k, v in m["t_verify_ms"].items())
    out.append(f"dummy gpt2-xl / gpt2, {m['dtype']}: t_target {m['t_target_ms']:.3f} ms, t_draft {m['t_draft_ms']:.3f} "
               f"ms, passes of K+1: {verify}; at the seed's acceptance (r' {m['seed_r_prime']}, K {m['seed_K']}) "
               f"**{m['predicted_at_seed']:.2f}x** predicted (the seed measured {m['seed_measured']}x)")
  if m := d.get("memory"):
    out.append(f"memory, dummy gpt2-xl / gpt2: weights + KV caches {m['weights_and_kv'] / 1e9:.2f} GB; host peak resident "
               f"memory after the load {m['load_peak_rss'] / 1e9:.2f} GB, after the passes {m['peak_rss'] / 1e9:.2f} GB; "
               f"{m['device_bytes'] / 1e9:.2f} GB allocated by tinygrad on the device")
  return "\n\n".join(out)

def md_cold(d, floor) -> str:
  first = f"first token after **{fmt(d.get('first_token_s'), '.1f')} s**" if d.get("first_token_s") is not None else \
          f"**no token within {fmt(d.get('waited_s'), '.0f')} s**"
  ended = " (ended here)" if d.get("ended_here") else ""
  return f"## A cold run\n\n`{d.get('command')}`, every cache empty: {first}, " \
         f"done after {fmt(d.get('total_s'), '.1f')} s (exit {d.get('returncode')}{ended}).\n\n" + \
         "\n".join(f"    {n}" for n in d.get("notices", []))

def md_search(d, floor) -> str:
  rows = [[r["model"], r["dtype"], r["search"], f"{r['decode_ms']:.3f}", f"{r['first_call_s']:.1f}"]
          for r in d.get("rows", [])]
  return "## BEAM search\n\n" + table(["model", "dtype", "--search", "decode ms", "first call s"], rows)

MARKDOWN = {"device": md_device, "headline": md_headline, "pair": md_pair, "kernels": md_kernels, "choice": md_choice,
            "passes": md_passes, "speedup": md_speedup, "cold": md_cold, "search": md_search}

# ***** the luggage for a lent machine without network *****

def pack(out:pathlib.Path, names=("docs-deep", "docs-draft")) -> int:
  """What a lent GPU machine without network needs beside the code, into out: the shared deep pair in float16 (each
  matrix column by column, the weights' high bytes xz-compressed, the low bytes, which do not compress, as they are),
  GPT-2's tokenizer and tinygrad's wheel (as installed here, xz-compressed). Returns the bytes that travel with the
  code (the luggage and the files git would send), which a lent machine carries up to 64 MiB of."""
  import numpy as np
  from self_check import read_safetensors
  for name in names:
    stored = read_safetensors(SHARED / name / "model.safetensors")
    weights = {k: v for k, v in stored.items() if not k.endswith(".attn.bias")}   # the causal mask: not a weight
    # a column's exponents are alike (a row of wte spans every dimension's scale): 3% fewer bytes compressed
    columns = [np.ascontiguousarray(v.T) if v.ndim == 2 else v for v in weights.values()]
    raw = np.frombuffer(b"".join(v.astype(np.float16).tobytes() for v in columns), np.uint8).reshape(-1, 2)
    (d := out / name).mkdir(parents=True, exist_ok=True)
    shutil.copy(SHARED / name / "config.json", d / "config.json")
    (d / "shapes.json").write_text(json.dumps({k: list(v.shape) for k, v in weights.items()}))
    (d / "high.xz").write_bytes(lzma.compress(raw[:, 1].tobytes()))
    (d / "low.bin").write_bytes(raw[:, 0].tobytes())
  (tok := out / "tiktoken").mkdir(parents=True, exist_ok=True)
  for f in (SHARED / "tiktoken").iterdir(): (tok / f"{f.name}.xz").write_bytes(lzma.compress(f.read_bytes()))
  (out / "wheels").mkdir(parents=True, exist_ok=True)
  (out / "wheels" / f"{wheel('tinygrad').name}.xz").write_bytes(lzma.compress(wheel("tinygrad").read_bytes()))
  code = git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
  travels = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) + \
            sum((ROOT / f).stat().st_size for f in code if f and (ROOT / f).is_file()
                and not (ROOT / f).resolve().is_relative_to(out.resolve()))
  print(f"{out}: what travels, with the code: {travels / 2**20:.1f} MiB of the 64 MiB a call carries (at most "
        f"{TRAVELS / 2**20:.0f} MiB here)")
  return travels

def wheel(dist:str) -> pathlib.Path:
  """An installed distribution as its wheel, uncompressed (xz compresses the whole better), in a temporary folder."""
  import importlib.metadata, zipfile
  d = importlib.metadata.distribution(dist)
  whl = pathlib.Path(tempfile.mkdtemp(prefix="spec-wheel-")) / f"{dist}-{d.version}-py3-none-any.whl"
  with zipfile.ZipFile(whl, "w", zipfile.ZIP_STORED) as z:
    for f in d.files:
      path = d.locate_file(f)
      if not str(f).startswith("..") and f.suffix != ".pyc" and path.is_file(): z.write(path, str(f))
  return whl

def unpacked(path:pathlib.Path, scratch:pathlib.Path) -> pathlib.Path:
  """A packed checkpoint (pack()) as a checkpoint directory (float16 safetensors) in scratch, made once; any other
  path as it is."""
  if not (path / "high.xz").is_file(): return path
  import numpy as np, struct
  if ((d := scratch / "unpacked" / path.name) / "model.safetensors").is_file(): return d
  shapes = json.loads((path / "shapes.json").read_text())
  high = np.frombuffer(lzma.decompress((path / "high.xz").read_bytes()), np.uint8)
  half = np.stack([np.fromfile(path / "low.bin", np.uint8), high], 1).reshape(-1).view(np.float16)
  header, blobs, offset = {}, [], 0
  for k, shape in shapes.items():
    n = math.prod(shape)
    v = half[offset:offset + n].reshape(shape[::-1] if len(shape) == 2 else shape)
    blobs.append((v.T if len(shape) == 2 else v).tobytes()); offset += n
    header[k] = {"dtype": "F16", "shape": shape, "data_offsets": [sum(map(len, blobs[:-1])), sum(map(len, blobs))]}
  d.mkdir(parents=True, exist_ok=True)
  shutil.copy(path / "config.json", d / "config.json")
  h = json.dumps(header).encode()
  replace_bytes(d / "model.safetensors", struct.pack("<Q", len(h)) + h + b"".join(blobs))
  return d

def replace_bytes(path:pathlib.Path, data:bytes) -> None:
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  tmp.write_bytes(data)
  os.replace(tmp, path)

# ***** the command *****

RUN = {"device": device_stage, "headline": headline_stage, "pair": pair_stage, "kernels": kernels_stage,
       "choice": choice_stage, "passes": passes_stage, "speedup": speedup_stage, "cold": cold_stage,
       "search": search_stage}
MINIMUM = {"cold": COLD_WAIT + 10}   # a stage's least useful limit: with less left it is not run (5 s otherwise)

def watch(parent:int) -> None:
  """A stage ends with the command that started it: killed with its process group (its own runs of spec.py) once
  its parent is gone."""
  def loop():
    while os.getppid() == parent: time.sleep(1)
    os.killpg(0, signal.SIGKILL)
  threading.Thread(target=loop, daemon=True).start()

def run_stage(args, out:pathlib.Path, scratch:pathlib.Path) -> int:
  """One stage, in this process (a child of the command): its figures saved as they come, a failure's traceback."""
  watch(args.parent)
  st = Stage(out, scratch, args.stage, args.tiny, args.pair)
  st.limit = args.limit
  st.save()
  try: RUN[args.stage](st)
  except Exception:
    st.save(error="\n".join(traceback.format_exc().strip().splitlines()[-8:]))
    raise
  if args.stage == "device": st.save(complete=True)
  return 0 if st.data.get("complete") else 1

def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", metavar="DIR", help="where report.md and report.json go (created; nothing else goes there)")
  ap.add_argument("--scratch", metavar="DIR", help="the stages' caches and figures (default: a new temporary folder)")
  ap.add_argument("--tiny", action="store_true", help="tiny models in every stage: minutes on any device")
  ap.add_argument("--stages", nargs="+", choices=list(STAGES), default=[s for s in STAGES if s != "search"],
                  help="the stages to run, in their order (default: all but search)")
  ap.add_argument("--budget", type=float, default=BUDGET, help=f"seconds for the stages (default {BUDGET})")
  ap.add_argument("--pair", nargs=2, metavar=("TARGET", "DRAFT"), help="the trained pair, as checkpoint directories or "
                  "packed by --pack (default: ../shared/models/docs-deep and docs-draft where they are)")
  ap.add_argument("--slack", type=float, default=0, help="multiply every stage's time limit and the budget by this "
                  f"(default 1, --tiny {TINY_SLACK}; a CPU runs the full report in hours, not minutes)")
  ap.add_argument("--pack", metavar="DIR", help="pack the luggage for a lent machine without network into DIR (the "
                  "shared deep pair, GPT-2's tokenizer, tinygrad's wheel), say what travels, and exit")
  ap.add_argument("--wheels", metavar="DIR", help="wheels to install where tinygrad cannot be imported")
  ap.add_argument("--stage", choices=list(STAGES), help=argparse.SUPPRESS)   # one stage, in this process
  ap.add_argument("--parent", type=int, help=argparse.SUPPRESS)              # the command's pid, for the stage
  ap.add_argument("--limit", type=float, default=0, help=argparse.SUPPRESS)   # the stage's time limit
  args = ap.parse_args()
  if args.pack: return 0 if pack(pathlib.Path(args.pack)) <= TRAVELS else 1
  if not args.out: ap.error("--out DIR is required")
  bootstrap(args.wheels)
  out = pathlib.Path(args.out)
  scratch = pathlib.Path(args.scratch or tempfile.mkdtemp(prefix="spec-report-"))
  if args.stage: return run_stage(args, out, scratch)
  out.mkdir(parents=True, exist_ok=True); scratch.mkdir(parents=True, exist_ok=True)
  env, t_start, failed = environment(scratch, args.pair), time.perf_counter(), []
  scale = args.slack or (TINY_SLACK if args.tiny else 1)
  budget = args.budget * scale
  replace(scratch / "plan.json", json.dumps(dict(stages=args.stages, budget=budget, tiny=args.tiny,
                                                 started=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))))
  publish(out, scratch)
  for name in args.stages:
    left = budget - (time.perf_counter() - t_start)
    limit = min(STAGES[name] * scale or left, left)
    if limit < MINIMUM.get(name, 5):
      skipped = dict(stage=name, complete=False, status=f"not run: {left:.0f} s of the budget left", limit=limit)
      replace(scratch / f"{name}.json", json.dumps(skipped)); publish(out, scratch)
      print(f"{name}: {skipped['status']}", flush=True); failed.append(name); continue
    cmd = [sys.executable, __file__, "--stage", name, "--out", str(out), "--scratch", str(scratch), "--parent",
           str(os.getpid()), "--limit", str(limit)] + (["--tiny"] if args.tiny else []) + \
          (["--pair", *args.pair] if args.pair else [])
    # the choice step from an empty cache of its own: a first run's cost, whatever the stages before it chose
    stage_env = {**env, "CACHEDB": str(scratch / "choice.db"), "SPEC_CHOICES": str(scratch / "choices-first.db")} \
      if name == "choice" else env
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=stage_env, start_new_session=True)
    try: code = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired: code = None
    with contextlib.suppress(ProcessLookupError): os.killpg(proc.pid, signal.SIGKILL)   # what it started, too
    proc.wait()
    seconds = time.perf_counter() - t0
    path = scratch / f"{name}.json"
    data = json.loads(path.read_text()) if path.is_file() else {"stage": name, "complete": False}
    ok = code == 0 and data.get("complete")
    data.update(seconds=seconds, limit=limit, exit=code,
                status="done" if ok else "cut at its limit" if code is None else f"failed (exit {code})")
    replace(path, json.dumps(data, indent=1, default=str))
    publish(out, scratch)
    print(f"{name}: {data['status']} in {seconds:.0f} s (limit {limit:.0f} s)", flush=True)
    if not ok: failed.append(name)
  ended = f"failed, cut or not run: {', '.join(failed)}" if failed else "all complete"
  print(f"{out / 'report.md'}: {len(args.stages)} stages; {ended}")
  return 1 if failed else 0

if __name__ == "__main__": sys.exit(main())

#!/usr/bin/env python3
"""Every kernel of spec's paths rendered for the GPUs, and compiled where this machine has the compiler, without a GPU.

  python3 tools/render_kernels.py                    # the tiny model in float32 and gpt2's shapes in float16 (by hand)
  python3 tools/render_kernels.py --shapes gpt2      # gpt2's shapes in float16 only
  python3 tools/render_kernels.py --run gpt2 float32 # one shape in one dtype, in this process

It runs spec's paths on tinygrad's NULL device (it lowers and renders kernels but runs nothing): the target alone, and
greedy, sampled, top-k, top-p and both, under both rules, with a model draft and with prompt lookup, at K 1, 2, 4 and
8, and a prefill of 127 tokens (every prefill width), on a tiny model and on gpt2's shapes (fewer paths: run_paths()),
with the engine (its kernels forced wherever they fit, since NULL's timings choose nothing) and with --plain. Each
kernel is then lowered, rendered and compiled for every target below: CUDA C compiled by NVRTC for sm_80 and sm_90,
PTX assembled by nvJitLink on the tiny model (tinygrad's PTX renderer took over ten minutes on gpt2's kernels; pip's
nvidia-cuda-nvrtc and nvidia-nvjitlink, found through NVRTC_PATH and NVJITLINK_PATH; .ci/run
installs them), Metal and AMD's HIP rendered only (their compilers are macOS's and ROCm's). Each launch is checked
against what those GPUs allow: at most 1024 threads a block (x, y <= 1024, z <= 64), grid y and z <= 65535, at most
48 KiB of shared memory; and against what keeps one busy: at most 2**19 operations a thread, 2**16 below 32 threads
(tinygrad's estimate, the context at its longest; tensor-core kernels, tinygrad's own matrix products, exempt); and
each kernel's arguments as kernel_bounds.py checks them (CUDA rejects a kernel that does not take every buffer its call
passes). It prints the kernel count per target and exits 1 on any render, compile, launch or argument failure. Not
collected by pytest.
"""
import argparse, math, os, pathlib, subprocess, sys, time, traceback
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "tools"))
os.environ.setdefault("DEV", "NULL:CUDA:sm_80")
os.environ["NULL_ALLOW_COPYOUT"] = "1"          # the round's host read gets zeros: enough to run every path
os.environ["SPEC_STEP_CACHE"] = ""              # every step captured here
os.environ["CHECK_OOB"] = "0"                   # kernel_bounds.py proves the bounds on the CPU; here, the GPUs' code
for name, lib in (("NVRTC_PATH", "libnvrtc.so"), ("NVJITLINK_PATH", "libnvJitLink.so")):   # pip's CUDA libraries
  try:
    import nvidia
    found = sorted(p for d in nvidia.__path__ for p in pathlib.Path(d).glob(f"*/lib/{lib}*"))
    if found and name not in os.environ: os.environ[name] = str(found[-1])
  except ImportError: pass

import types
from tinygrad import Device, dtypes
from tinygrad.device import Compiler
from tinygrad.helpers import Target
from tinygrad.codegen import to_program
from tinygrad.uop.ops import Ops, AddrSpace
import models, spec
from models import engine
import kernel_bounds

def render_only():
  """Metal's and AMD's compilers are absent here: their renderers get tinygrad's no-op Compiler (it keeps the source).
  """
  sys.modules["tinygrad.runtime.ops_metal"] = types.SimpleNamespace(MetalCompiler=Compiler)
  import tinygrad.runtime.support.compiler_amd as amd
  amd.HIPCompiler = lambda arch: Compiler()

def targets(ptx:bool) -> dict[str, object]:
  from tinygrad.renderer.cstyle import CUDARenderer, MetalRenderer, HIPRenderer
  from tinygrad.renderer.ptx import PTXRenderer
  render_only()
  out = {"CUDA sm_80 (NVRTC)": CUDARenderer(Target("NULL", "CUDA", "sm_80")),
         "CUDA sm_90 (NVRTC)": CUDARenderer(Target("NULL", "CUDA", "sm_90"))}
  if ptx:
    try: out["PTX sm_80 (nvJitLink)"] = PTXRenderer(Target("NULL", "PTX", "sm_80"))
    except Exception as e: print(f"PTX: not assembled here ({type(e).__name__}: {e})")
  out["Metal (rendered)"] = MetalRenderer(Target("NULL", "METAL", ""))
  out["AMD gfx1100 (rendered)"] = HIPRenderer(Target("NULL", "HIP", "gfx1100"))
  return out

asts, record = kernel_bounds.asts, kernel_bounds.record   # every kernel's AST, by its key, as the paths compile them

SHAPES = {"tiny": dict(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=256), "gpt2": None}

def run_paths(dtype:str, lookaheads:list[int], shapes:list[str]) -> None:
  """Every path on the tiny model; on gpt2's shapes, whose steps take seconds each to capture, K 1 and 4 greedy and at
  T 0.8 with both filters (their kernels those of either filter alone, at other shapes): the widths and structures."""
  for shape, cfg in ((s, SHAPES[s]) for s in shapes):
    for plain in (False, True):
      t0 = time.perf_counter()
      def make():
        if cfg is None: return models.load("gpt2", dtype, dummy=True, plain=plain)
        model = models.gpt2.randomize(models.GPT2(models.GPT2Config(**cfg), models.DTYPES[dtype]))
        return model if plain else engine.apply(model)
      target, draft = make(), make()
      target.prefill(list(range(127)))                                     # every prefill width: 64 .. 1
      paths = kernel_bounds.paths(target, draft, lookaheads if cfg else [K for K in lookaheads if K in (1, 4)])
      for what, run in paths:
        if cfg or "Sampling(temperature=0.0" in what or "top_k=5, top_p=0.9" in what: run()
      print(f"  {shape}, {'plain' if plain else 'engine'}, {dtype}: {len(asts)} kernels so far "
            f"({time.perf_counter() - t0:.0f} s)", flush=True)

LIMITS = dict(threads=1024, block=(1024, 1024, 64), grid=(2**31 - 1, 65535, 65535), shared=48 * 1024)
# operations a thread: beyond them a kernel leaves a GPU nearly idle (a reduction that took a matrix product or a sum
# over the vocabulary into itself: an H100's second lease, `git show c6d6475:docs/backends.md`)
WORK, SERIAL = 2**19, 2**16   # at most WORK a thread, and at most SERIAL a thread below a warp's 32 threads

def launch_problems(prg) -> list[str]:
  info, problems = prg.arg, []
  local = [int(x) for x in (info.local_size or (1, 1, 1))]
  glob = [x if isinstance(x, int) else int(x.vmax) for x in info.global_size]
  if math.prod(local) > LIMITS["threads"] or any(l > m for l, m in zip(local, LIMITS["block"])):
    problems.append(f"block {local}")
  if any(g > m for g, m in zip(glob, LIMITS["grid"])): problems.append(f"grid {glob}")
  shared = sum(u.dtype.itemsize * u.max_numel() for u in prg.src[0].toposort()
               if u.op is Ops.BUFFER and u.arg.addrspace == AddrSpace.LOCAL)
  if shared > LIMITS["shared"]: problems.append(f"shared memory {shared} bytes")
  threads, ops = math.prod(glob) * math.prod(local), prg.src[0].arg.estimates.ops
  work = (ops if isinstance(ops, int) else int(ops.vmax)) // threads
  tensor_cores = any(u.op is Ops.WMMA for u in prg.src[0].toposort())   # a matrix product: tinygrad's own threads
  if not tensor_cores and (work > WORK or (threads < 32 and work > SERIAL)):
    problems.append(f"{work} operations a thread on {threads} threads")
  return problems

def render(shape:str, dtype:str, lookaheads:list[int]) -> int:
  """The paths of one shape and dtype, then every kernel for every target: the number of failures."""
  record()
  print(f"spec's paths on {Device.DEFAULT} ({Device[Device.DEFAULT].renderer.target}):", flush=True)
  with engine.engine_kernels(): run_paths(dtype, lookaheads, [shape])
  failed = 0
  for name, renderer in targets(ptx=shape == "tiny").items():
    t0, bad = time.perf_counter(), []
    for ast in asts.values():
      try:
        prg = to_program(ast, renderer)
        bad += [f"{prg.arg.name}: {p}" for p in launch_problems(prg) + kernel_bounds.argument_problems(prg, ast)]
      except Exception as e:
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        bad.append(f"{ast.arg.name if hasattr(ast.arg, 'name') else ast}: {why}")
        if len(bad) == 1: traceback.print_exc()
    print(f"{shape}, {dtype}, {name}: {len(asts) - len(bad)} of {len(asts)} kernels rendered"
          f"{'' if 'rendered' in name else ' and compiled'}, launches within the limits, arguments whole "
          f"({time.perf_counter() - t0:.0f} s)",
          flush=True)
    for b in bad[:20]: print(f"  FAILED {b}")
    failed += len(bad)
  return failed

def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("-K", type=int, nargs="+", default=[1, 2, 4, 8], help="lookaheads (default: 1 2 4 8)")
  ap.add_argument("--run", nargs=2, metavar=("SHAPE", "DTYPE"),
                  help=f"one of {', '.join(SHAPES)} in float32 or float16, in this process")
  ap.add_argument("--shapes", nargs="+", choices=["tiny", "gpt2"], default=["tiny", "gpt2"],
                  help="the tiny model in float32 (every path), gpt2's shapes in float16 (fewer): a process each")
  args = ap.parse_args()
  if args.run: return 1 if render(*args.run, args.K) else 0
  runs = [(shape, {"tiny": "float32", "gpt2": "float16"}[shape]) for shape in args.shapes]
  procs = [subprocess.Popen([sys.executable, __file__, "--run", *run, "-K", *map(str, args.K)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for run in runs]
  codes = []
  for proc in procs:
    out = proc.communicate()[0]
    print("\n".join(l for l in out.splitlines() if not l.startswith("spec: ")), flush=True)
    codes.append(proc.returncode)
  return 1 if any(codes) else 0

if __name__ == "__main__": sys.exit(main())

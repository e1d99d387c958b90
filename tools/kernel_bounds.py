#!/usr/bin/env python3
"""Compile every kernel of spec's paths afresh and have tinygrad prove each in bounds: CHECK_OOB=1 makes its code
generator check, with the z3 solver, that every load and store index stays inside its buffer wherever its gate lets it
run, and fail the compile otherwise. Each compiled kernel's buffer and variable parameters must also fill its argument
slots 0..n-1, each once, and it must take every buffer its call passes.

  DEV=CPU python3 tools/kernel_bounds.py            # tiny random checkpoints, then the shared pair
  DEV=CPU python3 tools/kernel_bounds.py --tiny     # the tiny ones alone (CI runs them beside the shared pair's --pair)
  DEV=CL python3 tools/kernel_bounds.py --pair TARGET DRAFT -K 1 3 --dtype float16

Both checks guard against tinygrad 0.14 code generator bugs that spec.py works around (README, Tests): a load left
without its gate read before a 4-element buffer (the CPU backend crashed when that buffer began a mapping), and a
kernel whose unused buffer parameter was dropped got its variables numbered by count (on the CPU backend a buffer and
a variable swapped, a crash on every call; on OpenCL an argument missing; a kernel that drops its last buffer is
called with one argument too many, which CUDA rejects; a kernel compiled empty takes none of the buffers it is
passed, its output never written). Paths: greedy, sampled, top-k, top-p and both;
both verification rules; a model draft and prompt lookup, each K given; and the target alone. Both pairs, as the code
generator's choices depend on the shapes: the ungated load appeared with the tiny checkpoints' 64-token vocabulary,
not with GPT-2's. Prints the path it runs, so that a crash shows where. Exit 1 on a failure.
"""
import argparse, os, pathlib, sys, tempfile
# read by tinygrad at import: it checks each kernel as it generates its code (a process does that for every kernel it
# runs; the disk cache holds only the compiler's output)
os.environ["CHECK_OOB"] = "1"
ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "models"
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "tools"))
from tinygrad.engine import realize
from tinygrad.engine.realize import to_program_cache
from tinygrad.uop.ops import Ops, AddrSpace
import models, spec
import self_check
os.environ["SPEC_STEP_CACHE"] = ""   # no step loaded from a store, where it comes with its code generated

asts: dict = {}   # every kernel's AST, by its key, as the paths compile them
def record():
  lookup = realize._get_call_to_compile
  def recording(call):
    found = lookup(call)
    if found is not None and found[0].op is Ops.SINK: asts.setdefault(found[0].key, found[0])
    return found
  realize._get_call_to_compile = recording

def argument_problems(program, ast) -> list[str]:
  """What is wrong with a compiled kernel's arguments: its buffers and variables must fill slots 0..n-1 once each
  (OpenCL passes arguments by slot and then misses one; the CPU backend passes them in order and swaps a buffer and a
  variable), and it must take every buffer its call passes (CUDA rejects a graph node whose arguments the kernel does
  not declare: 'invalid argument')."""
  slots = sorted([*program.arg.globals, *(v.arg.slot for v in program.arg.vars)])
  passed = sorted({u.arg.slot for u in ast.toposort() if u.op is Ops.PARAM and u.addrspace != AddrSpace.ALU})
  return ([f"argument slots {slots}"] if slots != list(range(len(slots))) else []) + \
         ([f"buffers {passed} passed, {list(program.arg.globals)} taken"] if passed != list(program.arg.globals) else [])

def paths(target:models.GPT2, draft:models.GPT2, lookaheads:list[int]):
  """(what, run) for each path: the target alone, then every K x rule x drafter, each in every sampling (prompt
  lookup: greedy, sampled and both filters)."""
  samplings = [spec.Sampling(), spec.Sampling(temperature=1.0), spec.Sampling(temperature=0.8, top_k=5, top_p=0.9),
               spec.Sampling(temperature=0.8, top_k=5), spec.Sampling(temperature=0.8, top_p=0.9)]   # each filter's own kernels
  prompt = [5, 9, 2, 5, 9]   # repeats: prompt lookup finds a match
  for s in samplings: yield f"target alone, {s}", lambda s=s: spec.autoregressive_generate(target, prompt, 3, s, eos=None)
  for K in lookaheads:
    for rule in spec.RULES:
      # prompt lookup proposes without sampling: its steps differ from the model draft's by the target's warp alone,
      # whose filters one by one the model draft's paths compile
      for name, d, ss in (("model", draft, samplings), ("prompt-lookup", spec.PromptLookup(), samplings[:3])):
        for s in ss:
          yield (f"K {K}, {rule} rule, {name} draft, {s}",
                 lambda K=K, rule=rule, d=d, s=s: spec.speculative_generate(target, d, prompt, K, 2 * K + 2, s, eos=None, verification=rule))

def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--pair", nargs=2, metavar=("TARGET", "DRAFT"),
                  help="checkpoint directories to check (default: tiny random checkpoints, then docs-target/docs-draft)")
  ap.add_argument("--tiny", action="store_true", help="the tiny random checkpoints only, not the shared pair after them")
  ap.add_argument("-K", type=int, nargs="+", default=[1, 2, 3, 4, 8], help="lookaheads to compile (default: 1 2 3 4 8)")
  ap.add_argument("--dtype", default="float32", choices=["float32", "float16"], help="precision of the models")
  args = ap.parse_args()
  record()
  if args.pair: pairs = [tuple(args.pair)]
  else:
    cfg = dict(self_check.TINY, n_positions=256)
    tiny = self_check.checkpoint(pathlib.Path(tempfile.mkdtemp()), "tiny", seed=1, cfg=cfg)
    pairs = [(tiny, tiny)] + ([] if args.tiny else [(SHARED / "docs-target", SHARED / "docs-draft")])
  for target_dir, draft_dir in pairs:
    target, draft = models.load(str(target_dir), args.dtype), models.load(str(draft_dir), args.dtype)
    for what, run in paths(target, draft, args.K):
      what = f"{pathlib.Path(target_dir).name}: {what}"
      print(what, flush=True)
      try: run()
      except RuntimeError as e:
        print(f"FAILED: {what}: {str(e).splitlines()[0]}")
        return 1
      programs = [(p, asts[k[0]]) for k, p in to_program_cache.items() if k[0] in asts]
      if bad := {p.arg.function_name: why for p, ast in programs if (why := argument_problems(p, ast))}:
        print(f"FAILED: {what}: kernels whose arguments are wrong: {bad}")
        return 1
  print(f"{len(to_program_cache)} kernels compiled, every index in bounds; {len(programs)} of them with arguments in "
        f"slots 0..n-1 and every buffer their call passes taken")
  return 0

if __name__ == "__main__": sys.exit(main())

#!/usr/bin/env python3
"""Compile every kernel of spec's paths afresh and have tinygrad prove each in bounds: CHECK_OOB=1 makes its code
generator check, with the z3 solver, that every load and store index stays inside its buffer wherever its gate lets it
run, and fail the compile otherwise. Each compiled kernel's buffer and variable parameters must also sit in distinct
argument slots.

  DEV=CPU python tests/kernel_bounds.py                     # the shared pair (../shared/models), as CI runs it
  DEV=CL python tests/kernel_bounds.py TARGET DRAFT -K 1 3 --dtype float16

Both checks guard against tinygrad 0.14 code generator bugs that spec.py works around (README, Tests): a load left
without its gate read before a 4-element buffer (the CPU backend crashed when that buffer began a mapping), and a
kernel whose unused buffer parameter was dropped got its variable numbered onto a buffer's slot (arguments swapped:
a crash on every call). Paths: greedy, sampled, top-k and top-p; both verification rules; a model draft and prompt
lookup, each K given; and the target alone. Prints the path it runs, so that a crash shows where. Exit 1 on a failure.
"""
import argparse, os, pathlib, sys
# read at import: tinygrad checks each kernel as it generates its code (every process does that for every kernel it
# runs; its disk cache holds only the compiler's output), and no step is loaded from a store, where it comes generated
os.environ.update(CHECK_OOB="1", SPEC_STEP_CACHE="")
ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "models"
sys.path.insert(0, str(ROOT))
from tinygrad.engine.realize import to_program_cache
import models, spec

def colliding(program) -> set[int]:
  """Argument slots that both a buffer and a variable of a compiled kernel were given."""
  return set(program.arg.globals) & {v.arg.slot for v in program.arg.vars}

def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("target", nargs="?", default=str(SHARED / "docs-target"), help="target checkpoint directory (default: docs-target)")
  ap.add_argument("draft", nargs="?", default=str(SHARED / "docs-draft"), help="draft checkpoint directory (default: docs-draft)")
  ap.add_argument("-K", type=int, nargs="+", default=[1, 2, 3, 4, 8], help="lookaheads to compile (default: 1 2 3 4 8)")
  ap.add_argument("--dtype", default="float32", choices=["float32", "float16"], help="precision of the models")
  args = ap.parse_args()
  target, draft = models.load(args.target, args.dtype), models.load(args.draft, args.dtype)
  samplings = [spec.Sampling(), spec.Sampling(temperature=1.0), spec.Sampling(temperature=0.8, top_k=5, top_p=0.9)]
  prompt = [5, 9, 2, 5, 9]   # repeats: prompt lookup finds a match
  paths = [(f"target alone, {s}", lambda s=s: spec.autoregressive_generate(target, prompt, 3, s, eos=None)) for s in samplings]
  paths += [(f"K {K}, {rule} rule, {name} draft, {s}",
             lambda K=K, rule=rule, d=d, s=s: spec.speculative_generate(target, d, prompt, K, 2 * K + 2, s, eos=None, verification=rule))
            for K in args.K for rule in spec.RULES for name, d in (("model", draft), ("prompt-lookup", spec.PromptLookup()))
            for s in samplings]
  for what, run in paths:
    print(what, flush=True)
    try: run()
    except RuntimeError as e:
      print(f"FAILED: {what}: {str(e).splitlines()[0]}")
      return 1
    if bad := {p.arg.function_name: colliding(p) for p in to_program_cache.values() if colliding(p)}:
      print(f"FAILED: {what}: a kernel's buffer and variable share argument slots: {bad}")
      return 1
  print(f"{len(to_program_cache)} kernels compiled, every index in bounds, every argument in its own slot")
  return 0

if __name__ == "__main__": sys.exit(main())

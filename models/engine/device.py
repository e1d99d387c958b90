"""What the device offers the engine's kernels (work-groups, threads inside a kernel), and the engine's one line on
stderr where it steps aside."""
from __future__ import annotations
import os, sys
from models.engine import internals
from models.engine.internals import Opt, OptOps

# pocl's compiler counts its warnings on stderr ('1 warning generated.'), e.g. for the parentheses of tinygrad's
# if ((a==0)); the kernels are right, so its warnings are off unless the user sets pocl's flags
os.environ.setdefault("POCL_EXTRA_BUILD_FLAGS", "-w")

work_groups = internals.work_groups   # GPUs and OpenCL: where the engine's GPU kernels are candidates

def group_sizes(steps:int, near:tuple[int, ...], most:int) -> list[int]:
  """Work-group sizes to measure: for each of near, the divisor of steps in 8..most closest to it."""
  divisors = [d for d in range(8, most + 1) if steps % d == 0]
  return sorted({min(divisors, key=lambda d: abs(d - g)) for g in near}) if divisors else []

def core_splits(n:int, device:str) -> int:
  """The parts a kernel's axis of n splits into, each a core's: the most up to tinygrad's thread count that divide n
  where the device splits a kernel over its cores (tinygrad's CPU backend), else 1."""
  if not internals.threads_in_kernels(device): return 1
  return max(d for d in range(1, internals.cpu_threads() + 1) if n % d == 0)

def split_opts(parts:int) -> tuple[Opt, ...]:
  """A kernel's option that splits its first axis into parts, one a core (none for one part)."""
  return (Opt(OptOps.THREAD, 0, parts),) if parts > 1 else ()

def row_chunk(T:int) -> int:
  """The rows a kernel holds in registers at once: the most up to 8 that divide T."""
  return max(c for c in range(1, 9) if T % c == 0)

def say(text:str) -> None: print(f"spec: {text}", file=sys.stderr, flush=True)
def why(e:Exception) -> str: return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"

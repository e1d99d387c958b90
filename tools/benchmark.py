#!/usr/bin/env python3
"""Benchmark: speculative vs autoregressive generation on this machine, in one process, after warm-up.

  python3 tools/benchmark.py            # dummy gpt2-xl/gpt2, the trained pair docs-deep/docs-draft (K = 1, 2, 4, 8, auto;
                                       # T = 0 and 1), prompt lookup on docs-target with repetitive prompts
  python3 tools/benchmark.py --quick    # fewer tokens, a smoke run
  python3 tools/benchmark.py --pairs deep --json results.json
  python3 tools/benchmark.py --search 1 # kernels from tinygrad's BEAM search (spec.py --search; minutes the first time)
  python3 tools/benchmark.py --pairs none --first-run   # the default command's first run, every cache empty, and a warm one

For each pair and temperature: t_target and t_draft (one-token decodes; the draft's also after a target pass, as a
round runs it, the target's pass having evicted the draft's weights from the caches), t_verify(K+1) (one target pass
of width K+1), alpha, tokens per round, and the wall times of the autoregressive baseline and of speculative sampling on
the same prompts and token counts. From those:
  measured speedup        = baseline seconds per token / speculative seconds per token
  theoretical (the seed)  = r'(K+1) t_target / (K t_draft + t_target)
  overhead-aware          = (tokens per round) t_target / (K t_draft + t_verify(K+1))
  efficiency              = measured / overhead-aware  (1.0: the loop around the forward passes costs nothing)
  loop efficiency         = the rounds' forward passes (K t_draft + t_verify(K+1) each) / speculative seconds: as
                            efficiency, without pricing the baseline at t_target (its tokens cost AR/t_target of it)
plus the memory read bandwidth (a matrix-vector product over 1 GiB: tinygrad's, numpy's BLAS on all cores and on
one), the gpt2-xl decode as a multiple of (weight bytes / bandwidth), its K+1-token passes as multiples of its decode,
the peak resident memory against weight + KV-cache bytes, and kernels compiled during the timed runs (the target: zero).
With both pairs, timed side by side: gpt2-xl's decode against the memory floor, and each small model's (gpt2, docs-deep,
docs-draft) against its bytes at the rate gpt2-xl's decode reads its own (a small model pays a kernel's fixed costs on
fewer bytes).
For the trained pair also the tokens of paired first rounds under both verification rules (the same drafted block and
draws for each).
Not part of the test suite (it is not collected by pytest): it takes minutes and measures, it does not assert.
"""
import argparse, collections, gc, json, os, pathlib, platform, resource, shutil, subprocess, sys, tempfile, time
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared" / "models"
if (SHARED / "tiktoken").is_dir(): os.environ["TIKTOKEN_CACHE_DIR"] = str(SHARED / "tiktoken")

import numpy as np
from tinygrad import Tensor, TinyJit, Device, dtypes
from tinygrad.codegen import to_program_cache
from tinygrad.nn.state import get_state_dict
import models, spec
from models.engine import native
from spec import Sampling, best_seconds, autoregressive_generate, speculative_generate

SHORT_PROMPTS = ["The Python interpreter", "A dictionary is", "To install a package"]
REPETITIVE = [  # context that repeats itself, where prompt lookup has something to copy
  "class Stack:\n    def push(self, item):\n        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n\n"
  "    def peek(self):\n        return self.items[-1]\n\n    def size(self):\n",
  "A dictionary is a mapping. A dictionary is a mapping. A dictionary is",
  "import os\nimport sys\nimport re\nimport os.path\nimport sys.path\nimport re.compile\nimport"]
PROMPTS = ["The Python interpreter", "A dictionary is", "The following example shows how to", "To install a package",
                  "Exceptions are raised when", "The standard library", "A list comprehension", "The function returns",
                  "In this tutorial we", "Modules can be imported", "The garbage collector", "Strings are immutable"]
KS = (1, 2, 4, 8)
SEED_R_PRIME, SEED_K, SEED_SPEEDUP = 0.8125, 4, 2.12  # the seed's gpt2-xl/gpt2 run on its GPU

def bandwidth(nbytes:int=1 << 30, reps:int=5) -> dict[str, float]:
  """Memory read bandwidth in bytes/s of the kernel a decode is, a matrix-vector product over a matrix far larger than
  the caches (16384 x 16384 float32 = 1 GiB): tinygrad's on this device, and numpy's BLAS on all cores and on one (the
  host's memory: the floor of the CPU backend and of CPU OpenCL drivers such as pocl; numpy's sum would not do, it is
  compute-bound, pairwise summation, and reads far below what the memory delivers)."""
  n = int((nbytes // 4) ** 0.5)
  a, v = Tensor.ones(n, n, dtype=dtypes.float32).contiguous().realize(), Tensor.ones(n, dtype=dtypes.float32).contiguous().realize()
  matvec = TinyJit(lambda a, v: (a @ v).realize())
  for _ in range(2): matvec(a, v)
  measured = {"tinygrad matvec": nbytes / best_seconds(lambda: matvec(a, v), reps)}
  del a, v, matvec
  blas = "import numpy as np, time; a, v = np.ones((%d, %d), np.float32), np.ones(%d, np.float32); t = []\n" \
         "for _ in range(%d): t0 = time.perf_counter(); a @ v; t.append(time.perf_counter() - t0)\nprint(min(t))" % (n, n, n, reps)
  one = {k: "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
  for name, env in (("numpy BLAS matvec", {}), ("numpy BLAS matvec, 1 thread", one)):
    out = subprocess.run([sys.executable, "-c", blas], env={**os.environ, **env}, capture_output=True, text=True, check=True)
    measured[name] = nbytes / float(out.stdout)
  return measured

def forward_pass(model:models.GPT2, width:int, pos:int=100):
  """A call of one JIT-compiled forward pass of `width` tokens after a KV cache of pos (a one-token decode for width 1),
  warm: the model's step itself, as the rounds call it, not GPT2.__call__, whose copy of its input tokens is scheduled
  anew on every call (1.7 ms on the shared pair's target)."""
  x = Tensor([[models.EOT] * width], dtype=dtypes.int32).realize()
  step = model.jit(models.GPT2.forward, width)
  run = lambda: step(model, x, model.positions.bind(pos))
  for _ in range(3): run()
  return run

def forward_time(model:models.GPT2, width:int, reps:int=5, before=None) -> float:
  """The fastest of reps forward passes (forward_pass()); before: run ahead of each, untimed (the target's pass, which
  evicts a small draft's weights from the caches as in a round)."""
  run, times = forward_pass(model, width), []
  for _ in range(reps):
    if before: before()
    times.append(best_seconds(run, 1))
  return min(times)

def runner_times(model:models.GPT2, width:int=1, reps:int=5) -> dict|None:
  """A pass's seconds by each way the engine can run its batches where native.py's runner fits the device ("native":
  the runner, "replay": replay.py's graph), in turn, the chosen way kept after; None elsewhere (a GPU, --plain)."""
  run, step = forward_pass(model, width), model.jit(models.GPT2.forward, width)
  if not (batches := native.graphs(getattr(step, "fn", step).captured)): return None
  chosen, times = batches[0].native, {True: [], False: []}
  for way in (True, False, True, False):
    for b in batches: b.native = way
    times[way].append(best_seconds(run, reps))
  for b in batches: b.native = chosen
  return {"native": min(times[True]), "replay": min(times[False]), "chosen": "native" if chosen else "replay"}

def sizes(model:models.GPT2) -> tuple[int, int]:
  """(weight bytes, KV-cache bytes) as allocated (not the captured steps' outputs, which the model holds too)."""
  state = {k: t for k, t in get_state_dict(model).items() if not k.startswith("jits.")}
  kv = sum(t.nbytes() for k, t in state.items() if "cache_kv" in k)
  return sum(t.nbytes() for t in {id(t): t for t in state.values()}.values()) - kv, kv

def peak_rss() -> int:
  """This process's peak resident memory: VmHWM where /proc has it (ru_maxrss on Linux keeps a parent's across exec)."""
  try: return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) * 1024
  except OSError: return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)

FIRST_RUN = ["--dummy-weights", "-n", "16", "--prompt", "Alan Turing theorized that computers would one day become"]

def first_runs(dtype:str, plain:bool) -> dict[str, float]:
  """Seconds to exit of the default command (the README's, on random weights) with every cache empty (a new
  XDG_CACHE_HOME: tinygrad's compiled kernels, the measured choices, the stored steps), then again on what it cached."""
  cache, seconds = tempfile.mkdtemp(), {}
  cmd = [sys.executable, str(ROOT / "spec.py"), *FIRST_RUN, "--dtype", dtype, *(["--plain"] if plain else [])]
  try:
    for run in ("first", "second"):
      t0 = time.perf_counter()
      subprocess.run(cmd, env={**os.environ, "XDG_CACHE_HOME": cache}, check=True, capture_output=True)
      seconds[run] = time.perf_counter() - t0
  finally: shutil.rmtree(cache, ignore_errors=True)
  return seconds

def generate_all(fn, prompts, n) -> tuple[float, int, list, int]:
  """fn over the prompts after a warm-up call on each (JIT capture, the prefill's width):
  (seconds generating, tokens, stats, kernels compiled during the timed calls)."""
  for p in prompts: fn(p, 2)
  compiled, total, tokens, stats = len(to_program_cache), 0.0, 0, []
  for p in prompts:
    out, st = fn(p, n)
    total, tokens = total + st.time_total, tokens + len(out)
    stats.append(st)
  return total, tokens, stats, len(to_program_cache) - compiled

def simulated_auto(costs:dict[int, float], a:float, rounds:int=2000, seed:int=0) -> tuple[float, int]:
  """-K auto over simulated rounds that keep each draft with probability a and cost costs[K]: (the expected tokens per
  second of the K it chose, the K it ran most)."""
  rng, auto, tokens, seconds, runs = np.random.default_rng(seed), spec.AutoLookahead(), 0.0, 0.0, collections.Counter()
  for _ in range(rounds):
    K = auto.choose()
    auto.update(K, 1 + next((i for i in range(K) if rng.random() >= a), K), costs[K])
    tokens, seconds, runs[K] = tokens + (1 - a ** (K + 1)) / (1 - a), seconds + costs[K], runs[K] + 1
  return tokens / seconds, runs.most_common(1)[0][0]

def drafted_token_seconds(stats:list) -> float:
  return sum(s.t_draft * s.drafted for s in stats) / max(1, sum(s.drafted for s in stats))

def row(K, T, stats, ar:tuple, sp:tuple, t_target, t_draft, t_verify, t_draft_cold=0.0) -> dict:
  """One line of the table from the baseline's and the speculative run's (seconds, tokens, compiled)."""
  rounds, drafted, accepted = (sum(getattr(s, f) for s in stats) for f in ("rounds", "drafted", "accepted"))
  lookaheads = dict(sum((collections.Counter(s.lookaheads) for s in stats), collections.Counter()))
  tpr, mean_K = sp[1] / rounds, drafted / rounds
  measured = (ar[0] / ar[1]) / (sp[0] / sp[1])
  theoretical = tpr * t_target / (mean_K * t_draft + t_target)
  # the rounds' forward passes alone: k draft steps and a target pass of width k+1 (-K auto and lookup mix the k)
  passes = sum(n * (k * t_draft + t_verify[k]) for k, n in lookaheads.items())
  aware = sp[1] * t_target / passes
  # a drafted token of the rounds' proposals (Stats.t_draft: a proposal timed alone, over K) against the draft's decode
  step = drafted_token_seconds(stats) if drafted else None
  return dict(T=T, K=K, alpha=accepted / drafted if drafted else 0.0, tokens_per_round=tpr, mean_K=mean_K,
              t_verify=t_verify.get(K), draft_step_over_decode=step / t_draft if step and t_draft else None,
              draft_step_over_cold_decode=step / t_draft_cold if step and t_draft_cold else None,
              ar_seconds=ar[0], ar_tokens=ar[1], spec_seconds=sp[0], spec_tokens=sp[1], measured=measured,
              theoretical=theoretical, overhead_aware=aware, efficiency=measured / aware, loop_efficiency=passes / sp[0],
              ar_overhead=(ar[0] / ar[1]) / t_target, compiled=ar[2] + sp[2], lookaheads=lookaheads)

def bench_pair(name:str, target, draft, prompts, n:int, reps:int, temperatures=(0.0, 1.0), Ks=KS + ("auto",)) -> dict:
  """draft: a GPT2, or PromptLookup() (then t_draft is the host lookup, measured in the runs). Both verification rules
  at T > 0; at T = 0 they keep the same tokens in the same rounds, so only the default (block) runs."""
  lookup = isinstance(draft, spec.PromptLookup)
  t_target, t_draft = forward_time(target, 1, reps), 0.0 if lookup else forward_time(draft, 1, reps)
  # the draft's decode as a round's first step runs it: after the target's pass
  t_draft_cold = 0.0 if lookup else forward_time(draft, 1, reps, before=forward_pass(target, 1))
  t_verify = {0: t_target, **{K: forward_time(target, K + 1, reps) for K in spec.LOOKAHEADS}}  # keyed by K: width K+1
  rows = []
  for T in temperatures:
    sampling = Sampling(T)
    ar_s, ar_n, _, ar_compiled = generate_all(lambda p, k: autoregressive_generate(target, p, k, sampling, eos=None), prompts, n)
    for K, rule in [(K, rule) for K in Ks for rule in (spec.RULES if T > 0 else ["block"])]:
      fn = lambda p, k: speculative_generate(target, draft, p, K, k, sampling, eos=None, verification=rule)
      sp_s, sp_n, stats, compiled = generate_all(fn, prompts, n)
      r = row(K, T, stats, (ar_s, ar_n, ar_compiled), (sp_s, sp_n, compiled), t_target,
              drafted_token_seconds(stats) if lookup else t_draft, t_verify,
              t_draft_cold)
      rows.append(r | dict(rule=rule))
      print(f"  {name} T={T:g} K={K} {rule}: alpha {r['alpha']:.3f}, tokens/round {r['tokens_per_round']:.2f}, measured {r['measured']:.2f}x"
            + f", overhead-aware {r['overhead_aware']:.2f}x, efficiency {r['efficiency']:.2f}"
            + f", loop efficiency {r['loop_efficiency']:.2f}"
            + (f", rounds by K {r['lookaheads']}" if K == "auto" or lookup else ""), file=sys.stderr, flush=True)
  return dict(pair=name, t_target=t_target, t_draft=t_draft, t_draft_cold=t_draft_cold, t_verify=t_verify, rows=rows,
              target_bytes=sizes(target)[0], draft_bytes=0 if lookup else sizes(draft)[0],
              runners=dict(target=runner_times(target, 1, reps),
                           draft=None if lookup else runner_times(draft, 1, reps)))

def paired_rounds(target, draft, prompts, K:int, T:float, seeds:int) -> dict:
  """Tokens emitted by a first round under each verification rule, paired: the same prompt and seed give both rules
  the same drafted block and the same uniforms, so the difference is the rule's alone (mean and standard error)."""
  tokens = {rule: [] for rule in spec.RULES}
  for p in prompts:
    for seed in range(seeds):
      for rule in spec.RULES:
        sources = []   # the first round's tokens: its kept drafts, then the resampled or bonus token that ends it
        speculative_generate(target, draft, p, K, K + 1, Sampling(T), seed, eos=None, verification=rule,
                             on_token=lambda e: sources.append(e["source"]))
        tokens[rule].append(sources.index(next(s for s in sources if s != "accepted")) + 1)
  diff = np.array(tokens["block"], dtype=float) - np.array(tokens["token"], dtype=float)
  return dict(K=K, T=T, rounds=len(diff), **{rule: float(np.mean(v)) for rule, v in tokens.items()},
              gain=float(diff.mean()), stderr=float(diff.std(ddof=1) / np.sqrt(len(diff))))

def table(result:dict) -> str:
  f = lambda v, fmt: "-" if v is None else format(v, fmt)
  cold = f", {result['t_draft_cold']*1e3:.1f} ms after a target pass" if result["t_draft_cold"] else ""
  lines = [f"### {result['pair']}: t_target {result['t_target']*1e3:.1f} ms, t_draft {result['t_draft']*1e3:.1f} ms{cold} "
           f"(t_draft/t_target {result['t_draft']/result['t_target']:.3f})", "",
           "| T | K | verify | t_verify(K+1) ms | alpha | tokens/round | AR s | spec s | measured | theoretical | overhead-aware | efficiency | loop efficiency | draft step/t_draft | draft step/after target | AR/t_target | compiled |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in result["rows"]:
    K = r["K"] if r["K"] != "auto" and not r["lookaheads"].get(0) else \
      f"{r['K']} ({', '.join(f'{k}:{n}' for k, n in sorted(r['lookaheads'].items()))})"
    lines.append(f"| {r['T']:g} | {K} | {r['rule']} | {f(r['t_verify'] and r['t_verify']*1e3, '.1f')} | {r['alpha']:.3f} | {r['tokens_per_round']:.2f} | "
                 f"{r['ar_seconds']:.2f} | {r['spec_seconds']:.2f} | {r['measured']:.2f}x | {r['theoretical']:.2f}x | "
                 f"{r['overhead_aware']:.2f}x | {r['efficiency']:.2f} | {r['loop_efficiency']:.2f} | "
                 f"{f(r['draft_step_over_decode'], '.2f')} | "
                 f"{f(r['draft_step_over_cold_decode'], '.2f')} | "
                 f"{r['ar_overhead']:.2f} | {r['compiled']} |")
  return "\n".join(lines)

SETTLE = 0.2   # seconds idle before a run is timed: OpenBLAS's threads keep spinning after numpy's product (docs)

def side_by_side(runs:dict, rounds:int=5) -> dict[str, float]:
  """Each call's seconds (name -> a call): the best of rounds in which each runs in turn (best of 3), after SETTLE
  idle: a shared machine's memory rate moves over minutes, so the times compared with each other are taken side by
  side, and none while the run before it still holds the cores (a pass timed right after numpy's BLAS took 2x)."""
  best = {name: float("inf") for name in runs}
  for _ in range(rounds):
    for name, run in runs.items():
      time.sleep(SETTLE)
      best[name] = min(best[name], best_seconds(run, 3))
  return best

def blas_matvec(nbytes:int=1 << 30):
  """numpy's BLAS matrix-vector product over a square float32 matrix of about nbytes, in this process: a call of it,
  and the bytes it reads."""
  n = int((nbytes // 4) ** 0.5)
  a, v = np.ones((n, n), np.float32), np.ones(n, np.float32)
  return (lambda: a @ v), a.nbytes

def decodes_and_floor(models_:dict, nbytes:int=1 << 30) -> dict[str, tuple[float, int]]:
  """name -> (seconds, bytes read): each model's one-token decode (forward_pass()) and its weights, and numpy's BLAS
  matrix-vector product over nbytes (the memory floor's rate, as bandwidth() measures it), timed side by side."""
  matvec, read = blas_matvec(nbytes)
  runs = {name: forward_pass(m, 1) for name, m in models_.items()} | {"numpy BLAS matvec": matvec}
  times = side_by_side(runs)
  return {name: (times[name], sizes(m)[0]) for name, m in models_.items()} | \
         {"numpy BLAS matvec": (times["numpy BLAS matvec"], read)}

def small_models(report:dict) -> list[str]:
  """Lines: gpt2-xl's decode against the memory floor and each small model's against its bytes at the rate gpt2-xl's
  decode reads its own, all timed side by side (decodes_and_floor()), the deep pair's ms a token (the target alone,
  speculative sampling with default flags at T 0), and each decode by native.py's runner and by replay.py's graph
  where both ran."""
  lines, by = [], {r["pair"]: r for r in report["results"]}
  if decodes := report.get("decodes"):
    (xl_seconds, xl_bytes), (blas_seconds, blas_bytes) = decodes["gpt2-xl"], decodes["numpy BLAS matvec"]
    rate, floor = xl_bytes / xl_seconds, xl_bytes / (blas_bytes / blas_seconds)
    lines.append(f"side by side: gpt2-xl's decode {xl_seconds * 1e3:.1f} ms = {xl_seconds / floor:.2f}x the memory "
                 f"floor (numpy's BLAS matvec at {blas_bytes / blas_seconds / 1e9:.1f} GB/s), reading "
                 f"{rate / 1e9:.1f} GB/s; a small model's decode against its bytes at that rate: " +
                 ", ".join(f"{n} {t * 1e3:.2f} ms = {t / (b / rate):.2f}x ({b / 1e6:.0f} MB)"
                           for n, (t, b) in decodes.items() if n not in ("gpt2-xl", "numpy BLAS matvec")))
  if deep := by.get("docs-deep / docs-draft"):
    row = next((r for r in deep["rows"] if r["T"] == 0 and r["K"] == 2 and r["rule"] == "block"), None)
    if row: lines.append(f"the deep pair at T 0: the target alone {row['ar_seconds'] / row['ar_tokens'] * 1e3:.2f} ms "
                         f"a token, speculative sampling (K 2, block) "
                         f"{row['spec_seconds'] / row['spec_tokens'] * 1e3:.2f} ms a token")
  for r in report["results"]:
    for role, t in (r.get("runners") or {}).items():
      if not t: continue
      lines.append(f"{r['pair']}, the {role}'s decode: native.py's runner {t['native'] * 1e3:.2f} ms, replay.py's "
                   f"graph {t['replay'] * 1e3:.2f} ms ({t['replay'] / t['native']:.2f}x; the step runs {t['chosen']})")
  return lines

def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  ap.add_argument("--pairs", default="xl,deep,ngram", help="comma-separated: xl (dummy gpt2-xl/gpt2), deep (the trained "
                  "pair docs-deep/docs-draft, 12 prompts x 128 tokens), ngram (docs-target with prompt lookup)")
  ap.add_argument("--xl", metavar="DIR", help="the xl pair's target from this gpt2-xl checkpoint directory (config.json + "
                  "model.safetensors) instead of random weights: the load's memory as a user's")
  ap.add_argument("--quick", action="store_true", help="a smoke run: few tokens and repetitions")
  ap.add_argument("--json", metavar="FILE", help="also write every figure to this file")
  ap.add_argument("--dtype", choices=["auto", *models.DTYPES], default="auto", help="precision of the models (as spec.py --dtype)")
  ap.add_argument("--search", type=int, default=0, metavar="N", help="kernels from tinygrad's BEAM search of width N, as "
                  "spec.py --search (minutes the first time on a machine, then cached); 0: tinygrad's default kernels (the "
                  "linear layers' kernels are measured either way)")
  ap.add_argument("--plain", action="store_true", help="the port alone, without the engine (spec.py --plain)")
  ap.add_argument("--first-run", action="store_true", help="also time the default command to its exit with every cache "
                  "empty, then again warm (minutes; before the pairs, alone on the machine)")
  args = ap.parse_args()
  if args.plain and args.search: ap.error("--search is the engine's: drop --plain")
  pairs, reps = args.pairs.split(","), 2 if args.quick else 5
  load = lambda name, **kw: models.load(name, args.dtype, search=args.search, plain=args.plain, **kw)
  enc = models.tokenizer()
  prompts = [enc.encode(p) for p in SHORT_PROMPTS]
  report = dict(machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, tinygrad {Device.DEFAULT}, "
                        f"{args.dtype}, {'plain' if args.plain else f'engine, search {args.search}'}",
                results=[])
  print(f"# spec benchmark: {report['machine']}\n")
  if args.first_run:
    report["first_run"] = runs = first_runs(args.dtype, args.plain)
    print(f"the default command ({' '.join(FIRST_RUN)}) to its exit: every cache empty {runs['first']:.0f} s, "
          f"then warm {runs['second']:.0f} s\n", flush=True)
  if "xl" in pairs:   # first, so that the peak resident memory is this run's
    target, draft = load(args.xl) if args.xl else load("gpt2-xl", dummy=True), load("gpt2", dummy=True)
    (tw, tk), (dw, dk), target_dtype = sizes(target), sizes(draft), target.dtype.name
    load_rss = peak_rss()
    result = bench_pair(f"{'' if args.xl else 'dummy '}gpt2-xl / gpt2", target, draft, prompts[:1], 8 if args.quick else 24, reps)
    report["memory"] = dict(weight_bytes=tw + dw, kv_bytes=tk + dk, load_peak_rss=load_rss, peak_rss=peak_rss())
    report["results"].append(result)
    if "deep" in pairs:   # the small models' decodes against gpt2-xl's, timed side by side
      small = {d: load(str(SHARED / d)) for d in ("docs-deep", "docs-draft")}
      report["decodes"] = decodes_and_floor({"gpt2-xl": target, "gpt2": draft, **small})
      del small
    del target, draft; gc.collect()
  report["bandwidth"] = bws = bandwidth()
  bw = max(v for k, v in bws.items() if "1 thread" not in k)
  if "xl" in pairs:
    xl, mem = report["results"][0], report["memory"]
    floor = tw / bw
    ar_per_token = {r["T"]: r["ar_seconds"] / r["ar_tokens"] for r in xl["rows"]}
    seed_theory = SEED_R_PRIME * (SEED_K + 1) * xl["t_target"] / (SEED_K * xl["t_draft"] + xl["t_target"])
    seed_aware = SEED_R_PRIME * (SEED_K + 1) * xl["t_target"] / (SEED_K * xl["t_draft"] + xl["t_verify"][SEED_K])
    # -K auto at the seed's acceptance: rounds simulated with these passes' costs, each draft kept with the seed's rate a
    # (r'(K+1) tokens a round at K 4); its tokens per second against each fixed K's as predicted
    a = next(a / 1000 for a in range(999, 0, -1) if (1 - (a / 1000) ** (SEED_K + 1)) / (1 - a / 1000) <= SEED_R_PRIME * (SEED_K + 1))
    costs = {K: K * xl["t_draft"] + xl["t_verify"][K] for K in spec.LOOKAHEADS}
    predicted = {K: (1 - a ** (K + 1)) / (1 - a) * xl["t_target"] / costs[K] for K in spec.LOOKAHEADS}
    auto_tokens_per_s, auto = simulated_auto(costs, a)
    report["xl"] = dict(auto_at_seed_acceptance=dict(per_token_rate=a, predicted=predicted, auto=auto,
                                                     auto_over_best=auto_tokens_per_s * xl["t_target"] / max(predicted.values())),
                        bandwidth_floor=floor, decode_over_floor=xl["t_target"] / floor,
                        single_core_floor=tw / bws["numpy BLAS matvec, 1 thread"],
                        ar_over_floor={T: s / floor for T, s in ar_per_token.items()},
                        seed_prediction=seed_theory, seed_prediction_overhead_aware=seed_aware)
  if "deep" in pairs:
    target, draft = (load(str(SHARED / d)) for d in ("docs-deep", "docs-draft"))
    paired = [enc.encode(p) for p in PROMPTS]
    report["results"].append(bench_pair("docs-deep / docs-draft", target, draft, paired[:3] if args.quick else paired,
                                        32 if args.quick else 128, reps))
    report["paired"] = [paired_rounds(target, draft, paired, K, 1.0, 3 if args.quick else 20) for K in (2, 4)]
    del target, draft; gc.collect()
  if "ngram" in pairs:
    target = load(str(SHARED / "docs-target"))
    report["results"].append(bench_pair("docs-target / prompt lookup, repetitive prompts", target, spec.PromptLookup(),
                                        [enc.encode(p) for p in REPETITIVE], 32 if args.quick else 128, reps, Ks=(4, "auto")))

  print(f"memory read bandwidth {bw / 1e9:.1f} GB/s, the fastest matrix-vector product over 1 GiB: "
        + ", ".join(f"{k} {v / 1e9:.1f} GB/s" for k, v in bws.items()))
  if "xl" in pairs:
    x = report["xl"]
    print(f"gpt2-xl decode: t_target {xl['t_target']*1e3:.0f} ms = {x['decode_over_floor']:.2f}x the bandwidth floor "
          f"({target_dtype} weights {tw/1e9:.2f} GB / {bw/1e9:.1f} GB/s = {floor*1e3:.0f} ms); autoregressive per token incl. "
          f"sampling: {', '.join(f'T={T:g} {v:.2f}x' for T, v in x['ar_over_floor'].items())}")
    print("gpt2-xl passes of K+1 tokens / its decode: " + ", ".join(f"{k+1}: {xl['t_verify'][k]/xl['t_target']:.2f}x" for k in spec.LOOKAHEADS)
          + f"; gpt2 decode {xl['t_draft']*1e3:.1f} ms = {xl['t_draft']/(dw/bw):.2f}x its floor ({dw/1e9:.2f} GB)")
    print(f"one core's floor (numpy BLAS, 1 thread): gpt2-xl {x['single_core_floor']*1e3:.0f} ms, decode = "
          f"{xl['t_target']/x['single_core_floor']:.2f}x it (tinygrad's CPU backend runs a process's kernels on one core)")
    held = mem['weight_bytes'] + mem['kv_bytes']
    print(f"peak resident memory after the load {mem['load_peak_rss']/1e9:.2f} GB = {mem['load_peak_rss']/held:.2f}x, after the "
          f"run {mem['peak_rss']/1e9:.2f} GB = {mem['peak_rss']/held:.2f}x (weights {mem['weight_bytes']/1e9:.2f} GB + KV caches "
          f"{mem['kv_bytes']/1e9:.2f} GB, allocated)")
    au = x["auto_at_seed_acceptance"]
    print(f"-K auto at the seed's acceptance (each draft kept with {au['per_token_rate']:.3f}): runs K {au['auto']} most, "
          f"{au['auto_over_best']:.3f} of the best fixed K's predicted speedup in simulated rounds ("
          + ", ".join(f"K {K}: {v:.2f}x" for K, v in au["predicted"].items()) + ")")
    print(f"the seed's acceptance (r' {SEED_R_PRIME}, K {SEED_K}) with these gpt2-xl/gpt2 costs: {x['seed_prediction']:.2f}x "
          f"(theoretical), {x['seed_prediction_overhead_aware']:.2f}x (overhead-aware); the seed measured {SEED_SPEEDUP}x on its GPU")
  for r in report.get("paired", []):
    print(f"paired first rounds, docs-deep / docs-draft, T {r['T']:g}, K {r['K']} ({r['rounds']} rounds: {len(PROMPTS)} prompts x seeds): "
          f"tokens per round block {r['block']:.3f}, token {r['token']:.3f}, block - token {r['gain']:+.3f} +- {r['stderr']:.3f} (1 s.e.)")
  for line in small_models(report): print(line)
  for result in report["results"]: print("\n" + table(result))
  if args.json: pathlib.Path(args.json).write_text(json.dumps(report, indent=1))

if __name__ == "__main__":
  main()

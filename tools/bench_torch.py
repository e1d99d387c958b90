#!/usr/bin/env python3
"""Optional benchmark step: spec against what a user would run instead, PyTorch + Hugging Face transformers, in one
process on the same machine (ratios from one run). Not a dependency of spec.py or the tests:

  pip install torch==2.13.0 transformers
  python3 tools/bench_torch.py                 # forward passes (gpt2-xl, gpt2, docs-deep/docs-draft), generation on them
  python3 tools/bench_torch.py --passes gpt2,deep   # skip gpt2-xl (random weights, 7.5 GB of memory)
  python3 tools/bench_torch.py --passes gpt2-xl -n 0   # its passes only, no generation runs

Forward passes: one pass of w tokens after a KV cache of 100 tokens (a decode for w = 1), best of 5, float32, both on
all cores (torch.set_num_threads(os.cpu_count())). Generation: the trained pair docs-deep/docs-draft on a dozen English
prompts, 128 new tokens each, greedy; spec's target alone and speculative sampling with default flags against
transformers' plain and assisted generation (assistant_model=the draft: with spec's default K as num_assistant_tokens on
the constant schedule, and with transformers' own defaults, as a user who passes only the draft runs it), each after a
warm-up generation.
"""
import argparse, copy, inspect, os, pathlib, sys, time
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared" / "models"
if (SHARED / "tiktoken").is_dir(): os.environ["TIKTOKEN_CACHE_DIR"] = str(SHARED / "tiktoken")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import GPT2Config, GPT2LMHeadModel
import models, spec
from benchmark import PROMPTS, forward_time

def torch_pass(model, width:int, pos:int=100, reps:int=5) -> float:
  with torch.no_grad():
    cache = model(torch.full((1, pos), models.EOT), use_cache=True).past_key_values
    x, best = torch.full((1, width), models.EOT), float("inf")
    for _ in range(reps + 2):  # the first calls warm up
      t0 = time.perf_counter(); model(x, past_key_values=cache, use_cache=True); best = min(best, time.perf_counter() - t0)
      cache.crop(-width)                                            # drop what the pass appended
  return best

def passes(name:str, ours:models.GPT2, theirs, widths=(1, 2, 3, 5, 9)) -> None:
  print(f"\n### {name}: one pass of w tokens, ms (spec / PyTorch)\n\n| w | spec | PyTorch | spec / PyTorch |\n|---|---|---|---|")
  for w in widths:
    a, b = forward_time(ours, w), torch_pass(theirs, w)
    print(f"| {w} | {a*1e3:.1f} | {b*1e3:.1f} | {a/b:.2f} |", flush=True)

def hf_model(cfg:models.GPT2Config):
  return GPT2LMHeadModel(GPT2Config(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd, vocab_size=cfg.vocab_size,
                                    n_positions=cfg.n_positions)).eval()

def timed(fn) -> tuple[float, int]:
  t0 = time.perf_counter(); n = fn(); return time.perf_counter() - t0, n

def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--passes", default="gpt2-xl,gpt2,deep", help="comma-separated: gpt2-xl, gpt2 (their shapes, random "
                  "weights), deep (docs-deep and docs-draft)")
  ap.add_argument("-n", type=int, default=128, help="new tokens per prompt in the generation runs; 0: the passes only")
  ap.add_argument("--search", type=int, default=0, help="spec's kernel search (spec.py --search)")
  args = ap.parse_args()
  torch.set_num_threads(os.cpu_count())
  print(f"# spec vs PyTorch {torch.__version__} (transformers), {os.cpu_count()} cores, {torch.get_num_threads()} torch threads")
  for name in [n for n in ("gpt2-xl", "gpt2") if n in args.passes.split(",")]:
    ours = models.load(name, "float32", dummy=True, search=args.search)
    passes(name + " shapes", ours, hf_model(ours.cfg))
    del ours
  target, draft = (models.load(str(SHARED / d), "float32", search=args.search) for d in ("docs-deep", "docs-draft"))
  hf_target, hf_draft = (GPT2LMHeadModel.from_pretrained(str(SHARED / d)).eval() for d in ("docs-deep", "docs-draft"))
  if "deep" in args.passes.split(","):
    passes("docs-deep", target, hf_target); passes("docs-draft", draft, hf_draft, widths=(1,))
  enc = models.tokenizer()
  prompts = [enc.encode(p) for p in PROMPTS]
  K = inspect.signature(spec.speculative_generate).parameters["K"].default
  defaults = copy.deepcopy(hf_draft.generation_config)
  def hf(assisted:bool, constant_K:bool=False) -> int:
    hf_draft.generation_config = copy.deepcopy(defaults)
    if constant_K: hf_draft.generation_config.update(num_assistant_tokens_schedule="constant", num_assistant_tokens=K)
    n, kw = 0, dict(assistant_model=hf_draft) if assisted else {}
    with torch.no_grad():
      for p in prompts:
        out = hf_target.generate(torch.tensor([p]), max_new_tokens=args.n, min_new_tokens=args.n, do_sample=False,
                                 pad_token_id=models.EOT, **kw)
        n += out.shape[1] - len(p)
    return n
  def ours(speculative:bool) -> int:
    run = (lambda p: spec.speculative_generate(target, draft, p, max_new_tokens=args.n, eos=None)) if speculative else \
          (lambda p: spec.autoregressive_generate(target, p, max_new_tokens=args.n, eos=None))
    return sum(len(run(p)[0]) for p in prompts)
  runs = {"spec, target alone": lambda: ours(False), "spec, speculative (default flags)": lambda: ours(True),
          "transformers, target alone": lambda: hf(False),
          f"transformers, assisted generation (K {K}, constant)": lambda: hf(True, constant_K=True),
          "transformers, assisted generation (its defaults)": lambda: hf(True)}
  if args.n < 1: return
  print(f"\n### docs-deep / docs-draft: {len(prompts)} prompts x {args.n} new tokens, greedy\n\n| run | tokens/s |\n|---|---|")
  for name, fn in runs.items():
    fn()                                                            # warm-up: JIT capture, kernel search, torch's first calls
    seconds, n = timed(fn)
    print(f"| {name} | {n / seconds:.1f} |", flush=True)

if __name__ == "__main__":
  main()

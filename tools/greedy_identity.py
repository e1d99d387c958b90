#!/usr/bin/env python3
"""Greedy identity in a given precision: speculative sampling vs the target alone on the shared pair, every divergence
with its position and the target's top-2 logit margin there.

  DEV=CL python3 tools/greedy_identity.py --dtype float16            # 10 prompts x 200 tokens x K = 1, 2, 4, 8
  DEV=CPU python3 tools/greedy_identity.py --dtype float32 -n 50     # float32: identity is promised, expect none

A (K+1)-row verify pass and a one-row decode may round differently; in float16 that can flip the argmax where the
target's two best tokens are nearly tied. At a divergence the script reports, from a float32 copy of the target on the
common prefix, the margin between the target's two best logits and between the two tokens chosen (a small margin means
a near-tie, not a bug). Not part of the test suite: it measures and reports; it exits 1 if a divergence is not at a
near-tie (float32 margin above --tie). Default K and prompts as in the README.
"""
import argparse, json, os, pathlib, sys
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "tools"))
SHARED = ROOT.parent / "shared" / "models"
if (SHARED / "tiktoken").is_dir(): os.environ["TIKTOKEN_CACHE_DIR"] = str(SHARED / "tiktoken")

import numpy as np
from tinygrad import Tensor, Device, dtypes
import models
from spec import autoregressive_generate, speculative_generate
from benchmark import PROMPTS

def margins(reference:models.GPT2, prefix:list[int], chosen:tuple[int, int]) -> tuple[float, float]:
  """float32 logits after prefix: (top-1 minus top-2, |logit(a) - logit(b)| for the two tokens chosen)."""
  logits = reference.forward(Tensor([prefix], dtype=dtypes.int32), 0)[-1].numpy().astype(np.float64)
  top = np.sort(logits)[-2:]
  return float(top[1] - top[0]), float(abs(logits[chosen[0]] - logits[chosen[1]]))

def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--dtype", choices=list(models.DTYPES), default="float16", help="precision of the models under test")
  ap.add_argument("-n", type=int, default=200, help="new tokens per prompt")
  ap.add_argument("--prompts", type=int, default=10, help="how many of the test prompts")
  ap.add_argument("-K", type=int, nargs="+", default=[1, 2, 4, 8], help="lookaheads")
  ap.add_argument("--tie", type=float, default=0.05, help="a float32 top-2 margin below this (in logits) counts as a near-tie")
  ap.add_argument("--json", help="write the divergences to this file")
  args = ap.parse_args()
  enc = models.tokenizer()
  target, draft = (models.load(str(SHARED / name), args.dtype) for name in ("docs-target", "docs-draft"))
  reference = models.load(str(SHARED / "docs-target"), "float32")
  print(f"# greedy identity, {Device.DEFAULT}, {args.dtype}: {args.prompts} prompts x {args.n} tokens x K {args.K}", flush=True)
  found, runs = [], 0
  for prompt in PROMPTS[:args.prompts]:
    tokens = enc.encode(prompt)
    base = autoregressive_generate(target, tokens, args.n, eos=None)[0]
    for K in args.K:
      got = speculative_generate(target, draft, tokens, K, args.n, eos=None)[0]
      runs += 1
      if got == base: continue
      i = next(i for i, (a, b) in enumerate(zip(got, base)) if a != b)
      top2, chosen = margins(reference, tokens + base[:i], (base[i], got[i]))
      found.append(dict(prompt=prompt, K=K, position=i, target=base[i], spec=got[i], top2_margin=top2, chosen_margin=chosen))
      print(f"divergence: {prompt!r} K={K} at new token {i}: target {base[i]} {enc.decode([base[i]])!r}, spec {got[i]} "
            f"{enc.decode([got[i]])!r}; float32 top-2 margin {top2:.4f}, between the two {chosen:.4f}", flush=True)
  print(f"{len(found)} divergences in {runs} runs ({runs * args.n} tokens)")
  if args.json: pathlib.Path(args.json).write_text(json.dumps(found, indent=1))
  return 1 if any(d["chosen_margin"] > args.tie for d in found) else 0

if __name__ == "__main__":
  sys.exit(main())

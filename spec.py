#!/usr/bin/env python3
"""spec: exact speculative sampling (Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative
Sampling", Algorithm 2) with a small draft GPT-2 and a large target GPT-2 on tinygrad.

Notation as in the paper: p is the draft's distribution, q the target's, K the lookahead, n the length of the
sequence so far. One round (generate()):
  1. the draft samples x~_1..x~_K autoregressively, x~_t ~ p(x | x_1..x_n, x~_1..x~_t-1)            propose()
  2. the target computes q(x | x_1..x_n), ..., q(x | x_1..x_n, x~_1..x~_K) in one forward pass       target_verify()
  3. token by token: keep x~_t while r_t < min(1, q(x~_t)/p(x~_t)), r_t ~ U[0, 1); at the first
     rejection draw x ~ norm(max(0, q - p)); if all K are kept draw a bonus x ~ q_K+1            token_verification()
     or, by default, judge the block as a whole (Sun et al. 2025, block verification)         block_verification()
Every emitted token is distributed exactly as the target's (greedy: exactly the target's greedy token). A round runs
on the device and the host reads one small vector per round (Round).
Sections, in reading order: 1. the round loop, 2. the algorithm (each step a function on the device), 3. the
drafters and the verifier, 4. the device primitives (argmax, a top-k/top-p threshold, multinomial sampling in the
form tinygrad runs fast), 5. the plumbing (warm-up, -K auto, statistics), 6. the command line.
"""
from __future__ import annotations
import argparse, codecs, collections, functools, json, math, os, statistics, sys, time, weakref
from dataclasses import dataclass, field, asdict
from typing import Protocol
from tinygrad import Device, Tensor, UOp, dtypes
import models
from models import EOT, GPT2, vocab_width
from models.timing import best_seconds, synchronize

# ***** 1. the round loop *****

def speculative_generate(target:GPT2, draft:GPT2|PromptLookup, prompt_tokens:list[int], K:int|str=2,
                         max_new_tokens:int=256, sampling:Sampling|None=None, seed:int=0, eos:int|None=EOT,
                         on_token=None, verification:str="block") -> tuple[list[int], Stats]:
  """Speculative sampling: the new tokens (distributed exactly as the target's) and the run's Stats. draft: a GPT2 or a
  PromptLookup. K: the lookahead, or "auto" to choose it each round (AutoLookahead). sampling: a Sampling (default
  greedy). verification: a rule of RULES. on_token(dict) is called for each emitted token with its id, source, index
  in its round, q(x) and p(x)."""
  sampling = sampling or Sampling()
  check([target] + ([draft] if isinstance(draft, GPT2) else []), prompt_tokens or [EOT], max_new_tokens, K,
        verification, seed)
  key = seed_key(seed)
  drafter = ModelDraft(draft, sampling, key) if isinstance(draft, GPT2) else draft
  verifier = Verifier(target, sampling, key, verification)
  return generate(drafter, verifier, prompt_tokens, K, max_new_tokens, eos, on_token)

def autoregressive_generate(target:GPT2, prompt_tokens:list[int], max_new_tokens:int=256,
                            sampling:Sampling|None=None, seed:int=0, eos:int|None=EOT,
                            on_token=None) -> tuple[list[int], Stats]:
  """The baseline: the target alone, one token per pass (rounds that draft nothing), same warps, KV cache and JIT."""
  sampling = sampling or Sampling()
  check([target], prompt_tokens or [EOT], max_new_tokens, 1, seed=seed)
  return generate(NoDraft(), Verifier(target, sampling, seed_key(seed), "token"), prompt_tokens, 0, max_new_tokens, eos,
                  on_token)

def generate(drafter:Drafter, verifier:Verifier, prompt_tokens:list[int], K:int|str, max_new_tokens:int, eos:int|None,
             on_token) -> tuple[list[int], Stats]:
  """The rounds, until max_new_tokens or an EOS. Round r draws from the random streams 2r (draft) and 2r+1 (verify)."""
  tokens = list(prompt_tokens) or [EOT]          # an empty prompt is unconditional generation after <|endoftext|>
  stats = Stats(K=K, draft=drafter.kind, verification=verifier.rule if K else "")
  auto = prepare(drafter, verifier, K, tokens[0], stats)
  verifier.target.prefill(tokens[:-1]); drafter.reset(tokens)
  out = Output(tokens, max_new_tokens, eos, on_token, stats)
  start = synchronize()
  while not out.done:
    t0 = time.perf_counter()
    k = auto.choose() if auto else K
    block, p = drafter.propose(tokens, k, nonce=2 * stats.rounds)                        # 1. x~_1..x~_k ~ p
    # 2. q at all k+1 positions in one target pass, 3. keep a prefix, draw the next token: the round's one host read
    # (the target's cache rolls back by position, as the draft's). Nothing waits in between: Python enqueues the
    # verify step while the draft's last step runs.
    drafted = width(block) - 1                                           # drafted < k: prompt lookup found less
    packed = verifier(block, p, len(tokens) - 1, nonce=2 * stats.rounds + 1)
    outcome = Round.read(verifier.target.read(packed), drafted, stats)
    events = outcome.events()
    if auto: auto.update(k, len(events), time.perf_counter() - t0, drafted)
    stats.add_round(drafted, len(events) - 1)
    out.emit(events)
  return out.new, stats.finish(start, len(out.new))

@dataclass
class Round:
  """A round's outcome as the host reads it, at once: the drafts kept, the next token (resampled after a rejection,
  the bonus after all K, the target's own when nothing was drafted) with q and p of it, each draft with its q and p."""
  kept: int            # n
  token: int           # the next token
  q_token: float       # q(token)
  p_token: float       # p(token): the residual's draw is from q - p (0 for the bonus)
  drafted: list[int]   # x~_1..x~_K
  q: list[float]       # q(x~_t)
  p: list[float]       # p(x~_t)
  @staticmethod
  def packed(kept, token, q_token, p_token, drafted, q, p) -> Tensor:
    """The fields as one float32 vector on the device, in their order: the round's one host read (token ids are below
    2^24, exact in float32)."""
    head = Tensor.stack(*[x.float() for x in (kept, token, q_token, p_token)])
    return head.cat(*[x.float() for x in (drafted, q, p)]).realize()
  @classmethod
  def read(cls, v:list[float], K:int, stats:Stats) -> Round:
    """The round from packed()'s fields as the host read them."""
    stats.host_syncs += 1
    return cls(int(v[0]), int(v[1]), v[2], v[3], [int(x) for x in v[4:4+K]], v[4+K:4+2*K], v[4+2*K:4+3*K])
  def events(self) -> list[dict]:
    """The round's tokens: the kept drafts, then the resampled, bonus or (K 0) target token."""
    K = len(self.drafted)
    kept = [dict(id=x, source="accepted", index=i, q=self.q[i], p=self.p[i])
            for i, x in enumerate(self.drafted[:self.kept])]
    source = "resampled" if self.kept < K else "bonus" if K else "target"
    return kept + [dict(id=self.token, source=source, index=self.kept, q=self.q_token,
                        p=self.p_token if self.kept < K else None)]

class Output:
  """The sequence so far and the stopping rules: exactly max_new_tokens, and nothing after an EOS."""
  def __init__(self, prompt_tokens:list[int], max_new_tokens:int, eos:int|None, on_token, stats:Stats):
    self.tokens, self.new, self.done = prompt_tokens, [], False
    self.max_new_tokens, self.eos, self.on_token, self.stats = max_new_tokens, eos, on_token, stats
  def emit(self, events:list[dict]) -> None:
    """Append a round's tokens in order, stopping at the first that ends the output (the rest of the block is
    dropped)."""
    for e in events:
      self.new.append(e["id"]); self.tokens.append(e["id"])
      self.stats.sources[e["source"]] = self.stats.sources.get(e["source"], 0) + 1
      if self.on_token: self.on_token(e)
      if len(self.new) == self.max_new_tokens or e["id"] == self.eos:
        self.done = True
        return

# ***** 2. the algorithm: each step as a function on the device *****

@dataclass(frozen=True)
class Sampling:
  """How logits become the distribution sampled from; p and q are warped identically. temperature 0 is greedy,
  top_k 0 and top_p 1 switch those filters off."""
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  def __post_init__(self):
    # the device divides in float32 (largest 3.40282e38); an infinite temperature makes the padding's -inf / inf NaN
    if not 0 <= self.temperature <= 3.4e38:
      raise ValueError(f"temperature must be in [0, 3.4e38], got {self.temperature}")
    if self.top_k < 0: raise ValueError(f"top-k must be >= 0, got {self.top_k}")
    if not 0 < self.top_p <= 1: raise ValueError(f"top-p must be in (0, 1], got {self.top_p}")
  @property
  def static(self) -> dict:
    """The structural choices, compiled separately: greedy (argmax, no draws) and the filters that are on. The values go
    in as Tensors (tensors()), so changing them compiles nothing."""
    greedy, on = self.temperature == 0, {"top_k": self.top_k > 0, "top_p": self.top_p < 1}
    return dict(greedy=greedy, filters=() if greedy else tuple(f for f in on if on[f]))   # no filter changes the argmax
  def tensors(self, vocab_size:int) -> tuple[Tensor, Tensor, Tensor]:
    """The values as the device holds them, clamped where they would overflow or round to 0 without changing what they
    mean: temperature and top-p at least 2**-126, float32's smallest normal number (a tinier temperature is the argmax,
    a tinier top-p keeps the most likely token); top-k at most the vocabulary (a larger one keeps every token)."""
    return (constant("temperature", max(self.temperature, 2**-126), dtype=dtypes.float32),
            constant("top_k", min(self.top_k, vocab_size) or vocab_size, dtype=dtypes.int32),
            constant("top_p", max(self.top_p, 2**-126), dtype=dtypes.float32))

def warp(logits:Tensor, temperature:Tensor, top_k:Tensor, top_p:Tensor, *, filters:tuple[str, ...]) -> Tensor:
  """logits (N, V) -> the distributions (N, V) that tokens are drawn from, temperature > 0: softmax(logits / T), then
  top-k, then top-p of what top-k kept. Greedy builds no distribution: its steps take best() of the logits."""
  shifted = logits - logits.max(-1, keepdim=True)   # first: logits / temperature overflows for a tiny temperature
  probs = (shifted / temperature).exp().contiguous()   # materialized: the sum's and the division's kernels read it
  probs = probs / probs.sum(-1, keepdim=True)
  if "top_k" in filters: probs = probs * keep_largest(probs, Tensor.ones_like(probs, dtype=dtypes.int32), top_k)
  if "top_p" in filters:
    mass = (probs * 2**60).cast(dtypes.int64)   # fixed point: summed exactly, in any order (probabilities <= 1)
    probs = probs * keep_largest(probs, mass, top_p * mass.sum(-1, keepdim=True).float())
  if filters: probs = probs / probs.sum(-1, keepdim=True)
  return probs.contiguous()  # materialized: every later step reads it

def acceptance(p:Tensor, q:Tensor, x:Tensor) -> tuple[Tensor, Tensor]:
  """min(1, q(x)/p(x)) for each drafted x (K,), the probability that the target keeps it, as the fraction (q(x), p(x)):
  the rule tests r p(x) < q(x), never a quotient (q / p rounds below 1 where q = p on some devices). p, q: (K, V)."""
  return q.gather(-1, x.unsqueeze(-1)).squeeze(-1), p.gather(-1, x.unsqueeze(-1)).squeeze(-1)

def residual(p:Tensor, q:Tensor) -> Tensor:
  """norm(max(0, q - p)) per row: where to draw from after a rejection. With p = 0 it is q: the bonus token. A row of no
  mass (q <= p everywhere, reached only by float32's rounding: the exact rule never stops there) draws from q itself."""
  diff = (q - p).relu()
  mass = diff.sum(-1, keepdim=True)
  return (mass > 0).where(diff / mass, q / q.sum(-1, keepdim=True))

def propose(draft:GPT2, start_pos, key:Tensor, nonce:UOp, warping:tuple, *unseen_ids:UOp, K:int, greedy:bool,
            filters:tuple[str, ...]):
  """Step 1. unseen_ids: the w tokens the draft has not consumed yet, the last one being x_n, as bound variables (they
  reach the step without a kernel or copy of their own: token_variables()); start_pos: where they go; key and nonce:
  the run's random stream for this call; warping: the sampling's values (Sampling.tensors()). Returns the verify
  input [x_n, x~_1..x~_K] (1, K+1) and the draft distributions p (K, V), V padded (padded()); greedy: p = None, one-hot
  on the block, and nothing is drawn."""
  u = None if greedy else uniform(key, nonce, K, uniforms_per_draw(vocab_width(draft.cfg.vocab_size)))
  unseen = token_tensor(unseen_ids)
  tokens, pos, drafted, ps = unseen, start_pos, [], []
  for t in range(K):
    logits = padded(draft.forward(tokens, pos, last=True))
    # x~_t+1 = argmax p(x | x_1..x_n, x~_1..x~_t)
    if greedy: x = best(logits)[:, 0]
    else:
      ps.append(warp(logits, *warping, filters=filters))   # (1, V) p(x | x_1..x_n, x~_1..x~_t)
      x = sample(ps[-1], u[t:t+1])                                          # x~_t+1 ~ p
    drafted.append(x.realize())                           # realized: the next step reads it, not recomputes it
    pos, tokens = pos + tokens.shape[1], drafted[-1].reshape(1, 1)
  # the block flat, then viewed as (1, K+1), as the target's verify step takes it
  block = unseen[0, -1:].cat(*drafted).realize().reshape(1, K + 1)
  return block, None if greedy else Tensor.cat(*ps).realize()

def token_verification(p:Tensor, q:Tensor, drafted:Tensor, r:Tensor) -> tuple[Tensor, Tensor]:
  """Step 3 (Chen et al.): keep x~_t while r_t < min(1, q(x~_t)/p(x~_t)). p, q (K+1, V), drafted, r (K,). Returns n, the
  number kept, and the distribution of the next token, norm(max(0, q_n - p_n))."""
  K = drafted.shape[0]
  qx, px = acceptance(p[:K], q[:K], drafted)
  kept = r * px < qx                                                        # r < q(x~)/p(x~), multiplied out
  n = kept.where(K, Tensor.arange(K)).pad(((0, 1),), value=K).min().contiguous()   # the first rejection, K if none
  return n, residual(p, q)[n]

def block_acceptance(p:Tensor, q:Tensor, drafted:Tensor) -> tuple[Tensor, Tensor, Tensor]:
  """Sun et al. 2025, Alg. 2: the prefix x~_1..x~_i is judged as a whole by w_i = min(1, w_i-1 q(x~_i)/p(x~_i)), w_0 =
  1, and the round may stop after it with probability h_i = m_i / (m_i + 1 - w_i), m_i = sum max(0, w_i q_i+1 - p_i+1)
  the residual mass left there (h_0 = 1; h_K = w_K, as p_K+1 = 0; h_i = 0 where m_i = 0: go on). Returns w (K+1,) and
  h as odds, m : 1 - w: the rule tests r (1 - w) < m (1 - r), neither a quotient nor a sum, so h is 1 where w is (m + 1
  - w rounds m to float32's grid near 1, below r); 1 - w and 1 - r are exact there. h_0 = 1 is 1 : 0."""
  K = drafted.shape[0]
  qx, px = (t[Tensor.arange(K), drafted] for t in (q, p))
  w = [Tensor.ones(1, dtype=q.dtype)]
  for t in range(K): w.append((w[-1] * qx[t:t+1] >= px[t:t+1]).where(1, w[-1] * qx[t:t+1] / px[t:t+1]))  # 1 exactly
  w = Tensor.cat(*w).contiguous()   # materialized: around a tinygrad 0.14 code generator bug (docs/tests.md)
  m = (w.unsqueeze(-1) * q - p).relu().sum(-1)
  first = Tensor.arange(K + 1) == 0
  return w, first.where(1, m), first.where(0, 1 - w)

def block_verification(p:Tensor, q:Tensor, drafted:Tensor, r:Tensor) -> tuple[Tensor, Tensor]:
  """Step 3 by blocks: n is the largest i with r_i < h_i (i >= 1; else 0), the next token is drawn from norm(max(0, w_n
  q_n+1 - p_n+1)). Same arguments and result as token_verification; never fewer tokens in expectation."""
  w, m, slack = block_acceptance(p, q, drafted)
  r = r.cast(m.dtype).pad(((1, 0),))                                        # r_0 = 0: stopping at 0 is always allowed
  stops = r * slack < m * (1 - r)                                           # r_i < h_i, as odds
  n = stops.where(Tensor.arange(w.shape[0]), 0).max().contiguous()
  return n, residual(p, w.unsqueeze(-1) * q)[n]

RULES = {"block": block_verification, "token": token_verification}

def greedy_verification(q_logits:Tensor, drafted:Tensor) -> tuple[Tensor, Tensor, Tensor]:
  """Step 3 at temperature 0, either rule: p and q are one-hot on their argmaxes, so min(1, q(x~_t)/p(x~_t)) is 1 where
  x~_t is q_t's argmax and 0 elsewhere, and the residual after a rejection is one-hot on q_t's argmax. Keeps the drafts
  up to the first that is not the target's argmax; the next token is the argmax there (q_K+1's when all are kept).
  Returns n, the token and q(x~) (K,)."""
  K, target_best = drafted.shape[0], best(q_logits)[:, 0].contiguous()   # materialized: read by two kernels
  agree = drafted == target_best[:K]
  n = agree.where(K, Tensor.arange(K)).pad(((0, 1),), value=K).min().contiguous()   # the first disagreement, K if none
  return n, target_best[n], agree.float()

def verify(q_logits:Tensor, p:Tensor|None, block:Tensor, key:Tensor, nonce:UOp, warping:tuple, *, greedy:bool,
           filters:tuple[str, ...], rule:str, one_hot:bool=False) -> Tensor:
  """Step 3, modified rejection sampling by a rule of RULES. q_logits (K+1, V) from the target's pass over block =
  [x_n, x~_1..x~_K], p (K, V); one_hot (a deterministic draft: prompt lookup, or none): p = None, one-hot on each x~_t;
  greedy: p unused. Returns the Round, packed."""
  (K, V), drafted = (block.shape[1] - 1, q_logits.shape[-1]), block[0, 1:]
  if greedy:
    n, token, qx = greedy_verification(q_logits, drafted)
    return Round.packed(n, token, Tensor(1.0), Tensor(0.0), drafted, qx, Tensor.ones(K))
  if one_hot: p = (drafted.unsqueeze(-1) == Tensor.arange(V)).float().contiguous()
  q = warp(q_logits, *warping, filters=filters)
  r = uniform(key, nonce, K + uniforms_per_draw(V))
  p = p.cat(Tensor.zeros(1, V))                                             # no draft past x~_K: row K's residual is q
  # r[:K], q(x~) and p(x~) materialized: around two tinygrad 0.14 code generator bugs (docs/tests.md)
  n, dist = RULES[rule](p, q, drafted, r[:K].contiguous())                  # n kept; the residual or the bonus q_K+1
  token = sample(dist, r[K:])
  qx, px = (t[Tensor.arange(K), drafted].contiguous() for t in (q, p))
  return Round.packed(n, token, q[n, token], p[n, token], drafted, qx, px)

def target_verify(target:GPT2, block:Tensor, start_pos, p:Tensor|None, key:Tensor, nonce:UOp, warping:tuple,
                  **static) -> Tensor:
  """Steps 2 and 3 in one JIT call: the target's pass over block, then verify()."""
  return verify(padded(target.forward(block, start_pos)), p, block, key, nonce, warping, **static)

def target_verify_ids(target:GPT2, start_pos, key:Tensor, nonce:UOp, warping:tuple, *ids:UOp, **static) -> Tensor:
  """target_verify() of a block the host made (prompt lookup's, the baseline's one token), its ids bound variables
  (they reach the step without a copy or a JIT of their own: token_variables()), p one-hot on it. The ids are written
  to a buffer first: read as variables there, the token rule's acceptance kernel compiled empty (docs/tests.md)."""
  block = Tensor.empty(1, len(ids), dtype=dtypes.int32).assign(token_tensor(ids))
  return target_verify(target, block, start_pos, None, key, nonce, warping, one_hot=True, **static)

def padded(logits:Tensor) -> Tensor:
  """logits (N, V) -> (N, vocab_width(V)), the added tokens impossible (logit -inf: probability 0 under every warp), as
  the lm_head's rows are padded: tinygrad runs a round's passes over a multiple of 64 columns much faster."""
  return logits.pad(((0, 0), (0, vocab_width(logits.shape[-1]) - logits.shape[-1])), value=float("-inf"))

# ***** 3. the drafters (step 1) and the verifier (steps 2 and 3) *****

class Drafter(Protocol):
  """Step 1 for the loop: a draft model, prompt lookup or none (the baseline), so that the loop never asks which."""
  kind: str                                        # "model", "ngram" or "" (none), for the statistics
  one_hot: bool                                    # propose() returns p = None: one-hot on the block
  model: GPT2|None                                 # the draft model, if any: a round's cost depends on it
  def reset(self, tokens:list[int]) -> None: ...   # a new sequence; the last token, x_n, is not consumed yet
  def propose(self, tokens:list[int], K:int, nonce:int) -> tuple[Tensor|list[int], Tensor|None]:
    """The block [x_n, x~_1..x~_k], k <= K: (1, k+1) on the device (a model's), or the ids where the host has them;
    and p (k, V); None: p is one-hot on the block."""
  def warm(self, K:int) -> bool: ...               # its compiled steps for K are warm (warm())

class ModelDraft:
  """A draft GPT-2: K steps of x~_t ~ p in one JIT call (propose()), from the random stream `nonce`. Its KV cache rolls
  back by position: it holds the sequence up to what it last fed, and the round kept a prefix of that."""
  kind = "model"
  def __init__(self, model:GPT2, sampling:Sampling, key:Tensor):
    self.model, self.key, self.static = model, key, sampling.static
    self.warping, self.one_hot = sampling.tensors(model.cfg.vocab_size), sampling.static["greedy"]
  def reset(self, tokens:list[int]):
    self.model.prefill(tokens[:-1])
    self.fed = len(tokens) - 1
  def propose(self, tokens:list[int], K:int, nonce:int) -> tuple[Tensor, Tensor|None]:
    start = min(self.fed, len(tokens) - 1)   # its cache is valid up to here: x_n, or x~_K and the bonus, are new to it
    self.fed = len(tokens) + K - 1           # it feeds x_n, x~_1..x~_K-1
    positions, nonce = bind(self.model.positions, start), stream(nonce, self.static["greedy"])
    return call(self.step(len(tokens) - start, K), self.model, positions, self.key, nonce, self.warping,
                *token_variables(tokens[start:]))
  def step(self, w:int, K:int):  # a pass over the w unseen tokens (the last one's logits), then K - 1 of one token
    return self.model.jit(propose, w, passes=(w, 1), K=K, **self.static)
  def warm(self, K:int) -> bool: return all(warm(self.step(w, K)) for w in (1, 2))

@dataclass(frozen=True)
class PromptLookup:
  """A draft without a model (prompt lookup): find the latest earlier occurrence of the context's last n tokens (n from
  ngram_max down to ngram_min) and propose the K tokens that followed it. Its distribution is one-hot on the
  proposal."""
  ngram_max: int = 3
  ngram_min: int = 1
  kind, one_hot, model = "ngram", True, None
  def __post_init__(self):
    if not 1 <= self.ngram_min <= self.ngram_max:
      raise ValueError(f"need 1 <= ngram-min <= ngram-max, got {self.ngram_min}, {self.ngram_max}")
  def reset(self, tokens:list[int]): pass
  def warm(self, K:int) -> bool: return True
  def propose(self, tokens:list[int], K:int, nonce:int) -> tuple[list[int], None]:
    """The block [x_n, lookup(tokens, K)]: k = K tokens or, without a match, none (the round is a target step)."""
    return tokens[-1:] + self.lookup(tokens, K), None
  def lookup(self, tokens:list[int], K:int) -> list[int]:
    """K tokens, or none when the context's last ngram_min tokens never occurred before. A match close to the end runs
    into the proposal itself: copying on from it continues the repetition (period = distance to the match)."""
    for n in range(min(self.ngram_max, len(tokens) - 1), self.ngram_min - 1, -1):
      suffix = tokens[-n:]
      for start in range(len(tokens) - n - 1, -1, -1):               # most recent first, never the suffix itself
        if tokens[start:start + n] == suffix:
          return [tokens[start + n + i % (len(tokens) - start - n)] for i in range(K)]
    return []

class NoDraft:
  """The baseline's drafter: it proposes nothing, so every round is one target step, x_n+1 ~ q (K 0)."""
  kind, one_hot, model = "", True, None
  def reset(self, tokens:list[int]): pass
  def warm(self, K:int) -> bool: return True
  def propose(self, tokens:list[int], K:int, nonce:int) -> tuple[list[int], None]: return tokens[-1:], None

class Verifier:
  """Steps 2 and 3: the target's pass over the block, then verify() by the rule: one JIT call per width
  (target_verify(); target_verify_ids() for the host's ids); a one-hot p (prompt lookup, a greedy draft) is built
  inside the same call."""
  def __init__(self, target:GPT2, sampling:Sampling, key:Tensor, rule:str):
    self.target, self.key, self.warping, self.rule = target, key, sampling.tensors(target.cfg.vocab_size), rule
    self.static = {**sampling.static, "rule": rule}
  def __call__(self, block:Tensor|list[int], p:Tensor|None, start_pos:int, nonce:int) -> Tensor:
    positions, nonce = bind(self.target.positions, start_pos), stream(nonce, self.static["greedy"])
    if isinstance(block, list):   # the host's ids (prompt lookup, none): bound variables, without a JIT of their own
      return call(self.step(len(block), True, ids=True), self.target, positions, self.key, nonce, self.warping,
                  *token_variables(block))
    return call(self.step(block.shape[1], p is None), self.target, block, positions, p, self.key, nonce, self.warping)
  def step(self, T:int, one_hot:bool, ids:bool=False):
    if ids: return self.target.jit(target_verify_ids, T, **self.static)
    return self.target.jit(target_verify, T, one_hot=one_hot, **self.static)
  def warm(self, K:int, one_hot:bool, ids:bool=False) -> bool:  # the host's ids: some rounds propose none (lookup)
    return all(warm(self.step(k + 1, one_hot, ids)) for k in ((0, K) if ids else (K,)))

# ***** 4. the device primitives: argmax, a top-k/top-p threshold, multinomial sampling, random draws *****
# A port writes these as its framework's argmax, sort-and-cumsum (or top-k) threshold and multinomial draw. Here each is
# written in the form tinygrad compiles to few, parallel kernels on every backend, which its own forms are not
# (each function says why), and exact: the same token a port's would give, or one drawn from the same distribution.

def best(logits:Tensor) -> Tensor:
  """(..., 1) each row's argmax, the first of equal maxima (a port: argmax): greedy's token and sample()'s race. One
  max over 64-bit keys, a logit's order in the high half and its reversed index in the low: tinygrad's argmax is two
  reductions."""
  bits = logits.float().bitcast(dtypes.int32)
  order = (bits < 0).where(-(bits & 0x7fffffff), bits)   # sign and magnitude as a signed int: ordered as the floats
  last = logits.shape[-1] - 1
  # unsigned, so that the max starts from 0 (tinygrad writes int64's minimum as a literal that clang warns about)
  high = (order.cast(dtypes.int64) + 2**31).cast(dtypes.uint64) * 2**32
  keys = high + (last - Tensor.arange(last + 1, dtype=dtypes.uint64))
  return last - (keys.max(-1, keepdim=True) & 0xffffffff).cast(dtypes.int32)

def keep_largest(probs:Tensor, weight:Tensor, enough:Tensor) -> Tensor:
  """Mask (N, V) of the probabilities >= the largest threshold t for which the weight of the probabilities >= t is at
  least enough, per row: top-k counts them, top-p sums their mass (a port: the k-th largest value; the sorted
  probabilities' cumulative sum reaching top_p). No sort: a search over the float32 bit patterns,
  which order non-negative floats, testing 3 thresholds a step, so that t is exact after 15 steps. Integer weights:
  pocl sums floats one at a time, integers in vectors."""
  bits = probs.float().bitcast(dtypes.int32).contiguous()
  ends = Tensor.arange(2, dtype=dtypes.int32)                               # made on the device: no copy from the host
  # lo and hi in one tensor, one kernel updating both: [0, the largest] (no threshold above it has any weight),
  # materialized so that every step is the same kernels
  lohi = (ends * bits.max(-1, keepdim=True)).contiguous()
  for _ in range(15):                                                       # 4 ways a step: 2 bits of 30 (probs <= 1.0)
    lo, hi = lohi[:, :1], lohi[:, 1:]                                       # enough at lo, nothing above hi
    step = (hi - lo) // 4 + 1                                               # lo + 3 step <= hi + 3: no overflow
    mids = lo + step * Tensor.arange(1, 4, dtype=dtypes.int32)              # (N, 3), ascending
    above = (bits.unsqueeze(1) >= mids.unsqueeze(-1)).where(weight.unsqueeze(1), 0)   # (N, 3, V)
    ok = (above.sum(-1) >= enough) & (mids <= hi)                           # a prefix of trues: the weight is monotone
    passed = ok.cast(dtypes.int32).sum(-1, keepdim=True)
    # [lo + passed step, lo + (passed + 1) step - 1]
    lohi = (lo + (passed + ends) * step - ends).minimum(hi)
  return (bits >= lohi[:, :1]).float()

BLOCK = 64  # sample() draws a block of this many tokens, then a token of it

def uniforms_per_draw(V:int) -> int:
  """The uniforms sample() takes for one row of V probabilities: one per block, and one per token of a block."""
  return -(-V // BLOCK) + BLOCK

def sample(probs:Tensor, u:Tensor) -> Tensor:
  """One token per row, distributed as probs (a port: multinomial sampling, torch.multinomial or
  jax.random.categorical), from u ~ U(0,1) (rows, uniforms_per_draw(V)): two exponential races,
  argmax w/(-log u) (Gumbel-max with one log), first of the blocks by their mass, then of the chosen block's tokens by
  their probability, so P(block) P(token | block) = probs; zero-probability tokens never. A race over every token
  would draw and take the log of V uniforms a row, a draw's main cost on a CPU. Materialized: a kernel indexing by it
  would redo the races."""
  *rows, V = probs.shape
  B = -(-V // BLOCK)                                                              # blocks, the last padded with zeros
  blocks = probs.reshape(-1, V).pad(((0, 0), (0, B * BLOCK - V))).reshape(-1, B, BLOCK)
  u = u.reshape(blocks.shape[0], -1)
  # (N, B), materialized: fused into the race below, a GPU would sum every block and take every log on one thread
  keys = race(blocks.sum(-1), u[:, :B]).contiguous()
  block = best(keys).contiguous()                                                 # (N, 1), read by the second race
  chosen = (Tensor.arange(B) == block).unsqueeze(-1).where(blocks, 0).sum(1)     # (N, BLOCK): its probabilities
  return (block * BLOCK + best(race(chosen, u[:, B:]))).reshape(rows).contiguous()

def race(weights:Tensor, u:Tensor) -> Tensor:
  """An exponential race's keys, weight / E with E = -log u ~ Exp(1): the largest is each one's with probability
  weight / sum. No NaN whatever the device's log and NaN: E is at least 2^-126 (a log may round u near 1 to 0), and a
  zero weight gets -1, below every other key, where 0 / 0 would be a NaN that best() ranks first if its sign is +."""
  return (weights > 0).where(weights / (-u.log()).maximum(2**-126), -1)

def uniform(key:Tensor, nonce:int|UOp, *shape:int) -> Tensor:
  """U(0, 1) draws from stream `nonce` of the run's threefry key (a port: its framework's seeded uniform draws; a
  numbered stream per call, so that a run is reproduced from its seed)."""
  counter = Tensor(nonce).cast(dtypes.uint32).reshape(1).pad(((0, 1),))       # threefry's 64-bit counter: [nonce, 0]
  return unit_interval(Tensor.random_bits(key, counter, math.prod(shape))).reshape(*shape)

def unit_interval(bits:Tensor) -> Tensor:
  """uint32 random bits -> (i + 1/2) / 2^23, i their top 23 bits: each value exact in float32 and strictly inside (0, 1)
  (from 24 bits the last, (2^24 - 1/2) / 2^24, would round to 1.0)."""
  return ((bits >> 9).float() + 0.5) * 2**-23

# ***** 5. the plumbing: device inputs, warm-up, -K auto, statistics, checks *****

# a run numbers its random draws (one nonce per JIT call that draws) and passes the number as a bound variable: a new
# value reaches the compiled function without a host-to-device copy, and nothing recompiles
NONCE = UOp.variable("nonce", 0, 2**31 - 1)

@functools.lru_cache(maxsize=4096)
def bind(variable:UOp, value:int) -> UOp:
  """variable.bind(value), kept for the next bind of this value (a token, a position again): tinygrad builds three
  UOps for a bind, on a CPU a good part of a round's time outside the kernels."""
  return variable.bind(value)

def stream(nonce:int, greedy:bool) -> UOp:
  """The random stream `nonce`, bound; greedy draws nothing, so its rounds all pass stream 0."""
  return bind(NONCE, 0 if greedy else nonce)

def seed_key(seed:int) -> Tensor:
  return constant("key", seed & 0xffffffff, seed >> 32 & 0xffffffff, dtype=dtypes.uint32)

def constant(role:str, *values, dtype) -> Tensor:
  """A run's values (its key, the sampling's) on the device: a later run with the same values gets the same Tensor, and
  the compiled steps, called again on the same Tensors, neither copy nor gather their inputs anew (docs/engine.md)."""
  return _constant(role, values, dtype, Device.DEFAULT)

@functools.lru_cache(maxsize=64)   # by role too: a step given one Tensor twice (top-p equal to temperature) fails
def _constant(role:str, values:tuple, dtype, device:str) -> Tensor: return Tensor(list(values), device, dtype).realize()

def width(block:Tensor|list[int]) -> int:
  """The tokens in a block, on the device (1, w) or the host's ids."""
  return len(block) if isinstance(block, list) else block.shape[1]

def token_variables(tokens:list[int]) -> list[UOp]:
  """Token ids as bound variables: a new value reaches a compiled step without a copy, and nothing recompiles."""
  return [bind(token_variable(i), t) for i, t in enumerate(tokens)]

@functools.cache
def token_variable(i:int) -> UOp: return UOp.variable(f"token{i}", 0, 2**31 - 1)   # made once: binding is cheaper

def token_tensor(ids:tuple[UOp, ...]) -> Tensor:  # (1, w) int32, computed inside the kernels that read it
  return Tensor.stack(*map(Tensor, ids)).cast(dtypes.int32).reshape(1, len(ids))

_calls: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
def call(step, *args):
  """A compiled step's call, counted for warm()."""
  _calls[step] = _calls.get(step, 0) + 1
  return step(*args)

def warm(step) -> bool:
  """Whether a compiled step's calls are now replays: a TinyJit runs its function plainly, captures it on its second
  call and links its kernels on the first replay, so from the fourth call on nothing compiles."""
  return _calls.get(step, 0) >= 3

def prepare(drafter:Drafter, verifier:Verifier, K:int|str, token:int, stats:Stats) -> AutoLookahead|None:
  """Before the prompt: every step of the run warm, the draft's costs, t_target where the target alone runs (the seconds
  in time_warmup); -K auto's estimate."""
  t0 = time.perf_counter()
  lookaheads = LOOKAHEADS if K == "auto" else (K,)
  warm_up(drafter, verifier, lookaheads, token)
  # the target's one-token step, timed where a run has it: the baseline's, prompt lookup's rounds without a match, an
  # earlier run of the target alone in this process; a draft model's rounds never run it, and a first run would compile
  # it only to time it
  if drafter.model is None or verifier.target in _decode_seconds: stats.t_target = time_target_decode(verifier, token)
  stats.draft_seconds = {k: time_draft_step(drafter, k, token) for k in lookaheads if k}
  stats.time_warmup = time.perf_counter() - t0
  return auto_lookahead(drafter, verifier) if K == "auto" else None

def warm_up(drafter:Drafter, verifier:Verifier, lookaheads, token:int) -> None:
  """Run the compiled steps of every K until each is warm, before the prefill, at positions 0 and 1, so that what
  warm-up writes into the caches is overwritten before anything reads it: a round after one new token and after two (a
  draft model's catch-up after a full accept; prompt lookup without and with a match)."""
  for k in lookaheads:
    for _ in range(3):
      if drafter.warm(k) and verifier.warm(k, drafter.one_hot, ids=drafter.model is None): break
      for context in ([token], [token, token]): warm_up_round(drafter, verifier, context, k)

def warm_up_round(drafter:Drafter, verifier:Verifier, context:list[int], k:int) -> Tensor:
  """A round over context ([token] or [token, token]) from position 0, the draft having consumed nothing."""
  drafter.reset(context[:1])
  return verifier(*drafter.propose(context, k, 0), len(context) - 1, 1)

_decode_seconds: weakref.WeakKeyDictionary[GPT2, float] = weakref.WeakKeyDictionary()
def time_target_decode(verifier:Verifier, token:int) -> float:
  """Seconds of a round of the target alone (its one-token pass and draw, as the baseline pays them), measured once per
  target at position 0 before the prefill rewrites it: the best of 3 once the step is warm."""
  decode = lambda: verifier([token], None, 0, 1)
  if verifier.target not in _decode_seconds:
    while not verifier.warm(0, one_hot=True, ids=True): decode()
    _decode_seconds[verifier.target] = best_seconds(decode, 3)
  return _decode_seconds[verifier.target]

def time_draft_step(drafter:Drafter, K:int, token:int) -> float:
  """Seconds of a drafted token: a proposal of K (a model's steps and draws, or a lookup) timed alone at position 1
  before the prefill rewrites it, the best of 3, over K. The rounds do not time their phases: a synchronization between
  them would cost every round (docs/measurements.md)."""
  drafter.reset([token])
  return best_seconds(lambda: drafter.propose([token, token], K, 0)) / K

LOOKAHEADS = (1, 2, 4, 8)  # the K that -K auto chooses from: each compiled once, during warm-up

class AutoLookahead:
  """-K auto: before each round the K of LOOKAHEADS with the most tokens per second: the tokens a round with K keeps
  in expectation over the median seconds of its last `cost_window` rounds (the median ignores a stalled round). Where
  whether the i-th draft is kept does not depend on K (greedy, or the token rule), every round informs every K: the
  expectation is 1 + sum over j <= K of the product of the rates a_i (i <= j) at which the last `kept_window` rounds
  that reached draft i kept it. Under block verification at T > 0 it does depend on K: the mean tokens of the last
  `kept_window` rounds with that K, raised by `optimism` standard errors (this estimate only), so that a K judged on
  few rounds gets tried again.
  Every K first runs 3 rounds, and runs again once the rounds since its last took `explore` times its own round's
  seconds (at most 1/explore of the time each), so that all K are judged on recent rounds. The defaults were chosen on
  simulated rounds (tests/test_spec.py): within 5% of the best fixed K there."""
  def __init__(self, by_position:bool=False, kept_window:int=256, cost_window:int=32, explore:int=96,
               optimism:float=1.0):
    self.kept = {K: collections.deque(maxlen=kept_window) for K in LOOKAHEADS}
    self.cost = {K: collections.deque(maxlen=cost_window) for K in LOOKAHEADS}
    self.passed = [collections.deque(maxlen=kept_window) for _ in range(max(LOOKAHEADS))]  # draft i+1 kept, if reached
    self.last_run, self.clock, self.explore = dict.fromkeys(LOOKAHEADS, 0.0), 0.0, explore
    self.by_position, self.optimism = by_position, optimism
  def expected_tokens(self, K:int, optimism:float=0.0) -> float:
    if not self.by_position:
      kept = self.kept[K]
      return statistics.fmean(kept) + optimism * statistics.stdev(kept) / math.sqrt(len(kept))
    rates = [statistics.fmean(d) if d else 0.0 for d in self.passed[:K]]   # a draft never reached: none kept yet
    return 1 + sum(math.prod(rates[:j + 1]) for j in range(K))
  def tokens_per_second(self, K:int, optimism:float=0.0) -> float:
    return self.expected_tokens(K, optimism) / statistics.median(self.cost[K])
  def choose(self) -> int:
    if any(len(self.kept[K]) < 3 for K in LOOKAHEADS): return min(LOOKAHEADS, key=lambda K: len(self.kept[K]))
    due = [K for K in LOOKAHEADS if self.clock - self.last_run[K] >= self.explore * statistics.median(self.cost[K])]
    if due: return min(due, key=self.last_run.get)                                # the longest unseen first
    return max(LOOKAHEADS, key=lambda K: self.tokens_per_second(K, self.optimism))
  def update(self, K:int, tokens:int, seconds:float, drafted:int|None=None):
    """A round with lookahead K kept `tokens` (its drafts kept, and one more) of `drafted` drafts (K unless prompt
    lookup found fewer) in `seconds`."""
    self.kept[K].append(tokens); self.cost[K].append(seconds)
    for i in range(min(tokens, K if drafted is None else drafted)): self.passed[i].append(i < tokens - 1)
    self.clock += seconds
    self.last_run[K] = self.clock

# -K auto's estimate per target (weakly: its entries go with it), then per draft model and choices
_auto: weakref.WeakKeyDictionary[GPT2, dict] = weakref.WeakKeyDictionary()
def auto_lookahead(drafter:Drafter, verifier:Verifier) -> AutoLookahead:
  """The -K auto estimate for this target, draft and structural choices, kept from run to run: a later run starts
  from what the earlier ones measured instead of spending its first rounds trying every K."""
  draft = None if drafter.model is None else weakref.ref(drafter.model)
  key = (draft, *sorted(verifier.static.items()))
  by_position = verifier.static["greedy"] or verifier.static["rule"] == "token"
  return _auto.setdefault(verifier.target, {}).setdefault(key, AutoLookahead(by_position))

@dataclass
class Stats:
  new_tokens: int = 0
  rounds: int = 0                 # target passes
  drafted: int = 0                # = draft passes for a model draft: each pass proposes one token
  accepted: int = 0
  host_syncs: int = 0
  time_total: float = 0.0         # the rounds, from the end of the prefill
  t_target: float = 0.0           # a round of the target alone (pass and draw), where it ran (prepare()); else 0
  t_draft: float = 0.0            # a drafted token's cost (draft_seconds), the mean over the rounds' lookaheads
  draft_seconds: dict = field(default_factory=dict)  # K -> a drafted token's seconds in a proposal of K, timed alone
  time_warmup: float = 0.0        # JIT capture and cost measurements, not in time_total
  K: int | str = 0                # the lookahead asked for: a number, or "auto"; 0 for the baseline
  draft: str = ""                 # "model", "ngram", or "" for the baseline
  verification: str = ""          # "block" or "token" (RULES), "" for the baseline
  lookaheads: dict = field(default_factory=dict)  # rounds by the number of tokens drafted in them
  sources: dict = field(default_factory=dict)     # emitted tokens by source: accepted / resampled / bonus / target
  draft_passes = property(lambda self: self.drafted if self.draft == "model" else 0)
  acceptance_rate = property(lambda self: self.accepted / self.drafted if self.drafted else 0.0)     # alpha
  tokens_per_round = property(lambda self: self.new_tokens / self.rounds if self.rounds else 0.0)
  mean_lookahead = property(lambda self: self.drafted / self.rounds if self.rounds else 0.0)
  r_prime = property(lambda self: self.tokens_per_round / (self.mean_lookahead + 1))                # the seed's r'
  tokens_per_s = property(lambda self: self.new_tokens / self.time_total if self.time_total else 0.0)
  @property
  def theoretical_speedup(self) -> float|None:  # r'(K+1) t_target / (t_draft K + t_target); None without t_target
    if not self.draft: return 1.0
    if not self.t_target: return None
    K = self.mean_lookahead
    return self.r_prime * (K + 1) * self.t_target / (self.t_draft * K + self.t_target)
  def add_round(self, drafted:int, accepted:int):
    self.rounds += 1; self.drafted += drafted; self.accepted += accepted
    self.lookaheads[drafted] = self.lookaheads.get(drafted, 0) + 1
  def finish(self, start:float, new_tokens:int) -> Stats:
    self.time_total, self.new_tokens = time.perf_counter() - start, new_tokens
    # prompt lookup drafts K or nothing; a model, the K it was asked for
    spent = sum(n * k * self.draft_seconds.get(k, 0.0) for k, n in self.lookaheads.items())
    if self.drafted: self.t_draft = spent / self.drafted
    return self
  def as_dict(self) -> dict:
    props = ("draft_passes", "acceptance_rate", "tokens_per_round", "mean_lookahead", "r_prime", "tokens_per_s",
             "theoretical_speedup")
    return {**asdict(self), **{k: getattr(self, k) for k in props}}

def check(models_:list[GPT2], prompt_tokens:list[int], max_new_tokens:int, K:int|str, verification:str="block",
          seed:int=0):
  """Bad requests fail here, before any work (with no models yet: only K, max_new_tokens, the rule and the seed)."""
  if not 0 <= seed < 2**64: raise ValueError(f"seed must be in [0, 2**64), got {seed}")   # the threefry key's 64 bits
  if K != "auto" and not (isinstance(K, int) and K >= 1):
    raise ValueError(f"K (lookahead) must be >= 1 or 'auto', got {K}")
  if verification not in RULES: raise ValueError(f"verification must be {' or '.join(RULES)}, got {verification!r}")
  if max_new_tokens < 1: raise ValueError(f"max new tokens must be >= 1, got {max_new_tokens}")
  vocabs = {m.cfg.vocab_size for m in models_}
  if len(vocabs) > 1:
    raise ValueError(f"draft and target vocabularies differ ({' vs '.join(str(m.cfg.vocab_size) for m in models_)})")
  if vocabs and (outside := [t for t in prompt_tokens if not 0 <= t < min(vocabs)]):   # no embedding row for them
    raise ValueError(f"prompt token {outside[0]} is outside the models' vocabulary of {min(vocabs)} "
                     "(another tokenizer?)")
  context, K = min((m.cfg.n_positions for m in models_), default=None), max(LOOKAHEADS) if K == "auto" else K
  if context is not None and len(prompt_tokens) + max_new_tokens + K > context:
    raise ValueError(f"prompt ({len(prompt_tokens)} tokens) + max new tokens ({max_new_tokens}) + K ({K}) exceeds the "
                     f"context of {context}")

# ***** 6. the command line *****

class Printer:
  """Streams decoded text to stdout; on a terminal, draft-accepted tokens in one colour, target-produced ones in
  another."""
  COLORS = {"accepted": "\033[32m", "resampled": "\033[33m", "bonus": "\033[36m", "target": ""}
  def __init__(self, enc, color:bool, header:str):  # the header waits for the first token: warm-up may print notices
    self.enc, self.color, self.header = enc, color, header
    self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
  def __call__(self, event:dict):
    if self.header: sys.stdout.write(self.header); self.header = ""
    text = self.decoder.decode(self.enc.decode_single_token_bytes(event["id"]))
    print(f"{self.COLORS[event['source']]}{text}\033[0m" if self.color and text else text, end="", flush=True)

def summary(stats:Stats) -> str:
  s = (f"{stats.new_tokens} tokens in {stats.time_total:.2f} s ({stats.tokens_per_s:.1f} tokens/s), "
       f"{stats.rounds} target passes")
  if not stats.K: return s
  drafts = f"{stats.draft_passes} draft passes" if stats.draft == "model" else "prompt lookup, no draft model"
  shown = "" if stats.K != "auto" and stats.draft == "model" else \
    " (rounds by tokens drafted: " + ", ".join(f"{k}: {n}" for k, n in sorted(stats.lookaheads.items())) + ")"
  costs = (f"t_target {stats.t_target*1e3:.1f} ms (timed alone)\n"
           f"  theoretical speedup r'(K+1)t_target/(K t_draft + t_target) = {stats.theoretical_speedup:.2f}x"
           if stats.t_target else "t_target: the target alone did not run (--compare runs it)")
  return s + (f", {drafts}\n"
    f"  K={stats.K}{shown}, {stats.verification} verification: accepted {stats.accepted}/{stats.drafted} drafted "
    f"(alpha {stats.acceptance_rate:.3f}), {stats.tokens_per_round:.2f} tokens/round, r' {stats.r_prime:.3f}\n"
    f"  t_draft {stats.t_draft*1e3:.1f} ms a drafted token, {costs}")

class ArgumentParser(argparse.ArgumentParser):
  # one line and exit 2, as for all bad input
  def error(self, message): self.exit(2, f"{self.prog}: error: {message}\n")

def lookahead(text:str) -> int|str:
  if text == "auto": return text
  try: return int(text)
  except ValueError: raise argparse.ArgumentTypeError(f"invalid lookahead {text!r}: a number or 'auto'") from None

def parse_args(argv=None):
  ap = ArgumentParser(prog="spec.py", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    description="Exact speculative sampling with two GPT-2 models: the draft proposes K tokens, the target verifies "
                "them in one pass, and modified rejection sampling keeps the target's output distribution exactly.")
  src = ap.add_mutually_exclusive_group()
  src.add_argument("--prompt", default="", help="text to continue; empty means unconditional generation after "
                   "<|endoftext|>")
  src.add_argument("--prompt-file", help="read the prompt from this file instead")
  ap.add_argument("--target", default="gpt2-xl", help="target model: gpt2, gpt2-medium, gpt2-large, gpt2-xl or a local "
                  "Hugging Face checkpoint directory (config.json + model.safetensors)")
  ap.add_argument("--draft", default="gpt2", help="draft model, named as --target; or 'ngram': no draft model, propose "
                  "what followed the latest earlier occurrence of the context's last tokens (prompt lookup)")
  ap.add_argument("--ngram-max", type=int, default=3, help="--draft ngram: the longest suffix to look up")
  ap.add_argument("--ngram-min", type=int, default=1, help="--draft ngram: the shortest suffix to look up")
  ap.add_argument("-K", "--lookahead", type=lookahead, default=2, help="tokens the draft proposes per round; 'auto' "
                  f"chooses from {', '.join(map(str, LOOKAHEADS))} each round: the most tokens per second in the "
                  "recent rounds run with each K")
  ap.add_argument("--verify", choices=list(RULES), default="block", help="block: judge the drafted block as a whole "
                  "(Sun et al. 2025), never fewer tokens per round in expectation; token: token by token (Chen et al. "
                  "2023). Both keep the target's distribution exactly")
  ap.add_argument("-n", "--max-new-tokens", type=int, default=256, help="new tokens to generate")
  ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 is greedy (the target's "
                  "exact greedy output)")
  ap.add_argument("--top-k", type=int, default=0, help="sample only from the k most likely tokens; 0 keeps all")
  ap.add_argument("--top-p", type=float, default=1.0, help="sample only from the smallest set of tokens with this much "
                  "probability")
  ap.add_argument("--seed", type=int, default=0, help="random seed, 0 to 2**64 - 1; the same seed reproduces a run")
  ap.add_argument("--ignore-eos", action="store_true", help="keep generating past <|endoftext|>")
  ap.add_argument("--compare", action="store_true", help="run the target alone first, then speculative sampling, and "
                  "compare")
  ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
  ap.add_argument("--trace", metavar="FILE", help="write one JSON line per emitted token (id, text, source, index, q, "
                  "p)")
  ap.add_argument("--dtype", choices=["auto", *models.DTYPES], default="auto", help="precision of the target's "
                  "weights, activations and KV cache (logits and sampling are float32); auto: float16 where a pass in "
                  "half measures clearly faster on the device (GPUs, a CPU with F16C: half the bytes; timed once per "
                  "machine), else float32")
  ap.add_argument("--draft-dtype", choices=["auto", *models.DTYPES], default="auto", help="precision of the draft "
                  "model, which moves only how often its tokens are accepted, never the output's distribution; auto: "
                  "float16 where half measures faster (as --dtype auto), else --dtype's")
  ap.add_argument("--plain", action="store_true", help="the GPT-2 port alone, on tinygrad's own kernels and executor: "
                  "no engine (custom kernels, measured choices, stored steps); --dtype auto is float32 there")
  ap.add_argument("--search", type=int, default=0, metavar="N", help="the engine also searches the draft's and "
                  "target's step kernels by tinygrad's BEAM search of width N, once per machine (tinygrad caches the "
                  "result); 0: tinygrad's default kernels")
  ap.add_argument("--dummy-weights", action="store_true", help="random weights of the named sizes, no download (for "
                  "benchmarks)")
  ap.add_argument("--self-check", action="store_true", help="check exactness on this device with tiny random models "
                  "made on the spot (whole rounds enumerated, float32's edge cases, greedy identity, a chi-square "
                  "test), with the engine and with --plain, in --dtype (auto: float32); exit 1 on any failure")
  return ap.parse_args(argv)

def read_prompt(path:str) -> str:
  """The prompt file as UTF-8 text, whatever the locale; anything else is an error that names the file."""
  with open(path, "rb") as f: data = f.read()
  try: return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"prompt file {path} is not UTF-8 text (byte {e.start}: {e.reason})") from None

def main(argv=None) -> int:
  args, trace = parse_args(argv), None
  try:
    models.check_device()
    if args.self_check:   # the porter's check (self_check.py)
      import self_check
      return 1 if self_check.run("float32" if args.dtype == "auto" else args.dtype) else 0
    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    if args.search < 0: raise ValueError(f"search must be >= 0, got {args.search}")
    if args.plain and args.search: raise ValueError("--search is the engine's kernel search: drop --plain to use it")
    check([], [], args.max_new_tokens, args.lookahead, seed=args.seed)
    prompt = read_prompt(args.prompt_file) if args.prompt_file else args.prompt
    if args.trace:   # opened before the models load, so that a bad path fails at once; appending, so that a start
      new_trace, trace = not os.path.exists(args.trace), open(args.trace, "a")   # that fails later leaves it as it was
    draft = PromptLookup(args.ngram_max, args.ngram_min) if args.draft == "ngram" else None
    enc = models.tokenizer()
    prompt_tokens = enc.encode(prompt, allowed_special={"<|endoftext|>"})
    load = lambda name, dtype: models.load(name, dtype, args.dummy_weights, args.search, args.plain)
    target = load(args.target, args.dtype)
    if args.draft != "ngram": draft = load(args.draft, models.draft_dtype(args.draft_dtype, target.dtype, args.plain))
    check([target] + ([draft] if isinstance(draft, GPT2) else []), prompt_tokens or [EOT], args.max_new_tokens,
          args.lookahead)
  except (ValueError, OSError, models.CheckpointError) as e:
    if trace:
      trace.close()
      if new_trace: os.remove(args.trace)
    print(f"spec.py: error: {e}", file=sys.stderr)
    return 2
  if trace and trace.seekable(): trace.truncate(0)   # the run starts: it replaces what the file held (not a pipe's)
  eos = None if args.ignore_eos else EOT
  common = dict(max_new_tokens=args.max_new_tokens, sampling=sampling, seed=args.seed, eos=eos)
  stream = not args.json and trace is None
  color = stream and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
  def on_token(event):
    if trace: trace.write(json.dumps({**event, "text": enc.decode([event["id"]])}) + "\n")
    if stream: printer(event)
  if args.dummy_weights:
    print("WARNING: --dummy-weights: random weights, the text is noise; only the timings mean anything",
          file=sys.stderr)
  results = {}
  for name in (["baseline"] if args.compare else []) + ["speculative"]:
    printer = Printer(enc, color, f"{'-'*20} {name} {'-'*20}\n{prompt}")
    if name == "baseline": results[name] = autoregressive_generate(target, prompt_tokens, **common, on_token=on_token)
    else: results[name] = speculative_generate(target, draft, prompt_tokens, args.lookahead, **common,
                                               on_token=on_token, verification=args.verify)
    if stream: print(f"\n{'-'*20} {name}: {summary(results[name][1])}\n")
  if trace: trace.close()
  tokens, stats = results["speculative"]
  if args.json:
    report = lambda toks, st: dict(tokens=toks, text=enc.decode(toks), stats=st.as_dict())
    precision = dict(dtype=models.dtype_name(target.dtype),
                   draft_dtype=models.dtype_name(draft.dtype) if isinstance(draft, GPT2) else None)
    obj = dict(prompt_tokens=prompt_tokens, **report(tokens, stats), dummy_weights=args.dummy_weights, plain=args.plain,
               **precision)
    if args.compare: obj["baseline"] = report(*results["baseline"])
    print(json.dumps(obj))
  elif args.compare:
    base_tokens, base = results["baseline"]
    speedup = base.time_total / stats.time_total * stats.new_tokens / max(base.new_tokens, 1)
    print(f"speedup {speedup:.2f}x measured (tokens/s {stats.tokens_per_s:.1f} vs {base.tokens_per_s:.1f}), "
          f"{stats.theoretical_speedup:.2f}x theoretical")
    if sampling.temperature == 0: print(f"greedy outputs identical: {tokens == base_tokens}")
  return 0

if __name__ == "__main__":
  try: sys.exit(main())
  except BrokenPipeError:  # the reader went away (spec.py | head): stop without a traceback, as Python's docs advise
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # the interpreter's last flush would raise again
    sys.exit(1)
  except KeyboardInterrupt: sys.exit(130)  # Ctrl-C: the shell's status for an interrupt, without a traceback

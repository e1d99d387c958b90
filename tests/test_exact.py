"""Exactness without models: the accept/resample rule's output distribution by exact enumeration, in float64."""
import itertools
import numpy as np
import pytest
from tinygrad import Tensor, dtypes
import spec

def rule_distribution(p:np.ndarray, q:np.ndarray, acceptance=spec.acceptance, residual=spec.residual) -> np.ndarray:
  """P(emitted = x) for one position: draft x~ ~ p, kept with the sampler's acceptance probability, else one draw
  from the sampler's residual: sum_x~ p(x~) [a(x~) 1{x = x~} + (1 - a(x~)) res(x)]."""
  V = len(p)
  P, Q = Tensor(np.tile(p, (V, 1)), dtype=dtypes.float64), Tensor(np.tile(q, (V, 1)), dtype=dtypes.float64)
  support = np.flatnonzero(p > 0)                   # the draft never proposes a token it gives probability 0
  a = acceptance(P, Q, Tensor(np.arange(V), dtype=dtypes.int32)).numpy()
  res = residual(Tensor(p[None], dtype=dtypes.float64), Tensor(q[None], dtype=dtypes.float64)).numpy()[0]
  out = np.zeros(V)
  for x in support: out[x] += p[x] * a[x]
  rejected = sum(p[x] * (1 - a[x]) for x in support)
  return out + (rejected * res if rejected > 0 else 0)

def cases():
  rng = np.random.default_rng(0)
  norm = lambda v: v / v.sum()
  for V in (2, 3, 5, 8):
    for _ in range(5): yield f"random-V{V}", norm(rng.random(V)), norm(rng.random(V))
    yield f"sparse-V{V}", norm(rng.random(V) * (rng.random(V) < 0.6) + np.eye(V)[0]), norm(rng.random(V) * (rng.random(V) < 0.6) + np.eye(V)[1])
  yield "disjoint", np.array([0.5, 0.5, 0, 0]), np.array([0, 0, 0.3, 0.7])
  yield "p=q", np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.1, 0.2, 0.3, 0.4])
  yield "one-hot-p", np.array([0, 1.0, 0, 0]), np.array([0.25, 0.25, 0.25, 0.25])
  yield "one-hot-q", np.array([0.25, 0.25, 0.25, 0.25]), np.array([0, 0, 1.0, 0])
  yield "one-hot-both", np.array([0, 1.0, 0]), np.array([0, 0, 1.0])

@pytest.mark.parametrize("name,p,q", list(cases()), ids=[c[0] for c in cases()])
def test_rule_recovers_target_distribution(name, p, q):
  np.testing.assert_allclose(rule_distribution(p, q), q, atol=1e-9)

def test_enumeration_detects_a_wrong_rule():
  p, q = np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.3, 0.5])
  assert np.abs(rule_distribution(p, q, residual=lambda p, q: q) - q).max() > 0.05                 # resample from q
  lenient = lambda p, q, x: (spec.acceptance(p, q, x) * 2).minimum(1)                              # r ~ U[0, 0.5]
  assert np.abs(rule_distribution(p, q, acceptance=lenient) - q).max() > 0.05

# ***** a whole round on toy conditional tables *****

def toy_model(V:int, seed:int, sharp:float):
  """A toy autoregressive model: its next-token table depends on the whole prefix (a hash of it)."""
  def dist(prefix:tuple) -> np.ndarray:
    rng = np.random.default_rng([seed, *prefix])
    return (z := np.exp(sharp * rng.standard_normal(V))) / z.sum()
  return dist

def round_distribution(p, q, K:int, V:int, prefix=(0,)) -> dict[tuple, float]:
  """Enumerate every draft path x~_1..x~_K: the distribution of the block a round emits, using the sampler's acceptance
  and residual, the bonus draw from q's (K+1)-th distribution when all K are kept."""
  out: dict[tuple, float] = {}
  for path in itertools.product(range(V), repeat=K):
    ctx = [prefix + path[:t] for t in range(K + 1)]
    P = np.stack([p(c) for c in ctx[:K]] + [np.zeros(V)])
    Q = np.stack([q(c) for c in ctx])
    prob_path = np.prod([P[t, x] for t, x in enumerate(path)])
    a = spec.acceptance(Tensor(P[:K], dtype=dtypes.float64), Tensor(Q[:K], dtype=dtypes.float64), Tensor(list(path), dtype=dtypes.int32)).numpy()
    res = spec.residual(Tensor(P, dtype=dtypes.float64), Tensor(Q, dtype=dtypes.float64)).numpy()
    kept = 1.0
    for n in range(K + 1):                      # n tokens kept, then the draw from row n (the bonus when n = K)
      stop = kept * (1 - a[n]) if n < K else kept
      for y in range(V): out[path[:n] + (y,)] = out.get(path[:n] + (y,), 0) + prob_path * stop * res[n, y]
      if n < K: kept *= a[n]
  return out

def toy_lookup(V:int):
  """A deterministic draft, as prompt lookup is: one-hot on a token that depends on the prefix."""
  return lambda prefix: np.eye(V)[hash(prefix) % V]

@pytest.mark.parametrize("K,V,draft", [(2, 3, "model"), (3, 3, "model"), (2, 4, "model"), (2, 3, "one-hot"), (3, 4, "one-hot")])
def test_round_emits_the_target_distribution(K, V, draft):
  p, q = toy_model(V, seed=1, sharp=1.0) if draft == "model" else toy_lookup(V), toy_model(V, seed=2, sharp=1.5)
  blocks, prefix = round_distribution(p, q, K, V), (0,)
  # extend every block to K+1 tokens with the target itself: the joint must be the target's joint
  joint = {}
  for block, prob in blocks.items():
    for tail in itertools.product(range(V), repeat=K + 1 - len(block)):
      seq = block + tail
      joint[seq] = joint.get(seq, 0) + prob * np.prod([q(prefix + seq[:i])[seq[i]] for i in range(len(block), K + 1)])
  for seq in itertools.product(range(V), repeat=K + 1):
    target = np.prod([q(prefix + seq[:i])[seq[i]] for i in range(K + 1)])
    assert abs(joint.get(seq, 0) - target) < 1e-9, (seq, joint.get(seq, 0), target)
  assert abs(sum(blocks.values()) - 1) < 1e-9

# ***** the device round itself: verify() on constructed cases *****

def run_verify(p:np.ndarray, q:np.ndarray, drafted:list[int], seed:int=0):
  block = Tensor([[0] + drafted], dtype=dtypes.int32)
  temperature, top_k, top_p = spec.Sampling(1.0).tensors(q.shape[1])
  # logits whose temperature-1 softmax is q (zeros -> -inf is fine for softmax)
  with np.errstate(divide="ignore"): q_logits = Tensor(np.log(q).astype(np.float32))
  out = spec.verify(q_logits, Tensor(p.astype(np.float32)), block, spec.seed_key(seed), 0,
                    temperature, top_k, top_p, **spec.Sampling(1.0).static).tolist()
  return int(out[0]), int(out[1])

def test_verify_keeps_all_when_draft_equals_target_and_draws_the_bonus_from_q_K_plus_1():
  K, V = 3, 5
  q = np.full((K + 1, V), 0.05); q[:, 1] = 0.8; q[K] = [0, 0, 0, 1.0, 0]   # the bonus row is one-hot on token 3
  for seed in range(5):
    assert run_verify(q[:K], q, [1, 1, 1], seed) == (K, 3)

def test_verify_rejects_a_token_the_target_never_emits_and_resamples_from_the_residual():
  p = np.array([[0.0, 1.0, 0, 0], [0.25] * 4])
  q = np.array([[0.5, 0.0, 0.5, 0.0], [0.25] * 4, [0.25] * 4])
  for seed in range(5):
    n, token = run_verify(p, q, [1, 2], seed)
    assert n == 0 and token in (0, 2)            # residual max(0, q - p) is supported on {0, 2}

def test_verify_lookup_is_verify_with_a_one_hot_draft():
  # the same random stream, so the same decisions: verify_lookup builds p = onehot(x~) from the block, nothing else
  rng, K, V = np.random.default_rng(3), 3, 6
  temperature, top_k, top_p = spec.Sampling(1.0).tensors(V)
  for seed in range(10):
    q = rng.random((K + 1, V)) ** 3
    drafted = [int(x) for x in rng.integers(0, V, K)]
    if seed % 2: q[0] = np.eye(V)[drafted[0]]                  # certain to be kept
    else: q[0, drafted[0]] = 0.0                               # certain to be rejected
    with np.errstate(divide="ignore"): q_logits = Tensor(np.log(q / q.sum(1, keepdims=True)).astype(np.float32))
    block = Tensor([[0] + drafted], dtype=dtypes.int32)
    args = (block, spec.seed_key(seed), 0, temperature, top_k, top_p)
    looked_up = spec.verify_lookup(q_logits, *args, **spec.Sampling(1.0).static).tolist()
    assert looked_up == spec.verify(q_logits, Tensor(np.eye(V, dtype=np.float32)[drafted]), *args, **spec.Sampling(1.0).static).tolist()
    assert (looked_up[0] == 0) == (seed % 2 == 0) and looked_up[4:4+K] == drafted

def test_greedy_verify_keeps_the_target_argmax_and_draws_nothing():
  # greedy rounds are compiled without random draws: keep x~_t while it is q_t's argmax, then emit the argmax of the
  # first row that disagrees (or of q_K+1); the same for every seed
  rng, K, V = np.random.default_rng(4), 4, 7
  temperature, top_k, top_p = spec.Sampling(0.0).tensors(V)
  for case in range(12):
    q_logits = rng.standard_normal((K + 1, V)).astype(np.float32)
    best = q_logits.argmax(1)
    agree = case % (K + 1)                                     # the first agree drafts are the argmax, the next is not
    drafted = [int(best[t]) if t < agree else int((best[t] + 1 + t) % V) for t in range(K)]
    p = np.eye(V, dtype=np.float32)[drafted]                   # a greedy draft is one-hot on its proposal
    outs = {tuple(spec.verify(Tensor(q_logits), Tensor(p), Tensor([[0] + drafted], dtype=dtypes.int32), spec.seed_key(seed),
                              seed, temperature, top_k, top_p, **spec.Sampling(0.0).static).tolist()[:2]) for seed in range(3)}
    assert outs == {(agree, int(best[agree]))}, (case, outs)

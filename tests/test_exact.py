"""Exactness without models: the accept/resample rule's output distribution by exact enumeration, in float64."""
import itertools
import numpy as np
import pytest
from tinygrad import Tensor, dtypes
import spec
from conftest import chi2_sf
import self_check
from self_check import probability, stop_probability

# the device's own acceptance, residual and verify(), in float64 (needs device support); all in the quick tier
pytestmark = [pytest.mark.backend, pytest.mark.quick]

def rule_distribution(p:np.ndarray, q:np.ndarray, acceptance=spec.acceptance, residual=spec.residual) -> np.ndarray:
  """P(emitted = x) for one position: draft x~ ~ p, kept with the sampler's acceptance probability, else one draw
  from the sampler's residual: sum_x~ p(x~) [a(x~) 1{x = x~} + (1 - a(x~)) res(x)]."""
  V = len(p)
  P, Q = Tensor(np.tile(p, (V, 1)), dtype=dtypes.float64), Tensor(np.tile(q, (V, 1)), dtype=dtypes.float64)
  support = np.flatnonzero(p > 0)                   # the draft never proposes a token it gives probability 0
  a = probability(*acceptance(P, Q, Tensor(np.arange(V), dtype=dtypes.int32)))
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
  lenient = lambda p, q, x: (lambda qx, px: (qx * 2, px))(*spec.acceptance(p, q, x))              # r ~ U[0, 0.5]
  assert np.abs(rule_distribution(p, q, acceptance=lenient) - q).max() > 0.05

def sampled_counts(probs:np.ndarray, n:int, seed:int) -> np.ndarray:
  """How often sample() draws each token in n rows of probs, with u from uniform() (the run's stream 0 of seed)."""
  rows = Tensor(np.tile(probs, (n, 1)).astype(np.float32))
  u = spec.uniform(spec.seed_key(seed), 0, n, spec.uniforms_per_draw(len(probs)))
  return np.bincount(spec.sample(rows, u).numpy(), minlength=len(probs))

@pytest.mark.parametrize("V, where", [(5, [0, 1, 2, 3]), (200, [130, 3, 127, 64])])   # one block; 4 (the last padded)
def test_sample_draws_each_token_with_its_probability(V, where):
  # the enumerations above price the draw from the residual exactly; this checks the draw itself, the race over blocks
  # and within one. 40000 rows, a fixed seed: chi-square goodness of fit p > 1e-3 (a correct sampler fails with
  # probability 1e-3), never a zero-probability token; the same counts reject probs squared and the two largest
  # swapped (power ~1: chi2 > 2000 expected, 1e-3 at 16)
  mass, n = np.array([0.5, 0.3, 0.15, 0.05]), 40000
  probs = np.zeros(V)
  probs[where] = mass
  counts = sampled_counts(probs, n, seed=7)
  assert counts.sum() == counts[where].sum() == n
  fit = lambda expected: chi2_sf(float(((counts[where] - n * expected) ** 2 / (n * expected)).sum()), 3)
  assert fit(mass) > 1e-3, counts[where]
  assert fit(mass ** 2 / (mass ** 2).sum()) < 1e-3 and fit(mass[[1, 0, 2, 3]]) < 1e-3

@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_best_is_the_first_argmax(dtype):
  # best() packs each logit's order and index into one 64-bit key; numpy's argmax is the reference: rows of every scale,
  # both signs, all-negative rows, ties (rounded values, a repeated maximum), -0 beside 0, -inf, the padded vocabulary
  rng = np.random.default_rng(3)
  logits = (rng.standard_normal((40, 50304)) * rng.uniform(1e-3, 1e3, (40, 1))).astype(dtype)
  logits[:8] = np.round(logits[:8])
  logits[8:16] = -np.abs(logits[8:16])
  logits[16, [7, 40000]] = logits[16].max() + 1
  logits[17], logits[17, 9] = -0.0, 0.0
  logits[18], logits[18, 5] = -np.inf, -1e4
  logits[19], logits[19, 3] = 0.0, -0.0
  got = spec.best(Tensor(logits))
  assert got.dtype == dtypes.int32 and got.shape == (40, 1)
  np.testing.assert_array_equal(got.numpy()[:, 0], logits.argmax(-1))
  assert spec.best(Tensor(logits[16])).numpy()[0] == 7                                                  # one row, (1,)

def warped(logits:Tensor, sampling:spec.Sampling, V:int) -> np.ndarray:
  """warp() as a round runs it: the values as sampling puts them on the device for a vocabulary of V."""
  return spec.warp(logits, *sampling.tensors(V), filters=sampling.static["filters"]).numpy()

@pytest.mark.parametrize("sampling", [spec.Sampling(0.0), spec.Sampling(1.0), spec.Sampling(0.7, top_k=5), spec.Sampling(1.3, top_p=0.6),
                                      spec.Sampling(1.0, top_k=7, top_p=0.8)], ids=str)
def test_padding_the_vocabulary_changes_no_distribution(sampling):
  # a round's distributions span padded(): the tokens added are impossible under every warp, the rest unchanged
  V = 50
  logits = Tensor(np.random.default_rng(5).standard_normal((3, V)).astype(np.float32) * 3)
  if sampling.temperature == 0:   # greedy's is one-hot on best(), which no added token wins, even over negative logits
    np.testing.assert_array_equal(spec.best(spec.padded(logits - 20)).numpy(), logits.numpy().argmax(-1, keepdims=True))
    return
  wide = warped(spec.padded(logits), sampling, V)
  assert wide.shape == (3, spec.vocab_width(V)) == (3, 64) and not wide[:, V:].any()
  np.testing.assert_allclose(wide[:, :V], warped(logits, sampling, V), rtol=1e-6, atol=1e-9)

def numpy_warp(logits:np.ndarray, temperature:float, top_k:int, top_p:float) -> np.ndarray:
  """The definition, in float64 with sorts: softmax(logits / T); keep the top_k most likely (ties with the k-th kept);
  of those, keep the most likely down to the first at which their mass reaches top_p of what top-k kept (ties kept)."""
  probs = np.exp((logits - logits.max(-1, keepdims=True)) / temperature)
  probs /= probs.sum(-1, keepdims=True)
  for row in probs:
    if top_k: row[row < np.sort(row)[::-1][top_k - 1]] = 0
    ranked = np.sort(row)[::-1]
    if top_p < 1: row[row < ranked[np.argmax(np.cumsum(ranked) >= top_p * row.sum())]] = 0
  return probs / probs.sum(-1, keepdims=True)

@pytest.mark.parametrize("sampling", [spec.Sampling(0.8, top_k=5), spec.Sampling(1.0, top_k=1), spec.Sampling(1.3, top_p=0.6),
                                      spec.Sampling(1.0, top_p=0.95), spec.Sampling(0.7, top_k=20, top_p=0.5),
                                      spec.Sampling(1.0, top_k=3, top_p=0.999)], ids=str)
def test_top_k_and_top_p_keep_what_their_definition_keeps(sampling):
  # rows of every sharpness, rows of rounded logits (ties at the k-th token and at top-p's threshold), GPT-2's vocabulary
  rng = np.random.default_rng(9)
  logits = (rng.standard_normal((6, 50257)) * np.array([[0.5], [2], [4], [8], [1], [3]])).astype(np.float32)
  logits[4:] = np.round(logits[4:] * 2) / 2
  got = warped(spec.padded(Tensor(logits)), sampling, 50257)
  want = numpy_warp(logits.astype(np.float64), sampling.temperature, sampling.top_k, sampling.top_p)
  assert not got[:, 50257:].any()
  np.testing.assert_array_equal(got[:, :50257] > 0, want > 0)                       # the same tokens kept, ties and all
  np.testing.assert_allclose(got[:, :50257], want, rtol=1e-4, atol=1e-9)

def test_keep_largest_finds_each_threshold_to_the_last_bit():
  # the search ends on the threshold itself, not near it: each row puts probabilities 1 and 2 float32 steps (ulps) below
  # the one that decides, which a search stopped short keeps too (13 steps of 15 did); rows whose largest probability is
  # 1.0 (the search's upper end) or whose k-th is tiny, a k past the tokens with any probability, a near-tie at the top
  rng, V = np.random.default_rng(11), 50304
  probs = rng.random((7, V)) ** np.array([[8], [2], [30], [200], [1], [1], [1]])
  probs[4], probs[4, 17] = 0.0, 1.0
  probs[5, 100:] = 0.0
  probs[6], probs[6, [3, 4]] = 0.0, [1.0, 1.0]
  probs = (probs / probs.sum(-1, keepdims=True)).astype(np.float32)   # distributions, as warp() searches them
  probs[6, 4] = np.nextafter(probs[6, 3], np.float32(0))              # the largest, then 1 ulp below it
  ks = np.array([5, 40, 1000, 3, 1, 200, 1])   # row 5: 100 tokens, all of them kept
  for r, k in enumerate(ks[:4]):
    x = np.sort(probs[r])[::-1][k - 1]
    probs[r, rng.choice(V, 6, replace=False)] = [np.nextafter(x, np.float32(0)), np.nextafter(np.nextafter(x, np.float32(0)), np.float32(0))] * 3
  ranked = np.sort(probs, -1)[:, ::-1]
  for r, k in enumerate(ks):   # top-k: weight 1 per token
    got = spec.keep_largest(Tensor(probs[r:r+1]), Tensor.ones(1, V, dtype=dtypes.int32).contiguous(), Tensor([int(k)], dtype=dtypes.int32))
    np.testing.assert_array_equal(got.numpy()[0] > 0, probs[r] >= ranked[r, min(k, V) - 1], err_msg=f"row {r}, k {k}")
  # top-p: weight the mass in warp()'s fixed point; enough is a fraction of the row's mass; the reference walks the ranks
  mass = (probs.astype(np.float64) * 2**60).astype(np.int64)
  for r, top_p in enumerate([0.5, 0.9, 0.3, 0.99, 0.7, 1.0, 0.4]):
    enough = np.float32(top_p) * np.float32(mass[r].sum())
    order = np.argsort(-probs[r], kind="stable")
    cum = np.cumsum(mass[r][order])
    t = probs[r][order][np.argmax(cum.astype(np.float32) >= enough)]
    got = spec.keep_largest(Tensor(probs[r:r+1]), Tensor(mass[r:r+1]), Tensor([[enough]], dtype=dtypes.float32))
    np.testing.assert_array_equal(got.numpy()[0] > 0, probs[r] >= t, err_msg=f"row {r}, top-p {top_p}")

@pytest.mark.parametrize("temperature", [1e-46, 2**-149, 1e-38, 3.4e38])
def test_extreme_temperatures_warp_to_their_limits(temperature):
  # the largest logit is subtracted before dividing: logits / 1e-38 overflow float32 to inf, and inf - inf is NaN;
  # 1e-46 is 0 in float32 (0 / 0: NaN), and 2**-149's reciprocal is inf (pocl: 0 * inf): it goes in as 2**-126
  logits = Tensor(np.random.default_rng(6).standard_normal((3, 50)).astype(np.float32) * 3)
  got = warped(spec.padded(logits), spec.Sampling(temperature), 50)
  limit = np.eye(50)[logits.numpy().argmax(-1)] if temperature < 1 else np.full((3, 50), 1 / 50)   # one-hot, uniform
  assert not got[:, 50:].any()
  np.testing.assert_allclose(got[:, :50], limit, rtol=1e-6, atol=1e-9)

@pytest.mark.parametrize("top_k", [50, 2**31, 3_000_000_000])
def test_top_k_beyond_the_vocabulary_keeps_every_token(top_k):
  # the device holds top-k in int32: 3e9 wrapped around to a negative k, NaN distributions and token 0 every time
  logits = Tensor(np.random.default_rng(7).standard_normal((2, 50)).astype(np.float32) * 3)
  got, unfiltered = (warped(spec.padded(logits), s, 50) for s in (spec.Sampling(1.0, top_k=top_k), spec.Sampling(1.0)))
  np.testing.assert_allclose(got, unfiltered, rtol=1e-6, atol=1e-9)

@pytest.mark.parametrize("top_p", [1e-46, 2**-149, 1e-30, 1e-3])
def test_top_p_below_the_largest_probability_keeps_just_the_most_likely_token(top_p):
  # the device holds top-p in float32: 1e-46 rounded to 0, which kept no token (NaN distributions, token 0 every time)
  logits = Tensor(np.random.default_rng(8).standard_normal((2, 50)).astype(np.float32) * 3)
  got, top_1 = (warped(spec.padded(logits), s, 50) for s in (spec.Sampling(1.0, top_p=top_p), spec.Sampling(1.0, top_k=1)))
  np.testing.assert_array_equal(got, top_1)

# ***** float32 at its edges, where the float64 enumerations cannot look (the self-check runs the same) *****

@pytest.mark.gpu
@pytest.mark.parametrize("name", list(self_check.EDGES))
def test_float32_edges(name):
  ok, figure = self_check.EDGES[name]()
  assert ok, figure

def test_every_uniform_is_strictly_inside_the_unit_interval():
  ok, figure = self_check.uniforms_inside(every=True)   # all 2^24 patterns of a draw's top bits
  assert ok, figure

def test_a_positive_nan_would_win_the_race_and_none_arises(monkeypatch):
  # CUDA's NaN is positive (0x7fffffff) and best() ranks it above +inf; x86's has its sign bit set and loses. Here every
  # NaN that reaches best() is made positive, as on an NVIDIA GPU: sample() still draws no token of probability 0
  positive = Tensor([0x7fffffff], dtype=dtypes.int32).bitcast(dtypes.float32)
  assert spec.best(Tensor([1.0, float("inf")]).cat(positive)).item() == 2
  best = spec.best
  monkeypatch.setattr(spec, "best", lambda x: best((x != x).where(positive, x)))
  ok, figure = self_check.never_zero_probability()
  assert ok, figure

# ***** a whole round on toy conditional tables, under both verification rules *****

def toy_model(V:int, seed:int, sharp:float, temperature:float=1.0):
  """A toy autoregressive model: its next-token table depends on the whole prefix (a hash of it), warped by temperature
  (0: one-hot on the argmax, as greedy sampling warps both models)."""
  def dist(prefix:tuple) -> np.ndarray:
    logits = sharp * np.random.default_rng([seed, *prefix]).standard_normal(V)
    if temperature == 0: return np.eye(V)[logits.argmax()]
    return (z := np.exp(logits / temperature)) / z.sum()
  return dist

def toy_lookup(V:int):
  """A deterministic draft, as prompt lookup is: one-hot on a token that depends on the prefix."""
  return lambda prefix: np.eye(V)[hash(prefix) % V]

def stops(P:np.ndarray, Q:np.ndarray, path:tuple, rule:str, block_acceptance=spec.block_acceptance):
  """The device rule's probabilities of keeping exactly n = 0..K drafted tokens, and the distributions (K+1, V) the next
  token is drawn from after each n. P (K+1, V) with row K zero, Q (K+1, V)."""
  K, f64 = len(path), lambda a: Tensor(a, dtype=dtypes.float64)
  drafted = Tensor(list(path), dtype=dtypes.int32)
  if rule == "token":
    a = probability(*spec.acceptance(f64(P[:K]), f64(Q[:K]), drafted))
    kept = np.cumprod(np.concatenate([[1.0], a]))                             # P(the first n are kept)
    return kept * np.append(1 - a, 1.0), spec.residual(f64(P), f64(Q)).numpy()
  w, *odds = block_acceptance(f64(P), f64(Q), drafted)
  w, h = w.numpy(), stop_probability(*odds)
  later = np.append(np.cumprod((1 - h)[::-1])[::-1][1:], 1.0)                # P(no stop is allowed after n)
  return h * later, spec.residual(f64(P), f64(w[:, None] * Q)).numpy()

def round_distribution(p, q, K:int, V:int, rule:str, prefix=(0,), **kw) -> dict[tuple, float]:
  """Enumerate every draft path x~_1..x~_K: the distribution of the block a round emits (the kept drafts, then the
  resampled or bonus token), from the device rule's own stop probabilities and residuals."""
  out: dict[tuple, float] = {}
  for path in itertools.product(range(V), repeat=K):
    ctx = [prefix + path[:t] for t in range(K + 1)]
    P, Q = np.stack([p(c) for c in ctx[:K]] + [np.zeros(V)]), np.stack([q(c) for c in ctx])
    prob_path = np.prod([P[t, x] for t, x in enumerate(path)])
    if prob_path == 0: continue                                              # never drafted
    stop, res = stops(P, Q, path, rule, **kw)
    for n in np.flatnonzero(stop):                                           # a row never chosen may be 0/0
      for y in range(V): out[path[:n] + (y,)] = out.get(path[:n] + (y,), 0) + prob_path * stop[n] * res[n, y]
  return out

def max_error_against_target(blocks:dict, q, K:int, V:int, prefix=(0,)) -> float:
  """Extend every block to K+1 tokens with the target itself: the joint must be the target's joint."""
  joint = {}
  for block, prob in blocks.items():
    for tail in itertools.product(range(V), repeat=K + 1 - len(block)):
      seq = block + tail
      joint[seq] = joint.get(seq, 0) + prob * np.prod([q(prefix + seq[:i])[seq[i]] for i in range(len(block), K + 1)])
  return max(abs(joint.get(seq, 0) - np.prod([q(prefix + seq[:i])[seq[i]] for i in range(K + 1)]))
             for seq in itertools.product(range(V), repeat=K + 1))

def expected_tokens(blocks:dict) -> float: return sum(len(b) * prob for b, prob in blocks.items())

ROUNDS = [(K, V, draft, T) for K, V in ((2, 4), (3, 3)) for draft in ("model", "one-hot") for T in (0.0, 0.5, 1.0, 2.0)
          if not (draft == "one-hot" and T == 0.0)]

def toy_pair(V:int, draft:str, T:float):
  return toy_model(V, 1, 1.0, T) if draft == "model" else toy_lookup(V), toy_model(V, 2, 1.5, T)

EMULATED = [(2, 4, "model", 1.0), (3, 3, "one-hot", 0.5)]   # the GPU suite's rounds: each K, both drafts

@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("K,V,draft,T", [pytest.param(*r, marks=pytest.mark.gpu) if r in EMULATED else r
                                          for r in ROUNDS],
                         ids=[f"K{K}-V{V}-{d}-T{T}" for K, V, d, T in ROUNDS])
def test_round_emits_the_target_distribution(K, V, draft, T, rule):
  p, q = toy_pair(V, draft, T)
  blocks = round_distribution(p, q, K, V, rule)
  assert abs(sum(blocks.values()) - 1) < 1e-9 and max_error_against_target(blocks, q, K, V) < 1e-9

def test_block_verification_never_emits_fewer_tokens():
  gains = []
  for K, V, draft, T in ROUNDS:
    p, q = toy_pair(V, draft, T)
    token, block = (expected_tokens(round_distribution(p, q, K, V, rule)) for rule in ("token", "block"))
    assert block >= token - 1e-12, (K, V, draft, T, token, block)
    gains.append(block - token)
  assert max(gains) > 0.01, gains                                            # and strictly more on some tables

def test_block_verification_on_the_papers_example():
  # Sun et al., sec. 1: context-free models on {a, b}, target (1/3, 2/3), draft (2/3, 1/3), two drafted tokens:
  # E[kept drafts] is 10/9 token by token and 11/9 by block verification
  p, q = (lambda prefix: np.array([2, 1]) / 3), (lambda prefix: np.array([1, 2]) / 3)
  token, block = (expected_tokens(round_distribution(p, q, 2, 2, rule)) - 1 for rule in ("token", "block"))
  assert abs(token - 10 / 9) < 1e-12 and abs(block - 11 / 9) < 1e-12

def test_enumeration_detects_a_wrong_block_rule():
  # h_i without the 1 - w_i term (stopping too eagerly): no longer the target's distribution
  def eager(P, Q, drafted):
    w, m, slack = spec.block_acceptance(P, Q, drafted)
    return w, m, (Tensor.arange(w.shape[0]) == 0).where(0, 1)
  p, q = toy_pair(3, "model", 1.0)
  assert max_error_against_target(round_distribution(p, q, 2, 3, "block", block_acceptance=eager), q, 2, 3) > 1e-3

def test_block_verification_stops_at_the_longest_allowed_prefix():
  # the draws pick n = the largest i with r_i < h_i, given the device's own h
  rng, K, V = np.random.default_rng(6), 3, 5
  for case in range(8):
    p, q = rng.random((K + 1, V)), rng.random((K + 1, V))
    p[K] = 0; p[:K] /= p[:K].sum(1, keepdims=True); q /= q.sum(1, keepdims=True)
    drafted, r = Tensor(list(rng.integers(0, V, K)), dtype=dtypes.int32), rng.random(K)
    h = stop_probability(*spec.block_acceptance(Tensor(p), Tensor(q), drafted)[1:])
    n, _ = spec.block_verification(Tensor(p), Tensor(q), drafted, Tensor(r.astype(np.float32)))
    assert n.item() == max([0] + [i for i in range(1, K + 1) if r[i - 1] < h[i]]), case

# ***** the device round itself: verify() on constructed cases *****

def run_verify(p:np.ndarray, q:np.ndarray, drafted:list[int], seed:int, rule:str):
  block = Tensor([[0] + drafted], dtype=dtypes.int32)
  warping = spec.Sampling(1.0).tensors(q.shape[1])
  # logits whose temperature-1 softmax is q (zeros -> -inf is fine for softmax)
  with np.errstate(divide="ignore"): q_logits = Tensor(np.log(q).astype(np.float32))
  out = spec.verify(q_logits, Tensor(p.astype(np.float32)), block, spec.seed_key(seed), 0,
                    warping, **spec.Sampling(1.0).static, rule=rule).tolist()
  return int(out[0]), int(out[1])

both_rules = pytest.mark.parametrize("rule", list(spec.RULES))

@both_rules
def test_verify_keeps_all_when_draft_equals_target_and_draws_the_bonus_from_q_K_plus_1(rule):
  K, V = 3, 5
  q = np.full((K + 1, V), 0.05); q[:, 1] = 0.8; q[K] = [0, 0, 0, 1.0, 0]   # the bonus row is one-hot on token 3
  for seed in range(5):
    assert run_verify(q[:K], q, [1, 1, 1], seed, rule) == (K, 3)

@both_rules
def test_verify_rejects_a_token_the_target_never_emits_and_resamples_from_the_residual(rule):
  p = np.array([[0.0, 1.0, 0, 0], [0.25] * 4])
  q = np.array([[0.5, 0.0, 0.5, 0.0], [0.25] * 4, [0.25] * 4])
  for seed in range(5):
    n, token = run_verify(p, q, [1, 2], seed, rule)
    assert n == 0 and token in (0, 2)            # residual max(0, q - p) is supported on {0, 2}

@both_rules
def test_one_hot_verify_is_verify_with_a_one_hot_p(rule):
  # the same random stream, so the same decisions: one_hot builds p = onehot(x~) from the block, nothing else
  rng, K, V = np.random.default_rng(3), 3, 6
  warping = spec.Sampling(1.0).tensors(V)
  for seed in range(10):
    q = rng.random((K + 1, V)) ** 3
    drafted = [int(x) for x in rng.integers(0, V, K)]
    if seed % 2: q[0] = np.eye(V)[drafted[0]]                  # certain to be kept
    else: q[0, drafted[0]] = 0.0                               # certain to be rejected
    with np.errstate(divide="ignore"): q_logits = Tensor(np.log(q / q.sum(1, keepdims=True)).astype(np.float32))
    block = Tensor([[0] + drafted], dtype=dtypes.int32)
    args = (block, spec.seed_key(seed), 0, warping)
    looked_up = spec.verify(q_logits, None, *args, **spec.Sampling(1.0).static, rule=rule, one_hot=True).tolist()
    assert looked_up == spec.verify(q_logits, Tensor(np.eye(V, dtype=np.float32)[drafted]), *args, **spec.Sampling(1.0).static,
                                    rule=rule).tolist()
    assert (looked_up[0] == 0) == (seed % 2 == 0) and looked_up[4:4+K] == drafted

@both_rules
def test_greedy_verify_is_the_rule_on_one_hot_distributions(rule):
  # greedy rounds take a shortcut (greedy_verification(): keep x~_t while it is q_t's argmax, then emit the argmax of
  # the first row that disagrees, or of q_K+1) and draw nothing. The rule itself, given the one-hot p and q that
  # temperature 0 warps to and draws r anywhere in (0, 1), must decide the same: n, and a residual one-hot on that token
  rng, K, V = np.random.default_rng(4), 4, 7
  warping = spec.Sampling(0.0).tensors(V)
  for case in range(12):
    q_logits = rng.standard_normal((K + 1, V)).astype(np.float32)
    best = q_logits.argmax(1)
    agree = case % (K + 1)                                     # the first agree drafts are the argmax, the next is not
    drafted = [int(best[t]) if t < agree else int((best[t] + 1 + t) % V) for t in range(K)]
    p = np.eye(V, dtype=np.float32)[drafted]                   # a greedy draft is one-hot on its proposal
    block = Tensor([[0] + drafted], dtype=dtypes.int32)
    outs = {tuple(spec.verify(Tensor(q_logits), Tensor(p), block, spec.seed_key(seed), seed, warping,
                              **spec.Sampling(0.0).static, rule=rule).tolist()) for seed in range(3)}
    matches = [float(x == b) for x, b in zip(drafted, best)]
    assert outs == {(agree, best[agree], 1.0, 0.0, *drafted, *matches, *[1.0] * K)}, (case, outs)
    P, Q = np.concatenate([p, np.zeros((1, V))]), np.eye(V)[best]
    for r in (1e-6, 0.5, 1 - 1e-6):
      f64 = lambda a: Tensor(a, dtype=dtypes.float64)
      n, dist = spec.RULES[rule](f64(P), f64(Q), Tensor(drafted, dtype=dtypes.int32), f64(np.full(K, r)))
      assert n.item() == agree and np.array_equal(dist.numpy(), np.eye(V)[best[agree]]), (case, r)

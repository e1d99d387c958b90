"""python spec.py --self-check: what a porter runs on their own device after changing a backend.

On tiny random models made on the spot (nothing downloaded), on tinygrad's device (DEV) in the dtype asked for:
  - whole rounds enumerated exactly on the device: every draft path of K 2 over 4 tokens, the device rule's stop
    probabilities and residuals, against the target's joint distribution (the float64 definition), under both rules,
    with a sampled and a one-hot draft, with temperature 1 and with top-k on;
  - float32 at its edges (EDGES): uniforms strictly inside (0, 1), no token of probability 0 drawn with extreme
    uniforms, the races' keys without NaN, the rules' tests where w = 1 and where q = p, a residual of no mass;
  - greedy identity: speculative sampling at K 1 and 4 (both rules at 4) emits the target alone's greedy tokens;
  - a chi-square test of 300 sampled tokens against the target's exact distribution over 8 tokens, its power against
    the draft's distribution stated, and its negative control (the draft's tokens must fail it);
  - GPT-2's massive activations (a residual value of 3000) through a pass, against the float64 definition: in half,
    a layer norm that squared them overflowed and zeroed the row;
the model checks with the engine and with --plain. One line per check: what, its figure, PASS or FAIL. Exit 1 on any
failure.
"""
from __future__ import annotations
import itertools, json, math, os, pathlib, struct, tempfile, time
import numpy as np
from tinygrad import Tensor, Device, dtypes
import models, spec

TINY = dict(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=1024)
# the chi-square's models: their trunk never reaches the logits (constant), so the smallest does; 8 tokens, so that a few
# hundred draws tell distributions apart: few enough rounds for a device emulated in Python
IID = dict(n_layer=1, n_head=1, n_embd=8, vocab_size=8, n_positions=1024)

def random_gpt2(seed:int, cfg:dict=TINY, noise:float=0.0, constant:bool=False, scale:float=0.3,
                masks:bool=False) -> dict[str, np.ndarray]:
  """Random GPT-2 weights of shape cfg, N(0, scale), in the Hugging Face layout (Conv1D kernels (in, out), no
  lm_head; masks: each block's causal-mask buffer, which the checkpoints store too); noise: seed's model plus that
  much of another's, a draft that agrees with it often, not always. constant: ln_f's weight 0, so every position's
  logits are ln_f.bias @ wte.T: the next token does not depend on the context, and sampled tokens are independent
  draws."""
  rng, C, V = np.random.default_rng(seed), cfg["n_embd"], cfg["vocab_size"]
  w = lambda *shape: (rng.standard_normal(shape) * scale).astype(np.float32)
  weights = {"wte.weight": w(V, C), "wpe.weight": w(cfg["n_positions"], C), "ln_f.weight": 1 + w(C), "ln_f.bias": w(C)}
  for i in range(cfg["n_layer"]):
    weights |= {f"h.{i}.{k}": v for k, v in {"ln_1.weight": 1 + w(C), "ln_1.bias": w(C), "ln_2.weight": 1 + w(C),
                "ln_2.bias": w(C), "attn.c_attn.weight": w(C, 3*C), "attn.c_attn.bias": w(3*C), "attn.c_proj.weight": w(C, C),
                "attn.c_proj.bias": w(C), "mlp.c_fc.weight": w(C, 4*C), "mlp.c_fc.bias": w(4*C), "mlp.c_proj.weight": w(4*C, C),
                "mlp.c_proj.bias": w(C)}.items()}
  if noise: weights = {k: v + noise * np.random.default_rng(seed + 100).standard_normal(v.shape).astype(np.float32)
                       for k, v in weights.items()}
  if constant: weights["ln_f.weight"][:], weights["ln_f.bias"][:] = 0, rng.standard_normal(C)
  if masks: weights |= {f"h.{i}.attn.bias": np.tril(np.ones((cfg["n_positions"],) * 2, np.float32))[None, None]
                        for i in range(cfg["n_layer"])}
  return weights

def checkpoint(root:pathlib.Path, name:str, seed:int, constant:bool=False, noise:float=0.0, cfg:dict=TINY,
               weights:dict|None=None) -> str:
  """random_gpt2(seed, cfg, noise, constant), or weights, written as a checkpoint directory named name."""
  weights = random_gpt2(seed, cfg, noise, constant) if weights is None else weights
  return str(write_checkpoint(root / name, cfg, weights))

def write_checkpoint(path:pathlib.Path, cfg:dict, weights:dict[str, np.ndarray], prefixed:bool=False) -> pathlib.Path:
  """A checkpoint directory as the Hugging Face hub has them: config.json and model.safetensors (prefixed: the weights'
  names under "transformer.", as some checkpoints store them)."""
  path.mkdir(parents=True, exist_ok=True)
  (path / "config.json").write_text(json.dumps({"model_type": "gpt2", "activation_function": "gelu_new",
                                                "layer_norm_epsilon": 1e-5, **cfg}))
  prefix = "transformer." if prefixed else ""
  write_safetensors(path / "model.safetensors", {prefix + k: v for k, v in weights.items()})
  return path

def write_safetensors(fn:pathlib.Path, tensors:dict[str, np.ndarray]):
  """float32 tensors in the safetensors format, by numpy: tinygrad's safe_save would compile for its CPU backend, which
  a GPU machine may lack (no clang)."""
  header, offset, blobs = {}, 0, []
  for k, v in tensors.items():
    b = np.ascontiguousarray(v, np.float32).tobytes()
    header[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [offset, offset + len(b)]}
    offset += len(b); blobs.append(b)
  h = json.dumps(header).encode()
  fn.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))

def read_safetensors(fn:pathlib.Path) -> dict[str, np.ndarray]:
  """A float32 safetensors file's tensors, by numpy."""
  raw = fn.read_bytes()
  n = struct.unpack("<Q", raw[:8])[0]
  header = json.loads(raw[8:8+n])
  return {k: np.frombuffer(raw[8+n+v["data_offsets"][0]:8+n+v["data_offsets"][1]], np.float32).reshape(v["shape"])
          for k, v in header.items() if k != "__metadata__"}

# ***** GPT-2 in numpy, from its definition (Radford et al. 2019; the Hugging Face Conv1D layout) *****

def np_gpt2_logits(w:dict[str, np.ndarray], n_head:int, tokens:list[int], eps:float=1e-5) -> np.ndarray:
  w = {k: v.astype(np.float64) for k, v in w.items()}
  def layer_norm(x, g, b): return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * g + b
  def gelu(x): return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
  T = len(tokens)
  x = w["wte.weight"][tokens] + w["wpe.weight"][:T]
  n_layer = sum(1 for k in w if k.endswith("ln_1.weight"))
  for i in range(n_layer):
    g = lambda name: w[f"h.{i}.{name}"]
    h = layer_norm(x, g("ln_1.weight"), g("ln_1.bias")) @ g("attn.c_attn.weight") + g("attn.c_attn.bias")
    q, k, v = (a.reshape(T, n_head, -1).transpose(1, 0, 2) for a in np.split(h, 3, axis=-1))
    att = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1]) + np.triu(np.full((T, T), -np.inf), 1)
    att = np.exp(att - att.max(-1, keepdims=True)); att /= att.sum(-1, keepdims=True)
    x = x + (att @ v).transpose(1, 0, 2).reshape(T, -1) @ g("attn.c_proj.weight") + g("attn.c_proj.bias")
    h = gelu(layer_norm(x, g("ln_2.weight"), g("ln_2.bias")) @ g("mlp.c_fc.weight") + g("mlp.c_fc.bias"))
    x = x + h @ g("mlp.c_proj.weight") + g("mlp.c_proj.bias")
  return layer_norm(x, w["ln_f.weight"], w["ln_f.bias"]) @ w["wte.weight"].T

# ***** whole rounds, enumerated *****

def tables(V:int, seed:int, sharp:float, sampling:spec.Sampling, one_hot:bool):
  """An autoregressive toy model: next-token distributions for every prefix, warped by the device's warp()."""
  cache = {}
  def dist(prefix:tuple) -> np.ndarray:
    if prefix not in cache:
      if one_hot: cache[prefix] = np.eye(V)[hash((seed, prefix)) % V]   # a deterministic draft, as prompt lookup is
      else:
        logits = (sharp * np.random.default_rng([seed, *prefix]).standard_normal(V)).astype(np.float32)
        warped = spec.warp(Tensor(logits[None]), *sampling.tensors(V), filters=sampling.static["filters"])
        cache[prefix] = (t := warped.numpy()[0].astype(np.float64)) / t.sum()   # float32's rounding, renormalized
    return cache[prefix]
  return dist

def block_distribution(p, q, K:int, V:int, rule:str, dtype) -> dict[tuple, float]:
  """The distribution of the block a round emits, over every draft path, from the device rule's own stop probabilities
  and residuals (spec.acceptance, spec.block_acceptance, spec.residual) computed in dtype."""
  out: dict[tuple, float] = {}
  for path in itertools.product(range(V), repeat=K):
    P = np.stack([p((0,) + path[:t]) for t in range(K)] + [np.zeros(V)])
    Q = np.stack([q((0,) + path[:t]) for t in range(K + 1)])
    prob = np.prod([P[t, x] for t, x in enumerate(path)])
    if prob == 0: continue
    dev, drafted = (lambda a: Tensor(a.astype(np.float64), dtype=dtype)), Tensor(list(path), dtype=dtypes.int32)
    if rule == "token":
      a = probability(*spec.acceptance(dev(P[:K]), dev(Q[:K]), drafted))
      stop, res = np.cumprod(np.concatenate([[1.0], a])) * np.append(1 - a, 1.0), spec.residual(dev(P), dev(Q))
    else:
      w, *odds = spec.block_acceptance(dev(P), dev(Q), drafted)
      h = stop_probability(*odds)
      stop = h * np.append(np.cumprod((1 - h)[::-1])[::-1][1:], 1.0)
      res = spec.residual(dev(P), dev(w.numpy().astype(np.float64)[:, None] * Q))
    res = res.numpy().astype(np.float64)
    for n in np.flatnonzero(stop):
      for y in range(V): out[path[:n] + (y,)] = out.get(path[:n] + (y,), 0) + prob * stop[n] * res[n, y]
  return out

def probability(num:Tensor, den:Tensor) -> np.ndarray:
  """The token rule's acceptance from the fraction it tests draws against (spec.acceptance): min(1, num / den), 0 where
  num is 0; in float64 on the host."""
  num, den = num.numpy().astype(np.float64), den.numpy().astype(np.float64)
  return np.where(num > 0, np.minimum(1, np.divide(num, den, out=np.ones_like(num), where=den > 0)), 0.0)

def stop_probability(m:Tensor, slack:Tensor) -> np.ndarray:
  """The block rule's h from its odds m : slack (spec.block_acceptance): m / (m + slack), 0 where m is 0; float64."""
  m, slack = m.numpy().astype(np.float64), slack.numpy().astype(np.float64)
  return np.where(m > 0, m / np.where(m > 0, m + slack, 1), 0.0)

def joint_error(blocks:dict, q, K:int, V:int) -> float:
  """Each emitted block extended to K+1 tokens by the target: the largest difference from the target's own joint."""
  joint = {}
  for block, prob in blocks.items():
    for tail in itertools.product(range(V), repeat=K + 1 - len(block)):
      seq = block + tail
      joint[seq] = joint.get(seq, 0) + prob * np.prod([q((0,) + seq[:i])[seq[i]] for i in range(len(block), K + 1)])
  return max(abs(joint.get(s, 0) - np.prod([q((0,) + s[:i])[s[i]] for i in range(K + 1)]))
             for s in itertools.product(range(V), repeat=K + 1))

def enumeration_checks(report) -> None:
  float64 = dtypes.float64 in Device[Device.DEFAULT].renderer.supported_dtypes()
  dtype, tolerance = (dtypes.float64, 1e-9) if float64 else (dtypes.float32, 1e-5)
  K, V = 2, 4
  for name, sampling in (("T 1", spec.Sampling(1.0)), ("T 0.8, top-k 2", spec.Sampling(0.8, top_k=2))):
    for draft in ("sampled", "one-hot"):
      p, q = tables(V, 1, 1.0, sampling, draft == "one-hot"), tables(V, 2, 1.5, sampling, False)
      for rule in spec.RULES:
        error = joint_error(block_distribution(p, q, K, V, rule, dtype), q, K, V)
        report(f"round enumerated, {rule} rule, {draft} draft, {name} ({dtype.name} on the device)",
               f"max error {error:.1e} (<= {tolerance:.0e})", error <= tolerance)

# ***** float32 at its edges: the rules in the device's own rounding and NaN (docs/algorithm.md, Exact in float32) *****

LARGEST_U = 1 - 2**-24   # (2^23 - 1/2) / 2^23: the largest uniform, where the rules' tests are closest to their limits

def uniforms_inside(every:bool) -> tuple[bool, str]:
  """spec.unit_interval over each pattern a draw's top 24 bits can take (every: all 2^24; else the lowest and highest
  4096, where 0 and 1 lie): strictly inside (0, 1)."""
  top = np.arange(2**24) if every else np.concatenate([np.arange(4096), np.arange(2**24 - 4096, 2**24)])
  u = spec.unit_interval(Tensor(((top << 8) | 0xff).astype(np.uint32))).numpy().astype(np.float64)
  return bool(u.min() > 0 and u.max() < 1), f"{len(u)} patterns in [{u.min():.3g}, 1 - {1 - u.max():.3g}]"

def edge_rows(V:int=1000) -> Tensor:
  """Rows the sampler draws from, of every kind: warp()'s with top-k and top-p over a padded vocabulary (most blocks
  and the padding of no mass), a residual() with a few tokens left, one-hot rows (top-k 1; a greedy-like draft)."""
  rng = np.random.default_rng(12)
  logits = spec.padded(Tensor((rng.standard_normal((2, V)) * 3).astype(np.float32)))
  W = logits.shape[1]
  warped = [spec.warp(logits, *s.tensors(V), filters=s.static["filters"])
            for s in (spec.Sampling(1.0, top_k=5), spec.Sampling(0.8, top_p=0.3), spec.Sampling(1.0, top_k=1))]
  p = np.zeros((1, W), np.float32); p[0, :V] = rng.random(V); p /= p.sum()
  q = p.copy(); q[0, [3, 700]] += [0.02, 0.01]; q /= q.sum()
  return Tensor.cat(*warped, spec.residual(Tensor(p), Tensor(q))).realize()

def never_zero_probability() -> tuple[bool, str]:
  """sample() over edge_rows() with every uniform 1.0 (outside the grid: a draw never is), the largest and the smallest
  uniform, float32's smallest, and uniform() with every other draw 1.0: no token of probability 0."""
  rows = edge_rows()
  probs, (N, W) = rows.numpy(), rows.shape
  shape, bad = (N, spec.uniforms_per_draw(W)), 0
  drawn = spec.uniform(spec.seed_key(5), 0, *shape).numpy()
  drawn[:, ::2] = 1.0
  for u in [np.full(shape, v, np.float32) for v in (1.0, LARGEST_U, 2**-24, 2**-149)] + [drawn]:
    tokens = spec.sample(rows, Tensor(u)).numpy()
    bad += int((probs[np.arange(N), tokens] == 0).sum())
  return bad == 0, f"{5 * N} draws from {N} rows, {bad} of probability 0"

def race_keys_without_nan() -> tuple[bool, str]:
  """spec.race() over edge_rows()' tokens and block masses at extreme uniforms: no NaN (a positive one wins best()),
  a zero weight's key -1, below every other key."""
  rows = edge_rows()
  nans = wrong = count = 0
  for weights in (rows, rows.reshape(rows.shape[0], -1, spec.BLOCK).sum(-1)):
    w = weights.numpy()
    for v in (1.0, LARGEST_U, 2**-24, 2**-149):
      keys = spec.race(weights, Tensor.full(weights.shape, v)).numpy()
      count, nans = count + keys.size, nans + int(np.isnan(keys).sum())
      wrong += int((keys[w == 0] != -1).sum() + (keys[w > 0] <= -1).sum())
  return nans == wrong == 0, f"{count} keys, {nans} NaN, {wrong} out of order"

def block_rule_stops_where_w_is_1() -> tuple[bool, str]:
  """K 2: q_0 = p_0 one-hot (w_1 = 1), p_1 one-hot on token 7, q_1 a little on 8 and 9: h_1 = m_1 / (m_1 + 0) = 1, so
  n = 1 at r = 0.99995 and the token is 8 or 9. m_1 + 1 - w_1 rounds m_1 to float32's grid near 1, h_1 fell below r,
  n was 0, where no mass is left, and the token was a NaN distribution's."""
  V = 16
  P, Q = np.zeros((3, V), np.float32), np.zeros((3, V), np.float32)
  P[0, 3] = Q[0, 3] = P[1, 7] = 1
  Q[1, [8, 9]] = [0.00012817916, 0.00011950812]; Q[1, 7] = 1 - Q[1].sum(); Q[2] = 1 / V
  n, dist = spec.block_verification(Tensor(P), Tensor(Q), Tensor([3, 7], dtype=dtypes.int32), Tensor([0.99995] * 2))
  token = spec.sample(dist.reshape(1, V), spec.uniform(spec.seed_key(1), 0, 1, spec.uniforms_per_draw(V))).item()
  n, dist = n.item(), dist.numpy()
  ok = n == 1 and token in (8, 9) and not np.isnan(dist).any() and set(np.flatnonzero(dist)) == {8, 9}
  return ok, f"n {n} (1), token {token} (8 or 9)"

def token_rule_keeps_q_equal_p() -> tuple[bool, str]:
  """q = p at the largest uniform (r < 1 = q/p): one-hot rows (top-k 1, prompt lookup) and rows of every probability
  (where q / p can round below 1) keep every draft; r = 1.0 rejected them into a residual of no mass, 0 / 0."""
  rng, K, V = np.random.default_rng(2), 3, 16
  P = np.zeros((K + 1, V), np.float32); P[:K] = rng.random((K, V)); P[0] = 0; P[0, 5] = 1
  P[:K] /= P[:K].sum(1, keepdims=True)
  Q = P.copy(); Q[K] = np.eye(V)[11]
  r = spec.unit_interval(Tensor([0xffffffff] * K, dtype=dtypes.uint32))
  n, dist = spec.token_verification(Tensor(P), Tensor(Q), Tensor([5, 2, 9], dtype=dtypes.int32), r)
  n, dist = n.item(), dist.numpy()
  return bool(n == K and dist[11] == 1), f"n {n} ({K}), the bonus from q_{K}: {dist[11]:.3g} on its token (1)"

def residual_of_no_mass() -> tuple[bool, str]:
  """residual(p, q) where q <= p everywhere (float32's rounding can reject there): q itself, no NaN."""
  p = np.full((1, 8), 1 / 8, np.float32); q = p.copy(); q[0, 2] = np.nextafter(q[0, 2], np.float32(0))
  got = spec.residual(Tensor(p), Tensor(q)).numpy()
  return bool(not np.isnan(got).any() and np.allclose(got, q / q.sum())), f"residual {got[0, :3].round(4).tolist()}..."

EDGES = {"uniforms strictly inside (0, 1)": lambda: uniforms_inside(False),
         "sample() never draws a token of probability 0": never_zero_probability,
         "the races' keys: no NaN, zero weights last": race_keys_without_nan,
         "block rule: h = 1 where w = 1 (no stop where no mass is left)": block_rule_stops_where_w_is_1,
         "token rule: q = p kept at the largest uniform": token_rule_keeps_q_equal_p,
         "residual of no mass draws from q": residual_of_no_mass}

def edge_checks(report) -> None:
  for name, check in EDGES.items():
    ok, figure = check()
    report(f"float32 edge: {name}", figure, ok)

# ***** the models *****

def greedy_checks(report, target, draft, label:str) -> None:
  prompt, n = [5, 9, 2], 32
  alone = spec.autoregressive_generate(target, prompt, n, eos=None)[0]
  for K, rule in ((1, "block"), (4, "block"), (4, "token")):
    got, stats = spec.speculative_generate(target, draft, prompt, K, n, eos=None, verification=rule)
    first = next((i for i, (a, b) in enumerate(zip(got, alone)) if a != b), None)
    report(f"greedy identity, K {K}, {rule} rule, {label}",
           f"{n} tokens, alpha {stats.acceptance_rate:.2f}" + ("" if first is None else f", first difference at {first}"),
           first is None)

def chi_square(counts:np.ndarray, probs:np.ndarray) -> float:
  """P(chi-square >= the statistic) of counts against probs, categories expected fewer than 5 times pooled; 0 if any
  count falls where probs is 0 (pooling would hide it)."""
  if counts[probs == 0].any(): return 0.0
  expected = counts.sum() * probs
  rare = expected < 5
  obs, exp = np.append(counts[~rare], counts[rare].sum()), np.append(expected[~rare], expected[rare].sum())
  keep = exp > 0
  x, k = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum()) - 1
  return chi2_sf(x, k)

def chi2_sf(x:float, k:int) -> float:
  """The chi-square distribution's upper tail: the regularized gamma Q(k/2, x/2), by its series or continued fraction."""
  a, x = k / 2, x / 2
  if x <= 0: return 1.0
  front = math.exp(-x + a * math.log(x) - math.lgamma(a))
  if x < a + 1:
    term = total = 1 / a
    for n in range(1, 1000):
      term *= x / (a + n); total += term
      if term < total * 1e-15: break
    return 1 - front * total
  b, c, d = x + 1 - a, 1e300, 1 / (x + 1 - a)
  h = d
  for i in range(1, 1000):
    an, b = -i * (i - a), b + 2
    d = 1 / (an * d + b or 1e-300); c = b + an / c or 1e-300; h *= d * c
    if abs(d * c - 1) < 1e-15: break
  return front * h

def sampling_checks(report, target, draft, label:str, n:int=300, rule:str="block", control:bool=True) -> None:
  """target and draft have context-free next-token distributions q and p: every sampled token is a draw from q. The
  test's power, the chance that it rejects n draws from p, is estimated from 2000 simulated runs; control: the draft's
  own n tokens must fail it (a property of the test, not of the device: an interpreted one may leave it out)."""
  q, p = (m.forward(Tensor([[0]]), 0)[0].softmax().numpy().astype(np.float64) for m in (target, draft))
  q, p = q / q.sum(), p / p.sum()
  def test(tokens:list[int]) -> float:   # a token past the vocabulary counts where q is 0
    counts = np.bincount(tokens, minlength=len(q))
    return chi_square(counts, np.pad(q, (0, len(counts) - len(q))))
  power = np.mean([chi_square(c, q) < 1e-3 for c in np.random.default_rng(0).multinomial(n, p, size=2000)])
  tokens, stats = spec.speculative_generate(target, draft, [0], 2, n, spec.Sampling(1.0), seed=11, eos=None,
                                            verification=rule)
  pvalue = test(tokens)
  report(f"chi-square, {n} tokens at T 1, K 2, {rule} rule, {label}", f"p {pvalue:.3f} (> 1e-3), alpha "
         f"{stats.acceptance_rate:.2f}; power {power:.3f} against the draft's distribution", pvalue > 1e-3)
  if not control: return
  control = test(spec.autoregressive_generate(draft, [0], n, spec.Sampling(1.0), seed=11, eos=None)[0])
  report(f"chi-square's negative control, the draft's {n} tokens, {label}", f"p {control:.1e} (< 1e-3)", control < 1e-3)

MASSIVE = 3000.0   # a residual value real GPT-2 checkpoints reach (Sun et al. 2024); squared in half it overflows

def massive_weights(seed:int) -> dict[str, np.ndarray]:
  """TINY's random weights with MASSIVE in one dimension of position 0's embedding and of layer 0's MLP output (its
  c_proj bias: every position of layer 1 and ln_f): the "massive activations" of GPT-2's residual stream."""
  weights = random_gpt2(seed)
  weights["wpe.weight"][0, 5] = weights["h.0.mlp.c_proj.bias"][7] = MASSIVE
  return weights

def log_probs(logits:np.ndarray) -> np.ndarray:
  logits = logits.astype(np.float64) - logits.max(-1, keepdims=True)
  return logits - np.log(np.exp(logits).sum(-1, keepdims=True))

def massive_check(report, model, weights:dict, label:str, tokens=(3, 17, 42, 9)) -> None:
  """The model's log-probabilities at each position within 0.1 of the float64 definition's, the same argmax: a layer
  norm that squares in half zeroes these rows (float16 on a GPU)."""
  got = log_probs(model.forward(Tensor([list(tokens)], dtype=dtypes.int32), 0).numpy())
  expected = log_probs(np_gpt2_logits(weights, TINY["n_head"], list(tokens)))
  error, agree = float(np.abs(got - expected).max()), int((got.argmax(-1) == expected.argmax(-1)).sum())
  report(f"massive activations ({MASSIVE:g} at position 0 and out of layer 0's MLP), {label}",
         f"log-probability error {error:.1e} (<= 0.1), argmax {agree} of {len(tokens)}",
         error <= 0.1 and agree == len(tokens))

def iid_pair(root:pathlib.Path) -> list[str]:
  """The chi-square's target and draft, whose distributions overlap by 0.80 (the draft's acceptance)."""
  return [checkpoint(root, name, seed, constant=True, cfg=IID) for name, seed in (("target-iid", 3), ("draft-iid", 4))]

def run(dtype:str="float32") -> int:
  """Every check, one line each; the number that failed."""
  failed, t0 = [], time.perf_counter()
  def report(what:str, figure:str, ok:bool):
    print(f"{'PASS' if ok else 'FAIL'}  {what}: {figure}", flush=True)
    if not ok: failed.append(what)
  print(f"spec self-check on {Device.DEFAULT} ({Device[Device.DEFAULT].renderer.target}), {dtype}", flush=True)
  saved = os.environ.get("SPEC_STEP_CACHE")
  os.environ["SPEC_STEP_CACHE"] = ""   # every step captured here, none loaded: the check is of this code on this device
  try:
    enumeration_checks(report)
    edge_checks(report)
    with tempfile.TemporaryDirectory() as d:
      root = pathlib.Path(d)
      paths = [checkpoint(root, "target", 1), checkpoint(root, "draft", 1, noise=0.1)] + iid_pair(root)
      paths.append(checkpoint(root, "massive", 5, weights=(massive := massive_weights(5))))
      for plain in (False, True):
        label = "plain" if plain else "engine"
        target, draft, target_iid, draft_iid, target_massive = (models.load(p, dtype, plain=plain) for p in paths)
        greedy_checks(report, target, draft, label)
        sampling_checks(report, target_iid, draft_iid, label)
        massive_check(report, target_massive, massive, label)
  finally:
    if saved is None: del os.environ["SPEC_STEP_CACHE"]
    else: os.environ["SPEC_STEP_CACHE"] = saved
  print(f"{'FAILED: ' + str(len(failed)) + ' of the checks' if failed else 'all checks passed'} "
        f"({time.perf_counter() - t0:.0f} s)", flush=True)
  return len(failed)

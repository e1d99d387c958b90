"""Speculative generation on real and tiny models: greedy identity, statistics, stopping, round structure, fast path."""
import collections, math, re, time
import numpy as np
import pytest
from tinygrad.codegen import to_program_cache
from tinygrad import Tensor, dtypes
from tinygrad.uop.ops import Ops
import models, spec
from spec import PromptLookup, Sampling, autoregressive_generate, speculative_generate
import conftest
from conftest import PROMPTS, TINY, chi2_sf, load, random_weights, tolerance, write_checkpoint

# ***** greedy: token for token the target's greedy output *****

_baselines: dict = {}
def assert_greedy_identical(target, draft, prompt, K, n=200, verification="block"):
  """float32: token for token. float16: the same, except that the first divergence may fall where the target's logits
  of the two tokens are within the dtype's tolerance of each other (a K+1-row pass and a decode round differently)."""
  key = (id(target), tuple(prompt), n)
  if key not in _baselines: _baselines[key] = autoregressive_generate(target, prompt, n, eos=None)[0]
  base = _baselines[key]
  got, stats = speculative_generate(target, draft, prompt, K, n, eos=None, verification=verification)
  if got != base:
    i = next(i for i, (a, b) in enumerate(zip(got, base)) if a != b)
    logits = target.forward(Tensor([prompt + base[:i]]), 0)[-1].numpy()
    margin = abs(logits[base[i]] - logits[got[i]]) / np.abs(logits).max()
    assert conftest.DTYPE == "float16" and margin < tolerance(), \
      f"K={K}: first difference at {i}, {conftest.DTYPE}, margin {margin:.2e} of the logit scale"
  return stats

@pytest.mark.parametrize("first,last", [pytest.param(0, 3, marks=pytest.mark.backend), (3, 10)], ids=["prompts0-2", "prompts3-9"])
def test_greedy_identity_real_pair(docs_target, docs_draft, enc, first, last):
  # every K on at least two prompts, ten prompts in all (all of K x prompts: the slow test below)
  for i in range(first, last): assert_greedy_identical(docs_target, docs_draft, enc.encode(PROMPTS[i]), [1, 2, 4, 8][i % 4])

@pytest.mark.slow
@pytest.mark.parametrize("K", [1, 2, 4, 8])
def test_greedy_identity_real_pair_all(docs_target, docs_draft, enc, K):
  for prompt in PROMPTS: assert_greedy_identical(docs_target, docs_draft, enc.encode(prompt), K)

@pytest.mark.backend
def test_greedy_identity_with_a_draft_in_the_other_dtype(docs_target, enc):
  """A draft in the other dtype than the target's (spec.py's --draft-dtype auto runs a float16 draft beside a float32
  target on a CPU with F16C) proposes other tokens at times, never other output: the target's greedy path."""
  other = "float16" if conftest.DTYPE == "float32" else "float32"
  draft = models.load(str(conftest.shared_dir() / "docs-draft"), other)
  assert draft.dtype != docs_target.dtype
  for i, K in ((0, 2), (1, 4)):
    assert assert_greedy_identical(docs_target, draft, enc.encode(PROMPTS[i]), K).acceptance_rate > 0

def test_draft_dtype_auto_is_float16_where_half_pays(monkeypatch):
  for pays in (True, False):
    monkeypatch.setattr(models.engine, "half_pays", lambda pays=pays: pays)
    for target in models.DTYPES.values():
      assert models.draft_dtype("auto", target) == ("float16" if pays else models.dtype_name(target))
      assert models.draft_dtype("auto", target, plain=True) == models.dtype_name(target)   # --plain measures nothing
      assert [models.draft_dtype(name, target) for name in models.DTYPES] == list(models.DTYPES)
  with pytest.raises(ValueError, match="draft dtype must be auto, float32 or float16, got 'half'"):
    models.draft_dtype("half", models.DTYPES["float32"])

@pytest.fixture(scope="module")
def tiny(tiny_dir): return {name: load(tiny_dir / name) for name in ("target", "draft", "other")}

# greedy rounds keep the same tokens under both rules (test_exact checks verify() for every seed): token at one K
@pytest.mark.parametrize("K,verification", [pytest.param(1, "block", marks=pytest.mark.backend), (2, "block"),
                                            pytest.param(4, "block", marks=pytest.mark.backend),
                                            pytest.param(8, "block", marks=pytest.mark.backend),
                                            pytest.param(4, "token", marks=[pytest.mark.backend, pytest.mark.quick])])
def test_greedy_identity_tiny(tiny, K, verification):
  alphas = [assert_greedy_identical(tiny["target"], tiny[d], prompt, K, verification=verification).acceptance_rate
            for d in ("draft", "other") for prompt in ([5, 9, 2], [40, 41, 42, 43])]
  assert max(alphas) > 0 and min(alphas) < 0.95, alphas   # the drafts agree sometimes and disagree often

def test_tiny_greedy_paths_vary(tiny):
  paths = {tuple(autoregressive_generate(tiny["target"], p, 30, eos=None)[0]) for p in ([5, 9, 2], [17], [40, 41, 42, 43])}
  assert len(paths) >= 2 and max(len(set(p)) for p in paths) > 3

@pytest.mark.quick
def test_baseline_is_the_targets_own_greedy_path(tiny):
  # the baseline is the round loop with a drafter that proposes nothing: checked against one plain, uncompiled forward
  # over its output (teacher forcing), so the greedy identity tests compare with the target itself
  prompt, n = [5, 9, 2], 40
  got, stats = autoregressive_generate(tiny["target"], prompt, n, eos=None)
  logits = tiny["target"].forward(Tensor([prompt + got]), 0)[len(prompt) - 1:-1].numpy()
  assert got == logits.argmax(-1).tolist() and stats.rounds == n and stats.drafted == 0 and stats.sources == {"target": n}

@pytest.fixture(scope="module")
def target_twin(tiny_dir): return load(tiny_dir / "target")  # same weights, its own instance and cache

@pytest.mark.parametrize("verification", list(spec.RULES))
@pytest.mark.parametrize("K", [1, 3, 4])
def test_draft_equal_to_target_accepts_everything(tiny, target_twin, K, verification):
  # alpha = 1 needs the bonus token (else rounds = n/K) and the draft's catch-up on x~_K after a full accept
  # (else its cache misses x~_K and it drifts from the target)
  stats = assert_greedy_identical(tiny["target"], target_twin, [5, 9, 2], K, n=100, verification=verification)
  assert stats.acceptance_rate == 1.0 and stats.rounds == math.ceil(100 / (K + 1))
  assert stats.sources["bonus"] == stats.rounds - (100 % (K + 1) != 0)

@pytest.mark.parametrize("verification", list(spec.RULES))
def test_draft_that_always_disagrees(tiny, tmp_path, verification):
  path, _ = autoregressive_generate(tiny["target"], [5, 9, 2], 200, eos=None)
  never = next(t for t in range(TINY["vocab_size"]) if t not in path)
  w = random_weights(TINY, seed=9)
  w["ln_f.weight"][:] = 0                                 # every position's final hidden state is ln_f.bias ...
  w["wte.weight"][never] = 100 * w["ln_f.bias"]           # ... so the draft's argmax is always `never`
  draft = load(write_checkpoint(tmp_path / "contrary", TINY, w))
  stats = assert_greedy_identical(tiny["target"], draft, [5, 9, 2], 4, verification=verification)
  assert stats.acceptance_rate == 0.0 and stats.rounds == 200

# ***** stopping *****

def test_exact_max_new_tokens(tiny, target_twin):
  for n in (1, 2, 7, 13):
    got, stats = speculative_generate(tiny["target"], target_twin, [5, 9, 2], 4, n, eos=None)
    assert got == autoregressive_generate(tiny["target"], [5, 9, 2], n, eos=None)[0] and stats.new_tokens == n

def test_eos_inside_an_accepted_block_ends_the_output(tiny, target_twin):
  path, _ = autoregressive_generate(tiny["target"], [5, 9, 2], 60, eos=None)
  # with draft = target every round keeps all K = 4; choose an EOS that first appears mid-block
  i = next(i for i, t in enumerate(path) if i % 5 not in (4,) and t not in path[:i])
  got, stats = speculative_generate(tiny["target"], target_twin, [5, 9, 2], 4, 60, eos=path[i])
  assert got == path[:i + 1]
  assert autoregressive_generate(tiny["target"], [5, 9, 2], 60, eos=path[i])[0] == got

def test_empty_prompt_starts_after_endoftext(docs_target, docs_draft):
  got, _ = speculative_generate(docs_target, docs_draft, [], 4, 20, eos=None)
  assert got == autoregressive_generate(docs_target, [models.EOT], 20, eos=None)[0]

# ***** the fast path: few host reads, nothing compiles after warm-up *****

@pytest.mark.backend
def test_host_syncs_per_round_and_no_compilation(docs_target, docs_draft, enc, monkeypatch):
  prompt = enc.encode(PROMPTS[0])
  for sampling in (Sampling(0.0), Sampling(0.8, 40, 0.9)):
    speculative_generate(docs_target, docs_draft, prompt, 4, 8, sampling, eos=None)   # warm-up
  reads, buffer = [], Tensor._buffer            # behind every read to the host: data(), tolist(), numpy(), item()
  monkeypatch.setattr(Tensor, "_buffer", lambda self: reads.append(1) or buffer(self))
  compiled = len(to_program_cache)
  # other positions, temperatures, top-k / top-p values and acceptance counts: no new kernel
  for sampling, seed in ((Sampling(0.0), 0), (Sampling(1.0, 20, 0.5), 1), (Sampling(0.6, 45, 0.95), 2)):
    reads.clear()
    _, stats = speculative_generate(docs_target, docs_draft, enc.encode(PROMPTS[1]), 4, 200, sampling, seed, eos=None)
    assert len(reads) <= 2 * stats.rounds, f"{len(reads)} host reads in {stats.rounds} rounds"
  assert len(to_program_cache) == compiled, "a 200-token run compiled kernels after warm-up"
  # nor does a compiled step copy from the host: a Tensor made from a Python list inside one is copied on every call
  # (two 8-byte copies per filtered warp did, 0.1 ms each on pocl). Steps that other tests made but never ran are not captured
  copying = [step.what for model in (docs_target, docs_draft) for step in model.jits.values() if step.captured is not None
             and any(call.src[0].op is Ops.COPY for call in step.captured.linear.src)]
  assert copying == [], f"steps that copy from the host on every call: {copying}"

def test_the_rounds_wait_for_the_device_only_at_their_host_read(tiny, monkeypatch):
  """No synchronization between a round's draft and its verify pass: one cost 6-12% a token on pocl (2026-11-26),
  as Python waited instead of enqueueing the verify step while the draft ran. The draft's costs are timed
  apart, before the rounds (Stats.draft_seconds)."""
  waits, rounds_began, synchronize, output = [], [], spec.synchronize, spec.Output
  monkeypatch.setattr(spec, "synchronize", lambda: waits.append(bool(rounds_began)) or synchronize())
  monkeypatch.setattr(spec, "Output", lambda *args: rounds_began.append(1) or output(*args))
  for T in (0.0, 1.0):
    waits.clear(); rounds_began.clear()
    _, stats = speculative_generate(tiny["target"], tiny["draft"], [5, 6, 7], 2, 12, Sampling(T), eos=None)
    assert stats.rounds > 1 and waits.count(True) == 1, f"{waits.count(True)} synchronizations in {stats.rounds} rounds"
    assert stats.t_draft == stats.draft_seconds[2] > 0

def test_t_draft_is_the_mean_over_the_rounds_drafted_tokens():
  stats = spec.Stats(draft_seconds={1: 0.004, 4: 0.002})
  for drafted in (1, 1, 4, 0): stats.add_round(drafted, 0)   # 0: prompt lookup found nothing
  assert stats.finish(time.perf_counter(), 7).t_draft == pytest.approx((2 * 0.004 + 4 * 0.002) / 6)

def test_a_rounds_tokens_reach_the_models_steps_as_variables(tiny, monkeypatch):
  """Every round's tokens reach the models' compiled steps as bound variables, whoever made them: a draft model's
  unseen ones, and the host's blocks (prompt lookup's, the baseline's token: target_verify_ids()). No round calls a JIT
  but the models' own steps (a compiled kernel writing the host's block cost 0.3-0.5 ms a round on a CPU)."""
  from tinygrad.engine.jit import _TinyJit
  called, emitted, tinygrad_call, emit = [], [], _TinyJit.__call__, spec.Output.emit
  def jit_call(self, *args, **kwargs):   # the JITs called once the rounds have begun (after the first emit)
    if emitted: called.append(self)
    return tinygrad_call(self, *args, **kwargs)
  def emitting(self, events):
    emitted.append(1)
    return emit(self, events)
  monkeypatch.setattr(_TinyJit, "__call__", jit_call)
  monkeypatch.setattr(spec.Output, "emit", emitting)
  target, draft = tiny["target"], tiny["draft"]
  runs = {"a draft model": lambda T: speculative_generate(target, draft, [5, 6, 7], 2, 12, Sampling(T), eos=None),
          "prompt lookup": lambda T: speculative_generate(target, PromptLookup(), [5, 6, 7, 5, 6], 2, 12, Sampling(T),
                                                          eos=None),
          "none": lambda T: autoregressive_generate(target, [5, 6, 7], 12, Sampling(T), eos=None)}
  for name, run in runs.items():
    for T in (0.0, 1.0):
      called.clear(), emitted.clear()
      assert len(run(T)[0]) == 12 and len(emitted) > 2
      steps = [getattr(s, "fn", s) for m in (target, draft) for s in m.jits.values()]
      assert all(any(j is s for s in steps) for j in called), f"{name}, T {T}: a JIT of its own in a round"

def test_the_hosts_ids_verify_as_the_same_block_on_the_device(tiny):
  """The verify step of the host's ids (target_verify_ids(): bound variables) returns what the step of the same block
  on the device with a one-hot p returns, to the bit: both rules, greedy and sampled, every width, several draws
  (tinygrad 0.14 compiled the token rule's acceptance kernel empty where it read the ids as variables)."""
  target = tiny["target"]
  for rule in spec.RULES:
    for T in (0.0, 1.0):
      verifier = spec.Verifier(target, Sampling(T), spec.seed_key(0), rule)
      for ids in ([9], [9, 10], [9, 10, 11]):
        for nonce in range(4):
          on_device = Tensor([ids], dtype=dtypes.int32).realize()
          got, expected = verifier(ids, None, 4, nonce).numpy(), verifier(on_device, None, 4, nonce).numpy()
          assert (got == expected).all(), f"{rule} rule, T {T}, block {ids}, nonce {nonce}"

@pytest.mark.backend
def test_a_later_run_loads_every_step_and_captures_none(tiny_dir, tmp_path, monkeypatch):
  """What a second `python spec.py` does: new model instances find every step of a generation stored by the first run
  (the draft's steps and the verify passes of each K of -K auto, the target's decode), capture none, and emit the same
  tokens. The prefill passes and the baseline's step are loaded too."""
  monkeypatch.setenv("SPEC_STEP_CACHE", str(tmp_path))
  def run():  # -K auto's choices follow measured times, so its tokens are not compared; fixed K's are
    target, draft = load(tiny_dir / "target"), load(tiny_dir / "draft")
    speculative_generate(target, draft, [5, 6, 7], "auto", 10, Sampling(1.0), eos=None)
    return ([speculative_generate(target, draft, [5, 6, 7], K, 20, Sampling(1.0), seed=3, eos=None)[0] for K in (1, 2, 4)],
            autoregressive_generate(target, [5, 6, 7], 10, Sampling(1.0), seed=3, eos=None)[0])
  first = run()
  captured = []
  monkeypatch.setattr(models.engine.store, "save", lambda jit, model, path: captured.append(path))
  assert run() == first
  assert captured == [], f"captured again: {captured}"

@pytest.mark.backend
def test_the_rounds_call_only_steps_that_warm_up_called_twice(tiny_dir, tmp_path, monkeypatch):
  """A step's first call captures it, or links a stored one (0.15 s on the shared pair), and its second is slower than
  the rest: both belong to warm-up, not to the timed rounds (a run that loaded its steps reported half its speed)."""
  monkeypatch.setenv("SPEC_STEP_CACHE", str(tmp_path))
  calls, at_start, call, output = collections.Counter(), [], models.engine.Step.__call__, spec.Output
  monkeypatch.setattr(models.engine.Step, "__call__", lambda self, *args: calls.update([self]) or call(self, *args))
  monkeypatch.setattr(spec, "Output", lambda *args: at_start.append(calls.copy()) or output(*args))  # the rounds begin
  for run in ("captured", "loaded"):
    target, draft = load(tiny_dir / "target"), load(tiny_dir / "draft")
    for generate in (lambda: speculative_generate(target, draft, [5, 6, 7], 2, 20, Sampling(1.0), eos=None),
                     lambda: speculative_generate(target, PromptLookup(), [5, 6, 5, 6], 2, 20, eos=None),
                     lambda: autoregressive_generate(target, [5, 6, 7], 10, Sampling(1.0), eos=None)):
      for _ in range(2):  # the second generation finds its steps warm
        generate()
        in_rounds = [(step.what, at_start[-1][step]) for step in calls if calls[step] > at_start[-1][step]]
        assert in_rounds and all(n >= 2 for _, n in in_rounds), f"{run}: the rounds' steps, called before them: {in_rounds}"

def test_a_generation_whose_steps_are_warm_runs_no_warm_up_round(tiny_dir, monkeypatch):
  """Warm-up runs rounds until every step the generation uses has run twice, and none once they have. A greedy draft
  model is one-hot like prompt lookup but always proposes K: warm-up waited for a one-token verify step of its rule
  that only the target's decode timing runs, so after a target-alone run (the token rule) it never came, and every
  later generation ran 4 warm-up rounds (gpt2-xl: ~0.4 s each)."""
  target, draft = load(tiny_dir / "target"), load(tiny_dir / "draft")
  rounds, warm_up_round = [], spec.warm_up_round
  monkeypatch.setattr(spec, "warm_up_round", lambda *args: rounds.append(args[3]) or warm_up_round(*args))
  generations = [lambda: autoregressive_generate(target, [5, 6, 7], 5, eos=None)]
  generations += [lambda s=s: speculative_generate(target, draft, [5, 6, 7], 2, 5, s, eos=None) for s in (Sampling(), Sampling(1.0))]
  for generate in generations: generate()
  rounds.clear()
  for generate in generations: generate()
  assert rounds == [], f"warm-up rounds (K) of generations whose steps are warm: {rounds}"

def test_a_steps_kernels_are_chosen_for_the_widths_of_its_passes(tiny_dir, monkeypatch):
  """The engine chooses kernels for the passes a step runs: the target's verify step of K+1 tokens for K+1 only, the
  draft's step for its first pass's width and one token (its later passes); the prefill's passes, whatever their
  width, for PREFILL_CHOICE tokens, the lm_head left out."""
  calls, choose = [], models.engine.choose_kernels
  def chosen(model, widths, head=True):
    calls.append((model, sorted(widths), head))
    return choose(model, widths, head)
  monkeypatch.setattr(models.engine, "choose_kernels", chosen)
  target, draft = load(tiny_dir / "target"), load(tiny_dir / "draft")
  speculative_generate(target, draft, [5, 6, 7], 2, 8, eos=None)
  prefill = ([models.engine.PREFILL_CHOICE], False)
  assert sorted(call[1:] for call in calls if call[0] is target) == sorted([([3], True), prefill])
  assert sorted(call[1:] for call in calls if call[0] is draft) == sorted([([1], True), ([1, 2], True), prefill])

def test_t_target_is_timed_where_the_target_alone_runs(tiny_dir):
  """A draft model's rounds never run the target's one-token step: a speculative run neither compiles it nor reports
  t_target (0; the theoretical speedup None; the summary says where it comes from). The target alone, prompt lookup's
  rounds without a match and a run after the target ran alone in the process time it."""
  target, draft = load(tiny_dir / "target"), load(tiny_dir / "draft")
  one_token = lambda: [key for key in target.jits if key[:2] in (("target_verify", 1), ("target_verify_ids", 1))]
  _, stats = speculative_generate(target, draft, [5, 6, 7], 2, 8, eos=None)
  assert one_token() == [] and stats.t_target == 0 and stats.theoretical_speedup is None
  assert "t_target: the target alone did not run (--compare runs it)" in spec.summary(stats)
  _, lookup = speculative_generate(target, PromptLookup(), [17], 2, 8, eos=None)
  assert one_token() and lookup.t_target > 0
  _, base = autoregressive_generate(target, [5, 6, 7], 8, eos=None)
  _, stats = speculative_generate(target, draft, [5, 6, 7], 2, 8, eos=None)
  assert stats.t_target == base.t_target == lookup.t_target and stats.theoretical_speedup > 0
  assert "theoretical speedup" in spec.summary(stats)

def test_auto_keeps_one_estimate_per_target_draft_and_choices(tiny_dir):
  """-K auto measures nothing at warm-up: its estimate comes from the rounds, kept per target, draft model (or none) and
  structural choices, so that a later run goes on from it; another draft or temperature starts its own."""
  target, draft, other = (load(tiny_dir / name) for name in ("target", "draft", "other"))
  rounds = lambda auto: sum(map(len, auto.kept.values()))
  def run(draft, T:float) -> tuple[spec.AutoLookahead, int]:
    stats = speculative_generate(target, draft, [5, 6, 7], "auto", 10, Sampling(T), eos=None)[1]
    assert stats.rounds == sum(stats.lookaheads.values())
    return stats.rounds
  n = run(draft, 1.0)
  (first,) = spec._auto[target].values()
  assert rounds(first) == n
  n += run(draft, 1.0) + run(draft, 1.0)
  assert len(spec._auto[target]) == 1 and rounds(first) == n
  for d, T in ((draft, 0.0), (other, 1.0), (PromptLookup(), 1.0), (PromptLookup(2), 1.0)): run(d, T)
  assert len(spec._auto[target]) == 4 and rounds(first) == n                  # the two lookups share theirs

def test_auto_goes_on_from_what_earlier_runs_measured(tiny_dir, monkeypatch):
  """-K auto's second run with a pair starts at the K the first one found best, not by trying every K again (a fresh
  estimate per run spent each prompt's first rounds on K it then left). The rounds' costs are given, 1 ms + 0.1 ms a
  drafted token, so that the choice does not hang on this machine's timings: K 8 keeps 9 tokens at the best rate."""
  target, same = (load(tiny_dir / "target") for _ in range(2))        # a draft equal to its target keeps everything
  chosen, choose, update = [], spec.AutoLookahead.choose, spec.AutoLookahead.update
  monkeypatch.setattr(spec.AutoLookahead, "choose", lambda self: chosen.append(choose(self)) or chosen[-1])
  monkeypatch.setattr(spec.AutoLookahead, "update", lambda self, K, tokens, seconds, drafted=None:
                      update(self, K, tokens, 1e-3 * (1 + 0.1 * K), drafted))
  for n in (100, 40):                  # the first: 3 rounds of each K in turn (57 tokens), then K 8
    chosen.append(None)
    speculative_generate(target, same, [5, 6, 7], "auto", n, eos=None)
  first, second = chosen[1:chosen.index(None, 1)], chosen[chosen.index(None, 1) + 1:]
  assert first[:12] == list(spec.LOOKAHEADS) * 3 and set(first[12:]) == set(second) == {8}, chosen

def test_same_seed_same_output_other_seed_other_output(docs_target, docs_draft, enc):
  prompt, s = enc.encode(PROMPTS[2]), Sampling(1.0)   # K 2: the statistical tests' steps, captured once
  a, b, c = (speculative_generate(docs_target, docs_draft, prompt, 2, 30, s, seed)[0] for seed in (7, 7, 8))
  assert a == b and a != c

# ***** statistics: the first three tokens of speculative vs target-only sampling *****

def test_chi2_sf_known_values():
  assert abs(chi2_sf(3.841459, 1) - 0.05) < 1e-6 and abs(chi2_sf(18.307038, 10) - 0.05) < 1e-6
  assert abs(chi2_sf(2.0, 4) - 0.7357589) < 1e-6

def homogeneity_p(a:list, b:list) -> float:
  """Two-sample chi-square test of one token position; tokens seen < 10 times in all are pooled."""
  cats = sorted(set(a) | set(b))
  ca, cb = np.array([a.count(t) for t in cats]), np.array([b.count(t) for t in cats])
  rare = ca + cb < 10
  ca, cb = np.append(ca[~rare], ca[rare].sum()), np.append(cb[~rare], cb[rare].sum())
  keep = ca + cb > 0
  table = np.stack([ca[keep], cb[keep]])
  if table.shape[1] < 2: return 1.0
  expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
  return chi2_sf(float(((table - expected) ** 2 / expected).sum()), table.shape[1] - 1)

def first_tokens(fn, n:int) -> list[tuple]: return [tuple(fn(seed)[0]) for seed in range(n)]

_target_samples: dict = {}
def same_distribution(docs_target, docs_draft, prompt, sampling, n, K=2, verification="block") -> float:
  """The smallest p-value over the three positions, Bonferroni-corrected."""
  spec_ = first_tokens(lambda s: speculative_generate(docs_target, docs_draft, prompt, K, 3, sampling, 10_000 + s, eos=None,
                                                      verification=verification), n)
  key = (id(docs_target), tuple(prompt), sampling, n)     # the target alone: the same samples for every test that asks
  if key not in _target_samples:
    _target_samples[key] = first_tokens(lambda s: autoregressive_generate(docs_target, prompt, 3, sampling, s, eos=None), n)
  base = _target_samples[key]
  return min(3 * homogeneity_p([x[i] for x in spec_], [x[i] for x in base]) for i in range(3))

# The prompt makes the first token uncertain (~10 likely tokens), so a biased sampler shows within a few hundred draws.
STAT_PROMPT = "The"

@pytest.mark.parametrize("sampling,verification", [pytest.param(Sampling(1.0), "block", marks=pytest.mark.backend),
                                                    pytest.param(Sampling(1.0), "token", marks=pytest.mark.backend),
                                                    (Sampling(0.7, top_k=50, top_p=0.9), "block")],
                         ids=["T1-block", "T1-token", "T0.7-topk-topp-block"])
def test_statistically_the_target_distribution(docs_target, docs_draft, enc, sampling, verification):
  assert same_distribution(docs_target, docs_draft, enc.encode(STAT_PROMPT), sampling, 120, verification=verification) > 1e-3

def lenient(factor, verification):
  """Negative controls. Token: acceptance min(1, factor q/p), i.e. r ~ U[0, 1/factor] (the seed's 'dumbed down' sampler).
  Block (factor 1e9 only): every prefix may stop (h = 1), so the whole block is always kept. Always accepting makes
  the first token p-distributed under either rule, the bias whose detection test_power_of_the_statistical_test measures."""
  if verification == "token":
    return "acceptance", lambda p, q, x, rule=spec.acceptance: (lambda qx, px: (qx * factor, px))(*rule(p, q, x))
  def always_stop(p, q, x, block_acceptance=spec.block_acceptance):
    """h = 1, odds 1 : 0, written as the rule writes h_0: constant tensors here left a kernel without a buffer its call
    passes, which CUDA rejects (docs/backends.md)."""
    w, m, slack = block_acceptance(p, q, x)
    every = Tensor.arange(x.shape[0] + 1) >= 0
    return w, every.where(1, m), every.where(0, slack)
  return "block_acceptance", always_stop

def forget_verification(model):  # the next round re-traces verify(), with whatever rule spec has now
  for key in [k for k in model.jits if k[0] in (spec.target_verify.__name__, spec.target_verify_ids.__name__)]:
    del model.jits[key]

CONTROLS = [(1e9, 120), (2.0, 1000)]   # (factor, samples): the fast control in CI, the seed's U[0, 0.5] one marked slow

@pytest.mark.parametrize("factor,n,verification", [pytest.param(*CONTROLS[0], "token", marks=pytest.mark.backend),
                                                   pytest.param(*CONTROLS[0], "block", marks=pytest.mark.backend),
                                                   pytest.param(*CONTROLS[1], "token", marks=pytest.mark.slow)],
                         ids=["always-accept-token", "always-accept-block", "U0-0.5-token"])
def test_statistical_test_detects_lenient_acceptance(docs_target, docs_draft, enc, monkeypatch, factor, n, verification):
  monkeypatch.setattr(spec, *lenient(factor, verification))
  monkeypatch.setenv("SPEC_STEP_CACHE", "")  # stored steps are keyed by the code on disk, which a monkeypatch leaves as is
  forget_verification(docs_target)
  try: assert same_distribution(docs_target, docs_draft, enc.encode(STAT_PROMPT), Sampling(1.0), n, verification=verification) < 1e-3
  finally: forget_verification(docs_target)

@pytest.mark.slow
@pytest.mark.parametrize("sampling", [Sampling(1.0), Sampling(0.7), Sampling(1.0, top_k=20), Sampling(1.0, top_p=0.8)],
                         ids=["T1", "T0.7", "topk", "topp"])
def test_statistically_the_target_distribution_large(docs_target, docs_draft, enc, sampling):
  assert same_distribution(docs_target, docs_draft, enc.encode(STAT_PROMPT), sampling, 800, K=4) > 1e-3

def test_power_of_the_statistical_test(docs_target, docs_draft, enc):
  """The controls' sample sizes detect their bias with probability >= 0.8: the first token's exact distribution under
  each lenient rule, min(p, f q) + (1 - sum min(p, f q)) norm(max(0, q - p)), against q, through the same test
  (position 1 alone: the test on three positions rejects at least as often)."""
  prompt, rng = Tensor([enc.encode(STAT_PROMPT)]), np.random.default_rng(0)
  q, p = (m.forward(prompt, 0)[-1].softmax().numpy().astype(np.float64) for m in (docs_target, docs_draft))
  q, p = q / q.sum(), p / p.sum()
  residual = np.maximum(q - p, 0) / np.maximum(q - p, 0).sum()
  for factor, n in CONTROLS:
    kept = np.minimum(p, factor * q)
    biased = kept + (1 - kept.sum()) * residual
    power = np.mean([3 * homogeneity_p(list(rng.choice(len(q), n, p=biased)), list(rng.choice(len(q), n, p=q))) < 1e-3
                     for _ in range(200)])
    assert power >= 0.8, f"factor {factor}, {n} samples: power {power}"

@pytest.mark.parametrize("request_,words", [
  (dict(prompt_tokens=[5, -1]), "prompt token -1 is outside"),   # tinygrad's embedding would give a zero row, silently
  (dict(prompt_tokens=[64]), "prompt token 64 is outside"),
  (dict(seed=-1), "seed must be in [0, 2**64)"), (dict(seed=2**64), "seed must be in [0, 2**64)")])
def test_bad_requests_raise_before_any_work(tiny, request_, words):
  request_ = {"prompt_tokens": [5], "max_new_tokens": 4, **request_}
  with pytest.raises(ValueError, match=re.escape(words)): speculative_generate(tiny["target"], tiny["draft"], **request_)
  with pytest.raises(ValueError, match=re.escape(words)): autoregressive_generate(tiny["target"], **request_)

# ***** prompt lookup (--draft ngram) and -K auto *****

def test_prompt_lookup_proposals():
  look = PromptLookup(ngram_max=3, ngram_min=1)
  assert look.lookup([7, 1, 2, 3, 9, 9, 5, 1, 2, 3], 2) == [9, 9]            # the longest suffix first (3 tokens)
  assert look.lookup([1, 2, 8, 4, 1, 2, 6, 5, 2], 2) == [6, 5]               # the most recent occurrence of [2]
  assert look.lookup([4, 5, 6, 7], 3) == []                                  # no earlier occurrence at all
  assert PromptLookup(3, 2).lookup([1, 2, 8, 3, 2], 2) == []                 # [2] alone is shorter than ngram_min
  assert look.lookup([1, 2, 3, 1, 2], 4) == [3, 1, 2, 3]                     # runs on into the repetition it found
  assert look.lookup([5, 0, 0], 3) == [0, 0, 0]
  with pytest.raises(ValueError): PromptLookup(2, 3)

REPEATED = "A dictionary is a mapping. A dictionary is a mapping. A dictionary is"

@pytest.mark.parametrize("K", [1, 4, "auto"])
def test_prompt_lookup_greedy_identity(docs_target, enc, K):
  for prompt in (REPEATED, PROMPTS[0], PROMPTS[3]):
    stats = assert_greedy_identical(docs_target, PromptLookup(), enc.encode(prompt), K, n=100)
    assert stats.draft_passes == 0 and stats.drafted == sum(k * n for k, n in stats.lookaheads.items())

def test_prompt_lookup_accepts_most_of_a_repeated_block(docs_target, enc):
  _, stats = speculative_generate(docs_target, PromptLookup(), enc.encode(REPEATED), 4, 64, eos=None)
  assert stats.acceptance_rate > 0.5 and stats.tokens_per_round > 2, stats

def test_prompt_lookup_without_a_match_is_one_target_step(tiny):
  # a prompt of one token: nothing to look up until the output repeats; those rounds are single target steps
  got, stats = speculative_generate(tiny["target"], PromptLookup(), [17], 4, 30, eos=None)
  assert got == autoregressive_generate(tiny["target"], [17], 30, eos=None)[0]
  assert stats.lookaheads[0] == stats.sources["target"] >= 1 and set(stats.lookaheads) <= {0, 4}

@pytest.mark.backend
def test_greedy_model_draft_and_prompt_lookup_share_a_verify_step(tiny, target_twin):
  # greedy, both drafts are one-hot on their block, so the target's one compiled verify step per K serves both: the
  # blocks they hand it must have one layout (a JIT called with another raises), in either order
  for first, then in ((tiny["draft"], PromptLookup()), (PromptLookup(), tiny["draft"])):
    target = target_twin if first is tiny["draft"] else tiny["target"]
    for draft in (first, then): assert_greedy_identical(target, draft, [5, 9, 2, 5, 9], 3, n=40)

def simulated_auto(kept:list[float], costs:dict[int, float], by_position:bool, n:int=3000, seed:int=0) -> float:
  """-K auto over n simulated rounds: the expected tokens per second of the K it chose, over the best fixed K's. A
  round with K keeps its i-th draft with probability kept[i] once it kept the ones before (block verification's rates
  grow with i), and costs costs[K] times a log-normal factor (sigma 0.2), 20 times that in 1% of rounds (a stall)."""
  rng, auto, chosen = np.random.default_rng(seed), spec.AutoLookahead(by_position), collections.Counter()
  expected = {K: 1 + sum(math.prod(kept[:i + 1]) for i in range(K)) for K in spec.LOOKAHEADS}
  for _ in range(n):
    chosen[K := auto.choose()] += 1
    n_kept = next((i for i in range(K) if rng.random() >= kept[i]), K)
    auto.update(K, n_kept + 1, costs[K] * rng.lognormal(0, 0.2) * (20 if rng.random() < 0.01 else 1))
  rate = sum(n * expected[K] for K, n in chosen.items()) / sum(n * costs[K] for K, n in chosen.items())
  return rate / max(expected[K] / costs[K] for K in spec.LOOKAHEADS)

# round costs (ms): gpt2-xl/gpt2 on pocl, the deep pair (its passes on 2026-11-25), a draft a third as dear as its target
COSTS = {"gpt2-xl": {K: 25 * K + t for K, t in zip(spec.LOOKAHEADS, (270, 290, 350, 550))},
         "deep": {K: 4.5 * K + t for K, t in zip(spec.LOOKAHEADS, (21.3, 25.5, 31.1, 32.3))},
         "dear draft": {K: 3.3 * K + 10 + K for K in spec.LOOKAHEADS}}
# kept rates: every draft alike, as the seed's r' at K 4 (0.895) and lower; rising with the position, as block
# verification's on the deep pair at T 1, and flatter, as at T 0
KEPT = {"0.6": [0.6] * 8, "seed": [0.895] * 8, "rising": [0.55, 0.65, 0.75, 0.8, 0.85, 0.85, 0.85, 0.85],
        "flat": [0.6, 0.65, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7]}

@pytest.mark.parametrize("costs", COSTS)
@pytest.mark.parametrize("kept", KEPT)
@pytest.mark.parametrize("by_position", [False, True], ids=["per-K", "by-position"])
def test_auto_runs_within_5_percent_of_the_best_fixed_K(costs, kept, by_position):
  """Issue 39's aim as a property of the chooser, on simulated rounds (seed 0): its expected tokens per second
  against the best fixed K's, its exploration and noisy, stalling rounds included, with either estimate of the tokens
  kept. (Over seeds 0-5 the worst of these cases is 0.954 per K, 0.968 by position; a draft that costs nothing, where
  K 8's tokens vary most, can take thousands of rounds to find it.)"""
  assert simulated_auto(KEPT[kept], COSTS[costs], by_position) >= 0.95

def test_auto_by_position_learns_every_K_from_each_round():
  """Where a draft's fate does not depend on K, a round with K 4 informs K 1 and 2: the rate at which each draft was
  kept once reached, over the rounds; a round whose drafts ran out (prompt lookup found 2 of 4) rejected none."""
  auto = spec.AutoLookahead(by_position=True)
  for tokens in (5, 3, 1, 5): auto.update(4, tokens, 1.0)   # rates: draft 1 3/4, 2 3/3, 3 2/3, 4 2/2
  assert [auto.expected_tokens(K) for K in (1, 2, 4)] == pytest.approx([1.75, 2.5, 3.5])   # K 4: the rounds' mean
  auto.update(4, 3, 1.0, drafted=2)
  assert auto.expected_tokens(2) == pytest.approx(1 + 0.8 + 0.8) and auto.expected_tokens(4) == pytest.approx(2.6 + 1.6 * 2 / 3)

@pytest.mark.parametrize("T,rule,by_position", [(0.0, "block", True), (0.0, "token", True), (1.0, "token", True),
                                                (1.0, "block", False)])
def test_auto_pools_the_rounds_where_a_drafts_fate_does_not_depend_on_K(tiny, T, rule, by_position):
  """Greedy (either rule) and the token rule keep the i-th draft by its own test; block verification at T > 0 judges
  the block as a whole, so its tokens are counted per K."""
  spec._auto.pop(tiny["target"], None)
  spec.speculative_generate(tiny["target"], tiny["draft"], [5, 9, 2], "auto", 4, Sampling(T), eos=None, verification=rule)
  assert [a.by_position for a in spec._auto[tiny["target"]].values()] == [by_position]

def test_auto_leaves_a_K_that_got_worse():
  """The estimate follows the rounds: when K 8's rounds start costing 4 times as much (another process took the
  machine's bandwidth), -K auto moves off it within a few hundred rounds."""
  auto, rng = spec.AutoLookahead(), np.random.default_rng(0)
  costs = {K: 1.0 + 0.05 * K for K in spec.LOOKAHEADS}
  for i in range(1500):
    if i == 500: costs[8] *= 4
    K = auto.choose()
    auto.update(K, next((j for j in range(K) if rng.random() >= 0.9), K) + 1, costs[K])
    if i == 499: assert max(spec.LOOKAHEADS, key=auto.tokens_per_second) == 8
  assert max(spec.LOOKAHEADS, key=auto.tokens_per_second) == 4

def test_auto_lookahead_greedy_identity_and_report(docs_target, docs_draft, enc):
  stats = assert_greedy_identical(docs_target, docs_draft, enc.encode(PROMPTS[4]), "auto", n=100)
  assert stats.K == "auto" and set(stats.lookaheads) <= set(spec.LOOKAHEADS)
  assert sum(stats.lookaheads.values()) == stats.rounds and stats.drafted == sum(k * n for k, n in stats.lookaheads.items())

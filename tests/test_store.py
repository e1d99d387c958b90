"""Stored steps: a step loaded from the store computes what a fresh capture computes, in any process, beside any other."""
import json, os, subprocess, sys
import numpy as np
import pytest
from tinygrad import Tensor, dtypes
from tinygrad.uop.ops import Ops
import models, spec
from models import GPT2
from models.engine import store
from models.engine.choice import CHOSEN, TINYGRAD, Way
import conftest
from conftest import ROOT, TINY, load, random_weights, write_checkpoint

pytestmark = pytest.mark.backend

# one process of a sequence sharing a store: its generations' tokens and accepted counts, as JSON
RUN = """
import json, sys
sys.path.insert(0, sys.argv[1])
import models, spec
target, draft = (models.load(path, sys.argv[2]) for path in sys.argv[3:5])
out = []
for K in json.loads(sys.argv[5]):
  for sampling in (spec.Sampling(0.0), spec.Sampling(1.0)):
    tokens, stats = spec.speculative_generate(target, draft, [5, 6, 7], K, 16, sampling, seed=1, eos=None)
    out.append([tokens, stats.accepted])
print(json.dumps(out))
"""

def generations(target, draft, Ks) -> list:
  """RUN's generations in this process, every step captured afresh: what each process of a sequence must give."""
  target, draft = load(target), load(draft)
  return [[tokens, stats.accepted] for K in Ks for sampling in (spec.Sampling(0.0), spec.Sampling(1.0))
          for tokens, stats in [spec.speculative_generate(target, draft, [5, 6, 7], K, 16, sampling, seed=1, eos=None)]]

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """tiny_dir's kind of pair, and a deeper target and draft of the same width: another model's buffers, in more numbers."""
  root = tmp_path_factory.mktemp("store")
  deep = dict(TINY, n_layer=4)
  for name, cfg, seed in (("target", TINY, 1), ("draft", TINY, 2), ("deep", deep, 4), ("deep-draft", deep, 5)):
    write_checkpoint(root / name, cfg, random_weights(cfg, seed))
  return root

def test_stored_and_captured_steps_mix_in_a_process(checkpoints, tmp_path, monkeypatch):
  """Issue 36 on small models: processes that share a store, each loading some steps another stored and capturing the
  rest, emit what processes capturing everything emit (greedy and T 1, tokens and accepted counts). A loaded step's
  intermediate buffers kept the storing process's numbers, and tinygrad interns buffers by number and size: they were
  this process's buffers of that number, another model's weights among them, so the draft proposed garbage and the
  target's weights were overwritten. The second process loads the draft's K 4 steps and captures its K 2 ones and every
  verify step of a deeper target; the third loads the target's verify steps and captures a deeper draft's."""
  monkeypatch.setenv("SPEC_STEP_CACHE", "")
  sequence = [("target", "draft", [4]), ("deep", "draft", [4, 2]), ("target", "deep-draft", [4])]
  expected = [generations(checkpoints / t, checkpoints / d, Ks) for t, d, Ks in sequence]
  for t, d, Ks in sequence:
    run = subprocess.run([sys.executable, "-c", RUN, str(ROOT), conftest.DTYPE, str(checkpoints / t), str(checkpoints / d),
                          json.dumps(Ks)], env={**os.environ, "SPEC_STEP_CACHE": str(tmp_path)},
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout) == expected[sequence.index((t, d, Ks))], f"{t} with {d}, K {Ks}, after the earlier processes"

def step_buffers(step) -> set:
  """The BUFFER UOps a captured step's kernels read and write."""
  return {u for call in step.captured.linear.src for u in call.toposort() if u.op is Ops.BUFFER and u.arg.device is not None}

KINDS = {  # a step of each kind a generation runs: (model, drafter of it), how to run one round of it
  "draft greedy": (spec.Sampling(0.0), "draft"), "draft T 0.8 top-k top-p": (spec.Sampling(0.8, 20, 0.9), "draft"),
  "verify greedy": (spec.Sampling(0.0), "verify"), "verify T 1 block": (spec.Sampling(1.0), "verify"),
  "verify T 1 token, the host's one-hot draft": (spec.Sampling(1.0), "token"), "decode": (None, "decode"),
  "prefill": (None, "prefill")}

def run_step(model, kind:str, key):
  """One call of the step of this kind on model, from the same inputs and state; its outputs and the step."""
  sampling, what = KINDS[kind]
  model.prefill([5, 6, 7, 8])
  if what == "prefill":
    model.prefill([5, 6, 7, 8] + list(range(9, 17)))
    return model([17], 12).numpy(), model.jit(GPT2.fill, 16)   # 12 tokens: one padded pass of 16
  if what == "decode": return model([9], 4).numpy(), model.jit(GPT2.forward, 1)
  if what == "draft":
    drafter = spec.ModelDraft(model, sampling, key)
    drafter.fed = 4
    block, p = drafter.propose([5, 6, 7, 8, 9], 3, nonce=4)
    return [block.numpy()] + ([] if p is None else [p.numpy()]), model.jit(spec.propose, 1, K=3, **sampling.static)
  verifier = spec.Verifier(model, sampling, key, "token" if what == "token" else "block")
  if what == "token":   # a one-hot draft of the host's (prompt lookup): its ids bound variables
    return verifier([9, 10, 11, 12], None, 4, nonce=5).numpy(), verifier.step(4, True, ids=True)
  one_hot = sampling.temperature == 0
  tokens = lambda ids: Tensor([ids], dtype=dtypes.int32).realize()
  p = None if one_hot else spec.warp(spec.padded(model.forward(tokens([9, 10, 11]), 4)), *sampling.tensors(64),
                                     filters=()).realize()
  result = verifier(tokens([9, 10, 11, 12]), p, 4, nonce=5)
  return result.numpy(), verifier.step(4, one_hot)

@pytest.mark.parametrize("kind", list(KINDS))
def test_a_loaded_step_owns_its_buffers_and_computes_what_a_capture_does(tiny_dir, tmp_path, monkeypatch, kind):
  """A step loaded while the step that stored it still lives (so that its stored buffer numbers are live ones here, as in
  any later process where other buffers took those numbers) shares no buffer with it but the model's weights and KV
  cache, and given the same inputs and state its outputs equal a fresh capture's bit for bit."""
  monkeypatch.setenv("SPEC_STEP_CACHE", str(tmp_path))
  key = spec.seed_key(3)
  storing = load(tiny_dir / "target")
  stored, storing_step = run_step(storing, kind, key)
  assert storing_step.path.is_file() and storing_step.captured is not None
  loading = load(tiny_dir / "target")
  loaded, loaded_step = run_step(loading, kind, key)
  assert loaded_step.calls == 1 and loaded_step.fn is not storing_step.fn and loaded_step.captured is not None
  state = set(store.state_uops(storing).values()) | set(store.state_uops(loading).values())
  shared = (step_buffers(loaded_step) & step_buffers(storing_step)) - state
  assert not shared, f"{kind}: a loaded step shares {len(shared)} buffers with the step that stored it"
  monkeypatch.setenv("SPEC_STEP_CACHE", "")
  fresh, fresh_step = run_step(load(tiny_dir / "target"), kind, key)
  assert fresh_step.path is None
  for a, b, c in zip(*(x if isinstance(x, list) else [x] for x in (stored, loaded, fresh))):
    np.testing.assert_array_equal(b, c), np.testing.assert_array_equal(a, c)

# a process running a draft equal to its target: its acceptance rates (greedy, T 1) and the steps it captured, as JSON
TWIN = """
import json, sys
sys.path.insert(0, sys.argv[1])
import models, spec
from models.engine import store
captured, save = [], store.save
store.save = lambda jit, model, path: captured.append(path.name) or save(jit, model, path)
twin, draft = (models.load(sys.argv[3], sys.argv[2]) for _ in range(2))
rates = [spec.speculative_generate(twin, draft, [5, 6, 7], 4, 30, s, seed=1, eos=None)[1].acceptance_rate
         for s in (spec.Sampling(0.0), spec.Sampling(1.0))]
print(json.dumps([rates, captured]))
"""

def test_a_draft_equal_to_its_target_accepts_everything_from_stored_steps(tiny_dir, tmp_path):
  """Every drafted token is kept when the draft is the target, also when both models' steps come from the store (stored
  by another process): a loaded draft step that computes anything else shows as a rejection. The loading process is a
  fresh one, as a later run is."""
  env = {**os.environ, "SPEC_STEP_CACHE": str(tmp_path)}
  def twin() -> tuple[list, list]:
    run = subprocess.run([sys.executable, "-c", TWIN, str(ROOT), conftest.DTYPE, str(tiny_dir / "target")], env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)
  rates, stored = twin()
  assert rates == [1.0, 1.0] and stored, (rates, stored)
  rates, captured = twin()
  assert rates == [1.0, 1.0], rates
  assert captured == [], f"captured, not loaded: {captured}; stored before: {sorted(set(captured) & set(stored))}"

SAME_FILE = """
import json, os, subprocess, sys
from tinygrad import Device, dtypes
import models, spec
from models.engine import store
model = models.GPT2(models.GPT2Config(n_layer=1, n_head=1, n_embd=8, vocab_size=8), dtypes.float32)
where = lambda: str(store.step_path(store.step_name(model, spec.target_verify, ("target_verify", 3), 0)))
if sys.argv[1:] == ["child"]: print(where())
else:
  Device.DEFAULT   # the device picked: tinygrad writes it into the environment for children, DEV's value stays unset
  child = subprocess.run([sys.executable, "-c", __doc__, "child"], capture_output=True, text=True, check=True)
  print(json.dumps([where(), child.stdout.strip()]))
"""

def test_a_process_and_its_children_name_a_step_alike_with_dev_unset():
  """With DEV unset a process picks a device and tinygrad writes it into the environment, not into DEV's setting: a
  child then saw DEV set, its parent unset, their step files differed, and every step a child stored was captured
  again (the README's test command on pocl, test_a_draft_equal_to_its_target_... in a full run)."""
  env = {k: v for k, v in os.environ.items() if k != "DEV"} | {"SPEC_STEP_CACHE": "/nonexistent-store",
                                                               "PYTHONPATH": str(ROOT)}
  script = f"__doc__ = {SAME_FILE!r}\n" + SAME_FILE
  out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-2000:]
  parent, child = json.loads(out.stdout.splitlines()[-1])
  assert parent == child, (parent, child)

def test_a_step_is_named_by_the_kernels_chosen_for_it(tiny_dir, monkeypatch):
  """A step's name holds the kernel choices it was captured with (engine.choose_kernels()): two processes that measured
  different winners (a close race, a busy machine) capture kernels that sum in another order, and one loading the
  other's step ran kernels other than its own choices (the replay test then differed from tinygrad's executor in the
  last bits). The same choices name the same file."""
  monkeypatch.setenv("SPEC_STEP_CACHE", "/nonexistent-store")
  model = load(tiny_dir / "target")
  files = {}
  engines = {"linear": Way("lanes", "lanes"), "attention": Way("rows"), "norm": Way("row")}
  for chosen in ("tinygrad", "engine", "tinygrad"):
    with CHOSEN.fixed(lambda kind, key: TINYGRAD if chosen == "tinygrad" else engines[kind]):
      files.setdefault(chosen, set()).add(str(model.jit(spec.target_verify, 3, one_hot=True, greedy=True, filters=()).path))
    model.jits.clear()
  assert all(len(f) == 1 for f in files.values()) and files["tinygrad"] != files["engine"], files

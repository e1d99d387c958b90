"""Shared fixtures: the offline data in ../shared/models, tiny random checkpoints, and an independent numpy GPT-2.

The device is tinygrad's, chosen by DEV as for users; --dtype float16 runs the models in half precision (CI runs the
tests marked `backend` on a second device, in both dtypes)."""
import atexit, os, pathlib, shutil, sys, tempfile
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "models"
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]   # the product, and the tools some tests run
# offline: the shared copy of the tokenizer, also where the environment names a cache of its own (which may lack it)
if (SHARED / "tiktoken").is_dir(): os.environ["TIKTOKEN_CACHE_DIR"] = str(SHARED / "tiktoken")
# captured steps (models/gpt2.py, Step) go to a store of the run's own, never the user's: a run of the suite captures
# each step once (pytest-xdist's workers inherit the store its controller made), and no step stored by other code is
# loaded; removed at the end (about 100 MB)
if "PYTEST_XDIST_WORKER" not in os.environ:
  os.environ["SPEC_STEP_CACHE"] = tempfile.mkdtemp(prefix="spec-steps-")
  atexit.register(shutil.rmtree, os.environ["SPEC_STEP_CACHE"], ignore_errors=True)
  # measured choices too: the workers' timings share the cores, and a user's later runs would keep the kernels that won
  # there (docs/engine.md)
  os.environ["SPEC_CHOICES"] = os.path.join(os.environ["SPEC_STEP_CACHE"], "choices.db")
  # pocl's kernel cache, one a worker: workers building the same kernel at once in one cache made a program binary
  # without its kernels' metadata, and loading it aborted a worker (pocl 3.1's assertion `len > 0`, docs/tests.md)
  os.environ["POCL_CACHE_DIR"] = tempfile.mkdtemp(prefix="spec-pocl-")
  atexit.register(shutil.rmtree, os.environ["POCL_CACHE_DIR"], ignore_errors=True)
elif "POCL_CACHE_DIR" in os.environ:
  os.environ["POCL_CACHE_DIR"] = os.path.join(os.environ["POCL_CACHE_DIR"], os.environ["PYTEST_XDIST_WORKER"])

# every kernel a test compiles is checked by tinygrad's code generator, which proves each load and store index inside its
# buffer (CHECK_OOB=1, with the z3 solver): an out-of-bounds access fails its test as it compiles, not only when it
# happens to touch an unmapped page (tools/kernel_bounds.py, README Tests)
os.environ.setdefault("CHECK_OOB", "1")
# pytest-xdist's workers fill the cores already: tinygrad's compile pool (PARALLEL: one spawned process a worker there)
# would add its pickling and nothing in parallel (docs/tests.md)
os.environ.setdefault("PARALLEL", "0")
import models  # noqa: E402
# an interpreter's timings choose arbitrarily (the GPU suite's emulated device): the engine's kernels wherever they fit,
# nothing measured (a choice there ran each candidate in every form a block runs: most of the suite's time), and where
# a test measures a choice itself, each candidate timed by one call, not 3, and no cache flushed before it (a sum over
# 256 MB, hours in the interpreter)
INTERPRETER = os.environ.get("DEV", "").startswith("PYTHON")
if INTERPRETER:
  measured_best = models.engine.choice.best_seconds
  models.engine.choice.best_seconds = lambda fn, reps=3, before=None: measured_best(fn, 1)

@pytest.fixture(scope="session", autouse=True)
def interpreter_kernels():
  if not INTERPRETER: yield; return
  with models.engine.engine_kernels(): yield

from self_check import chi2_sf, np_gpt2_logits, random_gpt2, read_safetensors, write_checkpoint, write_safetensors  # noqa
from benchmark import PROMPTS  # noqa: E402,F401  (the shared pair's prompts, the benchmarks' and the tests')

def pytest_addoption(parser):
  parser.addoption("--dtype", choices=["float32", "float16"], default="float32", help="precision the models are loaded in")

DTYPE = "float32"
def pytest_configure(config):
  global DTYPE
  DTYPE = config.getoption("--dtype")

@pytest.hookimpl(tryfirst=True)   # before -m selects
def pytest_collection_modifyitems(items):
  for item in items:
    if "slow" not in item.keywords: item.add_marker(pytest.mark.full)

# logits agree with the float64 numpy GPT-2 to this fraction of the logit scale. Measured worst cases (tiny and shared
# checkpoints): float32 2e-6; float16 weights, activations and KV cache (10-bit mantissa) 3.3e-3
TOLERANCE = {"float32": 1e-4, "float16": 1e-2}
def tolerance() -> float: return TOLERANCE[DTYPE]
def dtype() -> str: return DTYPE

def load(path, **kw) -> models.GPT2:
  """A checkpoint in the suite's dtype."""
  return models.load(str(path), DTYPE, **kw)

def shared_dir() -> pathlib.Path:
  """../shared/models, or a skip on a user's clone without it; under CI its absence is a failure."""
  if not (SHARED / "docs-target" / "model.safetensors").is_file():
    if os.environ.get("CI") == "true": pytest.fail(f"{SHARED} is missing: CI must have ../shared beside the checkout")
    pytest.skip(f"{SHARED} is not here")
  return SHARED

@pytest.fixture(scope="session")
def docs_target(): return load(shared_dir() / "docs-target")

@pytest.fixture(scope="session")
def docs_draft(): return load(shared_dir() / "docs-draft")

@pytest.fixture(scope="session")
def enc():
  shared_dir()
  return models.tokenizer()

# ***** tiny checkpoints in the Hugging Face layout *****

def random_weights(cfg:dict, seed:int, scale:float=0.3) -> dict[str, np.ndarray]:
  """GPT-2 weights as Hugging Face stores them: Conv1D kernels (in, out), the causal-mask buffers, no lm_head."""
  return random_gpt2(seed, cfg, scale=scale, masks=True)

TINY = dict(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=256)

@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
  """A tiny random target, and drafts: a noisy copy of it (agrees often, not always) and an unrelated one."""
  root = tmp_path_factory.mktemp("tiny")
  target = random_weights(TINY, seed=1)
  rng = np.random.default_rng(2)
  noisy = {k: v + (rng.standard_normal(v.shape) * 0.15).astype(np.float32) if "attn.bias" not in k else v for k, v in target.items()}
  write_checkpoint(root / "target", TINY, target)
  write_checkpoint(root / "draft", TINY, noisy)
  write_checkpoint(root / "other", TINY, random_weights(TINY, seed=3))
  return root

"""Captured steps stored on disk, so that a later process loads a step instead of lowering its kernels again.

A file holds a pickled TinyJit: kernels and the layout of intermediate buffers, with the model's weights and KV cache
written as their names, so a loaded step runs on the loading model's own. The name hashes everything the kernels depend
on (step_name()). docs/engine.md says where the files go and how to clear them.
"""
from __future__ import annotations
import hashlib, importlib.metadata, inspect, os, pathlib, pickle
from tinygrad import UOp, Device
from models.engine import internals
from models.engine.internals import get_state_dict

def state_uops(model) -> dict[str, UOp]:
  """The model's weights and KV cache by name (not what its steps return, which get_state_dict also finds)."""
  return {name: t.uop.base for name, t in get_state_dict(model).items() if not name.startswith("jits.")}

def save(jit, model, path:pathlib.Path) -> None:
  """jit pickled to path, the model's state by name; whole or not at all, whoever else writes it."""
  names = {id(u): name for name, u in state_uops(model).items()}
  tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as f: _StatePickler(f, names).dump(jit)
    os.replace(tmp, path)
  except OSError: tmp.unlink(missing_ok=True)  # a read-only store: every run captures

def load(model, path:pathlib.Path):
  """The captured TinyJit stored at path, on model's state; None if there is none or it cannot be read."""
  if not path.is_file(): return None
  try:
    with open(path, "rb") as f: jit = _StateUnpickler(f, state_uops(model)).load()
  except Exception: return None            # an interrupted write, another version: capture and rewrite
  return jit if getattr(jit, "captured", None) is not None else None

class _StatePickler(pickle.Pickler):
  def __init__(self, f, names:dict[int, str]): super().__init__(f, pickle.HIGHEST_PROTOCOL); self.names = names
  def persistent_id(self, obj): return self.names.get(id(obj)) if isinstance(obj, UOp) else None

class _StateUnpickler(pickle.Unpickler):
  def __init__(self, f, uops:dict[str, UOp]): super().__init__(f); self.uops = uops
  def persistent_load(self, name): return self.uops[name]
  def find_class(self, module, name):
    found = super().find_class(module, name)
    # a stored step's own buffers numbered anew in this process: with the storing process's numbers, a loaded step's
    # buffer was whichever live buffer of this process had that number and size, and both wrote it
    return internals.renumbered if found is UOp else found

def step_path(name:str) -> pathlib.Path|None:
  """Where the step of this name (step_name()) is stored: SPEC_STEP_CACHE (empty: nowhere), by default beside
  tinygrad's disk cache, and nowhere with CACHELEVEL=0."""
  root = os.environ.get("SPEC_STEP_CACHE", os.path.join(internals.cache_folder(), "spec-steps"))
  return None if not root or not internals.caching() else pathlib.Path(root) / f"{name}.pkl"

def step_name(model, fn, key:tuple, search:int, choices:tuple=()) -> str:
  """A hash of the code of the port and the engine and of fn's module, tinygrad's version, device and settings, the
  model's shape and dtype, the search width, the step's arguments and the kernels chosen for it (choices: processes
  that measured other winners capture other kernels, whose sums round otherwise)."""
  models = pathlib.Path(__file__).parent.parent
  files = sorted({*models.glob("*.py"), *models.glob("engine/*.py"), pathlib.Path(inspect.getsourcefile(fn))})
  settings = internals.program_settings()   # not DEV: the device is keyed as opened (Device.DEFAULT, its target)
  what = (importlib.metadata.version("tinygrad"), Device.DEFAULT, internals.target(), settings,
          model.cfg, model.dtype, search, key, choices)
  code = b"".join(f.read_bytes() for f in files)
  return hashlib.sha256(code + repr(what).encode()).hexdigest()[:32]

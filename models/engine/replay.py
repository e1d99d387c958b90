"""A JIT graph for tinygrad devices that have none (the CPU backend, OpenCL): a captured step's kernels replayed from a
list prepared at capture.

A TinyJit replays its kernels one by one through tinygrad's general executor, which resolves each kernel's buffers,
launch sizes and variables again on every call; small models paid more for that than for their kernels. Devices with a
graph of their own (CUDA, Metal, ...) keep it: this is tinygrad's GraphRunner interface (internals.Batch), filled in
for the rest.
"""
from __future__ import annotations
import threading, time
from tinygrad import Tensor, UOp
from models.engine import internals

# one batch replays at a time, whichever Python thread calls: a device's kernels and their arguments are shared by every
# step that compiled the same code (OpenCL sets a kernel's arguments before it enqueues it), native.py's runner is one
# for the process, and ctypes lets go of the GIL during a call
LOCK = threading.Lock()

class Replay(internals.Batch):
  """Every kernel of a batch with its program, buffer handles, launch sizes and variable values resolved once
  (internals.Batch); a call updates what changes between calls, then launches each kernel."""
  def __call__(self, input_uops, var_vals, wait=False) -> float|None:
    with LOCK:
      self.refresh(input_uops, var_vals)
      t0 = time.perf_counter()
      self.run()
      if not wait: return None
      self.synchronize()
      return time.perf_counter() - t0

def graph(device:str, runner=Replay):
  """Captures and replays on device use runner (Replay or a subclass) meanwhile, unless tinygrad has a graph for it:
  only the engine's steps, each captured as one batch (tinygrad batches a GPU's graph for its launches to overlap)."""
  return internals.graph_runner(device, runner)

class Shortcut:
  """A captured step called again on the same input Tensors: its Replay batches run with the inputs TinyJit gathered
  for them last time and the bound variables' new values. TinyJit's own call gathers and checks its inputs and rewrites
  each batch's call into an execution again: 0.1-0.2 ms a call in Python, a large part of a small model's step on a
  CPU (docs/engine.md)."""
  __slots__ = ("captured", "runners", "tensors", "inputs", "fixed", "passed")   # no __dict__ for get_state_dict()
  def __init__(self, captured, args:tuple, runners:list[Replay]):
    self.captured, self.runners, self.tensors = captured, runners, tensors(args)
    self.inputs, var_vals = internals.inputs_of(args)
    # the variables passed as arguments, each call's own; the rest are bound in the input Tensors' views, which a call
    # on the same Tensors shares
    self.passed = sorted(bound(args))
    self.fixed = {k: v for k, v in var_vals.items() if k not in self.passed}
  def __call__(self, args:tuple):
    """captured's outputs after a call on args, or None where args hold other Tensors than last time or bind other
    variables (a call that omits one goes to TinyJit, which refuses it)."""
    now = tensors(args)
    if len(now) != len(self.tensors) or any(a is not b for a, b in zip(now, self.tensors)): return None
    if sorted(passed := bound(args)) != self.passed: return None
    var_vals = {**self.fixed, **passed}
    for runner in self.runners: runner(self.inputs, var_vals)
    return internals.returned(self.captured)

def bound(args:tuple) -> dict[str, int]:
  """The bound variables among a call's arguments, by name."""
  return {v.expr: value for v, value in (a.unbind() for a in args if isinstance(a, UOp))}

def tensors(args:tuple) -> list[UOp]:
  """The graphs of the Tensors among a call's arguments and in its lists, tuples and dicts (where TinyJit looks)."""
  found = [a for a in args if a.__class__ is Tensor]
  for a in args:
    inner = a if isinstance(a, (tuple, list)) else a.values() if isinstance(a, dict) else []
    found += [t for t in inner if t.__class__ is Tensor and not any(t is f for f in found)]
  return [t.uop for t in found]

def shortcut(captured, args:tuple) -> Shortcut|None:
  """A Shortcut for a captured TinyJit just called on args, where its batches all run on Replay graphs and it writes
  none of its inputs (TinyJit copies those first)."""
  runners = internals.batches(captured)
  if not all(isinstance(r, Replay) for r in runners): return None
  made = Shortcut(captured, args, runners)
  return None if internals.writes_any(captured, made.inputs) else made

"""A JIT graph for tinygrad devices that have none (the CPU backend, OpenCL): a captured step's kernels replayed from a
list prepared at capture.

A TinyJit replays its kernels one by one through tinygrad's general executor, which resolves each kernel's buffers,
launch sizes and variables again on every call; small models paid more for that than for their kernels. Devices with a
graph of their own (CUDA, Metal, ...) keep it: this is tinygrad's GraphRunner interface, filled in for the rest.
"""
from __future__ import annotations
import contextlib, time
from tinygrad import Device, Context
from tinygrad.engine.jit import GraphRunner
from tinygrad.engine.realize import get_call_arg_uops, resolve_params
from tinygrad.uop.ops import Ops

class Replay(GraphRunner):
  """Every kernel of a batch with its runtime, buffer handles, launch sizes and variable values resolved once; a call
  updates what changes between calls: the buffers of kernels that touch the JIT's inputs (or views of them), the bound
  variables, and the launch sizes that depend on them."""
  def __init__(self, linear, input_uops=()):
    super().__init__(linear, input_uops)
    self.launches, var_vals = [], {v: 0 for v in self.vars}   # placeholder values until a call binds them
    for call, runtime in zip(self.linear.src, self.runtimes):
      global_size, local_size = call.src[0].arg.launch_dims(var_vals)
      vals = list(call.src[0].arg.vals(var_vals))
      self.launches.append((runtime, self.buffers(call, input_uops), [global_size, local_size], vals))
    self.with_inputs = [j for j, call in enumerate(self.linear.src)
                        if any(u.op is Ops.PARAM for arg in get_call_arg_uops(call) for u in arg.toposort())]

  @staticmethod
  def buffers(call, input_uops) -> list:
    """The device handles of a kernel's buffers, as tinygrad's executor passes them (exec_kernel)."""
    args = resolve_params(call, input_uops)
    return [(b:=args[i].buffer).get_buf(b.device) for i in call.src[0].arg.globals]

  def __call__(self, input_uops, var_vals, wait=False) -> float|None:
    for j in self.with_inputs: self.launches[j][1][:] = self.buffers(self.linear.src[j], input_uops)
    for j, i, value in self.updated_vars(var_vals): self.launches[j][3][i] = value
    for j, global_size, local_size in self.updated_launch_dims(var_vals):
      self.launches[j][2][:] = global_size, local_size
    t0 = time.perf_counter()
    for runtime, bufs, (global_size, local_size), vals in self.launches:
      runtime(*bufs, global_size=global_size, local_size=local_size, vals=tuple(vals))
    if not wait: return None
    Device[self.device].synchronize()
    return time.perf_counter() - t0

@contextlib.contextmanager
def graph(device:str, runner=Replay):
  """Captures and replays on device use runner (Replay or a subclass) meanwhile, unless tinygrad has a graph for it:
  only the engine's steps, each captured as one batch (tinygrad batches a GPU's graph for its launches to overlap)."""
  plain = Device[device].graph is None
  if plain: Device[device].graph = runner
  try:
    with Context(JIT_BATCH_SIZE=0) if plain else contextlib.nullcontext(): yield
  finally:
    if plain: Device[device].graph = None

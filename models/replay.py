"""A JIT graph for tinygrad devices that have none (the CPU backend, OpenCL): a captured step's kernels replayed from
a list prepared at capture.

A TinyJit replays its kernels one by one through tinygrad's general executor, which resolves each kernel's buffers,
launch sizes and variables again on every call: ~45 us of Python a kernel on the 2-core Xeon (40 chained one-element
kernels: 49 us each on pocl, 20 on the CPU backend; replayed: 16 and 4). A decode runs ~20 kernels a layer, so small
models paid more for dispatch than for their kernels (gpt2 decode, CPU backend: 55 -> 47 ms). Devices with a graph of
their own (CUDA, Metal, ...) keep it: this is tinygrad's GraphRunner interface, filled in for the rest.
"""
from __future__ import annotations
import time
from tinygrad import Device
from tinygrad.engine.jit import GraphRunner

class Replay(GraphRunner):
  """Every kernel of a batch with its runtime, buffer handles, launch sizes and variable values resolved once; a call
  updates what changes between calls (the JIT's input buffers, the bound variables, launch sizes that depend on them)."""
  def __init__(self, linear, input_uops=()):
    super().__init__(linear, input_uops)
    self.launches = []
    for (_, program, bufs, device_vars), runtime in zip(self.calls, self.runtimes):
      var_vals = {**{v: 0 for v in self.vars}, **device_vars}   # placeholders until a call binds them
      global_size, local_size = program.arg.launch_dims(var_vals)
      self.launches.append((runtime, [b.get_buf(b.device) for b in bufs], [global_size, local_size], list(program.arg.vals(var_vals))))

  def __call__(self, input_uops, var_vals, wait=False) -> float|None:
    for (runtime, bufs, _, _), replace in zip(self.launches, self.uop_replace):
      for pos, slot in replace: bufs[pos] = (b:=input_uops[slot].buffer).get_buf(b.device)
    for j, i, value in self.updated_vars(var_vals): self.launches[j][3][i] = value
    for j, global_size, local_size in self.updated_launch_dims(var_vals): self.launches[j][2][:] = global_size, local_size
    t0 = time.perf_counter()
    for runtime, bufs, (global_size, local_size), vals in self.launches:
      runtime(*bufs, global_size=global_size, local_size=local_size, vals=tuple(vals))
    if not wait: return None
    Device[self.device].synchronize()
    return time.perf_counter() - t0

def install(device:str) -> None:
  """Replay a JIT's captures on device from now on, unless tinygrad has a graph for it."""
  if Device[device].graph is None: Device[device].graph = Replay

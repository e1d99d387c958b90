"""Every use the engine makes of tinygrad beyond its public names (Tensor, TinyJit, UOp, Device, Context, dtypes): one
file to read when tinygrad changes, each use with what it needs and why. requirements.txt pins the minor release these
were written against (0.14).

The rest of the engine imports from here, never from tinygrad's submodules.
"""
from __future__ import annotations
import contextlib, ctypes, dataclasses, os
from tinygrad import UOp, Device, Context, dtypes
# the kernel language of Tensor.custom_kernel: a kernel's axes (AxisType), its name and fixed options (KernelInfo, Opt,
# OptOps), the operations its UOps reduce by or render as code (Ops), a register's address space (AddrSpace)
from tinygrad.codegen.opt import Opt, OptOps
from tinygrad.uop.ops import AddrSpace, AxisType, KernelInfo, Ops
# tinygrad's disk cache: its folder holds the measured choices and the stored steps too, CACHELEVEL=0 keeps none
from tinygrad.helpers import BEAM, CACHEDB, CACHELEVEL, JIT, NUM_CPU_THREADS, ContextVar
# the settings that shape a compiled program: a stored step's name holds them
from tinygrad.codegen import to_program_context
# a model's weights and KV cache by name: what a stored step refers to them by
from tinygrad.nn.state import get_state_dict
# a JIT graph for devices without one: tinygrad's GraphRunner interface, and how its executor resolves a kernel call
from tinygrad.engine.jit import GraphRunner, _prepare_jit_inputs
from tinygrad.engine.realize import get_call_arg_uops, get_graph_runtime, resolve_params

__all__ = ["AddrSpace", "AxisType", "KernelInfo", "Ops", "Opt", "OptOps", "Batch", "address", "batches", "c_entry",
           "cache_folder", "caching", "capture_next", "cpu_threads", "custom_call", "get_state_dict", "graph_runner",
           "has_half", "host_buffers", "inputs_of", "program_settings", "read", "renumbered", "returned",
           "runs_c_functions", "target", "threads_in_kernels", "unmap_freed", "work_groups", "writes_any"]

# ***** the device *****

def target() -> str:
  """The default device's compiler target (its architecture and features): part of every measurement's key."""
  return str(Device[Device.DEFAULT].renderer.target)

def has_half() -> bool: return dtypes.half in Device[Device.DEFAULT].renderer.supported_dtypes()

def work_groups() -> bool:
  """Whether the default device runs work-groups with shared memory (GPUs, OpenCL; not tinygrad's CPU backend)."""
  renderer = Device[Device.DEFAULT].renderer
  return renderer.has_local and renderer.has_shared

def threads_in_kernels(device:str) -> bool:
  """Whether a kernel's outer axis can be split over the CPU's cores inside it (tinygrad's CPU backend: a core_id
  argument)."""
  return Device[device].renderer.has_threads

def cpu_threads() -> int:
  """The cores tinygrad's CPU backend splits a kernel over (NUM_CPU_THREADS)."""
  return NUM_CPU_THREADS.value

def runs_c_functions(device:str) -> bool:
  """Whether the device's programs are C functions in this process, each argument a 64-bit word (tinygrad's CPU
  backend with its clang renderer): what native.py's runner calls."""
  from tinygrad.runtime.ops_cpu import CPUProgram
  from tinygrad.renderer.cstyle import ClangRenderer
  dev = Device[device]
  return dev.runtime_t is CPUProgram and isinstance(dev.renderer, ClangRenderer)

def c_entry(program) -> tuple[int, int]:
  """A CPU program's address, and which argument takes the index of its thread split (its core_id; -1: none)."""
  return program.addr, program.runtimevars.get("core_id", -1)

def address(handle) -> int: return handle.va_addr   # a CPU buffer's address, as its programs take it

def host_buffers(device:str) -> bool:
  """Whether the device's buffers are this process's memory, a Tensor.from_blob's pointer taken as is (tinygrad's CPU
  backend)."""
  from tinygrad.runtime.ops_cpu import CPUAllocator
  return isinstance(Device[device].allocator, CPUAllocator)

def unmap_freed(device:str) -> None:
  """The buffers tinygrad's allocator keeps after they were freed, for a later buffer of the same size, given back."""
  Device[device].allocator.free_cache()

# ***** the disk cache *****

def caching() -> bool: return CACHELEVEL.value >= 1
def cache_folder() -> str: return os.path.dirname(CACHEDB)

def program_settings() -> list[tuple[str, str]]:
  """The settings that shape compiled programs (tinygrad's list, BEAM and JIT) and any set in the environment, not
  every ContextVar (which exist depends on the modules a process imported). Not DEV: tinygrad writes the device it
  picks into the environment, so a process and its children would differ."""
  shaping = (*to_program_context, BEAM, JIT)
  return sorted({(v.key, str(v.value)) for v in shaping} |
                {(k, str(v.value)) for k, v in ContextVar._cache.items() if k in os.environ and k != "DEV"})

def renumbered(op, dtype=None, src=(), arg=None, tag=None, metadata=None, *buffer) -> UOp:
  """A UOp unpickled, a device buffer's with a number of this process's: tinygrad interns UOps by their fields, a
  buffer's number among them, so a stored number would alias whichever live buffer of this process has it."""
  if op is Ops.BUFFER and arg.device is not None: arg = dataclasses.replace(arg, slot=next(UOp.unique_num))
  return UOp(op, dtype, src, arg, tag, metadata, *buffer)

# ***** custom kernels with variables *****

def custom_call(fxn, out, *inputs, pos:UOp):
  """out's UOp after fxn(out, *inputs, pos) ran: Tensor.custom_kernel passes buffers only, so a position (an
  expression of bound variables) goes beside them as tinygrad's own kernels hold one, each variable a parameter."""
  buffers = [out, *inputs]
  params = [UOp.placeholder_like(u, slot=i) for i, u in enumerate(buffers)]
  bound = [u for u in pos.toposort() if u.is_bound_var]
  variables = bound + [u for u in pos.toposort() if u.is_variable and all(b.src[0] is not u for b in bound)]
  names = {u: (u.src[0] if u.op is Ops.AFTER else u).replace(op=Ops.PARAM) for u in variables}
  return out.after(fxn(*params, pos.substitute(names)).call(*buffers, *variables))

# ***** captured steps and their batches *****

def capture_next(jit) -> None:
  """A TinyJit whose next call captures, its plain first call skipped (its call count): tinygrad runs a function plainly
  first so that what it realizes once is not captured, and the engine's steps and candidates take realized tensors
  only; a capture schedules the function once and runs it once, where the two calls scheduled it twice."""
  jit.cnt = max(jit.cnt, 1)

@contextlib.contextmanager
def graph_runner(device:str, runner):
  """Captures on device batch their kernels into runner (a GraphRunner) meanwhile, unless tinygrad has a graph for the
  device: each step one batch (JIT_BATCH_SIZE 0)."""
  plain = Device[device].graph is None
  if plain: Device[device].graph = runner
  try:
    with Context(JIT_BATCH_SIZE=0) if plain else contextlib.nullcontext(): yield
  finally:
    if plain: Device[device].graph = None

def batches(captured) -> list:
  """A captured TinyJit's batches that run on a graph runner, each its runner object; None where a kernel runs alone."""
  calls = [c.src[0] for c in captured.linear.src]
  return [get_graph_runtime(c) if c.op is Ops.CUSTOM_FUNCTION and c.arg == "graph" else None for c in calls]

def inputs_of(args:tuple) -> tuple[list[UOp], dict[str, int]]:
  """A JIT call's input buffers and its variables' values, as TinyJit gathers them."""
  buffers, var_vals, _, _ = _prepare_jit_inputs(args, {})
  return buffers, var_vals

def writes_any(captured, uops:list[UOp]) -> bool:
  """Whether a captured step writes any of these buffers (TinyJit copies such an input first)."""
  return any(u in captured._written_uops for u in uops)

def returned(captured):
  """What a captured step returns: its outputs' Tensors, rewritten by each replay."""
  return captured.ret

def read(uop:UOp) -> memoryview|None:
  """A copy of a realized buffer's bytes (uop: its BUFFER, or a reshape of it), by its allocator once the device has
  finished: Tensor.data() schedules and runs a copy for it, about 0.5 ms on a CPU. None where uop is no realized buffer
  or the allocator copies out no other way."""
  while uop.op is Ops.RESHAPE: uop = uop.src[0]
  if uop.op is not Ops.BUFFER or not (buf := uop.buffer).is_allocated(): return None
  device = Device[buf.device]
  # host memory read where it lies (the allocator's copy synchronizes again and wraps the buffer in views); a CPU device
  # without worker threads ran every program in its caller, so nothing is queued
  if host_buffers(buf.device):
    if getattr(device, "workers", True): device.synchronize()
    return memoryview(ctypes.string_at(address(buf._buf), buf.nbytes))
  device.synchronize()
  out = memoryview(bytearray(buf.nbytes))
  try: buf.allocator._copyout(out, buf._buf)
  except NotImplementedError: return None
  return out

def handles(call, input_uops) -> list:
  """A kernel's buffers' device handles, as tinygrad's executor passes them."""
  args = resolve_params(call, input_uops)
  return [(b := args[i].buffer).get_buf(b.device) for i in call.src[0].arg.globals]

class Batch(GraphRunner):
  """tinygrad's GraphRunner (a batch of a captured step's kernels, the interface its JIT calls) with every kernel's
  launch resolved once: launches[j] = [program, buffer handles, [global size, local size], variable values];
  refresh() writes what a call changes: the handles of kernels that read the step's inputs, the bound variables, and
  the launch sizes that depend on them."""
  def __init__(self, linear, input_uops=()):
    super().__init__(linear, input_uops)
    self.launches, var_vals = [], {v: 0 for v in self.vars}   # placeholder values until a call binds them
    for call, program in zip(self.linear.src, self.runtimes):
      global_size, local_size = call.src[0].arg.launch_dims(var_vals)
      self.launches.append([program, handles(call, input_uops), [global_size, local_size],
                            list(call.src[0].arg.vals(var_vals))])
    self.reading_inputs = [j for j, call in enumerate(self.linear.src)
                           if any(u.op is Ops.PARAM for arg in get_call_arg_uops(call) for u in arg.toposort())]
    self.sizes_vary = bool(self.launch_dims_replace)
    # where each bound variable goes: (launch, its value's index, the variable's index in a call's values)
    self.variable_slots = [(j, i, k) for j, replace in self.var_vals_replace.items() for i, k in replace]

  def handles_of(self, j:int, input_uops) -> list: return handles(self.linear.src[j], input_uops)

  def refresh(self, input_uops, var_vals:dict[str, int]) -> None:
    for j in self.reading_inputs: self.launches[j][1][:] = self.handles_of(j, input_uops)
    for j, i, value in self.updated_vars(var_vals): self.launches[j][3][i] = value
    for j, global_size, local_size in self.updated_launch_dims(var_vals):
      self.launches[j][2][:] = global_size, local_size

  def run(self) -> None:
    for program, bufs, (global_size, local_size), vals in self.launches:
      program(*bufs, global_size=global_size, local_size=local_size, vals=tuple(vals))

  def values(self, var_vals:dict[str, int]) -> list[int]: return [var_vals[v] for v in self.vars]
  def synchronize(self) -> None: Device[self.device].synchronize()

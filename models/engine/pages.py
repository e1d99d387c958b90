"""A model's weights moved into one mapping of transparent huge pages, where the device's buffers are the process's
memory (tinygrad's CPU backend): tinygrad maps each buffer shared, which Linux backs with huge pages only where
shmem_enabled allows (rarely), and a step that reads the weights through 4 KB pages misses the TLB for each page
(docs/engine.md). Where the system gives no huge pages, one line on stderr says why and the weights stay in tinygrad's
buffers."""
from __future__ import annotations
import ctypes, functools, mmap, weakref
from tinygrad import Tensor
from models.engine import internals
from models.engine.device import say

HUGE_PAGE, PAGE = 2 << 20, 4096
THP = "/sys/kernel/mm/transparent_hugepage/enabled"
mappings = weakref.WeakKeyDictionary()   # a model -> the mapping its weights live in, kept as long as the model

@functools.cache
def refused() -> str|None:
  """Why this system gives no transparent huge pages to a mapping that asks for them, said once on stderr; None where
  it gives them."""
  if not hasattr(mmap, "MADV_HUGEPAGE"): reason = "this system has no transparent huge pages"
  else:
    try:
      with open(THP) as f: reason = f"transparent huge pages are off ({THP}: never)" if "[never]" in f.read() else None
    except OSError: reason = f"{THP} cannot be read"
  if reason is not None: say(f"a model's weights stay in 4 KB pages: {reason}")
  return reason

def weights(model) -> list[Tensor]:
  """The model's weights, each tensor once (the lm_head is wte's); not its KV cache, whose pages stay untouched until
  a pass writes them."""
  tensors = {id(t): t for name, t in internals.get_state_dict(model).items()
             if not name.startswith("jits.") and "cache_kv" not in name}
  return list(tensors.values())

def move(model) -> None:
  """Each of the model's weights replaced by a view of one mapping that asks for huge pages, filled by a copy on
  the device, one tensor at a time (what the old buffers held is unmapped meanwhile: no peak of two copies)."""
  tensors = weights(model)
  if not tensors or not internals.host_buffers(device := tensors[0].device): return
  if refused() is not None: return
  sizes = [-(-t.nbytes() // PAGE) * PAGE for t in tensors]
  mapping = mmap.mmap(-1, sum(sizes) + HUGE_PAGE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
  mapping.madvise(mmap.MADV_HUGEPAGE)
  at = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
  at += -at % HUGE_PAGE   # huge pages back whole aligned 2 MB only
  for t, size in zip(tensors, sizes):
    t.replace(Tensor.from_blob(at, t.shape, dtype=t.dtype, device=device).assign(t).realize())
    internals.unmap_freed(device)
    at += size
  mappings[model] = mapping

"""Timing on tinygrad's device: what the sampler's statistics and the engine's measurements both use."""
import time
from tinygrad import Device

def synchronize() -> float:
  """The time once the default device has finished what was queued."""
  Device[Device.DEFAULT].synchronize()
  return time.perf_counter()

def best_seconds(fn, reps:int=3, before=None) -> float:
  """The fastest of reps synchronized calls of fn: its cost without the noise of whatever else the machine does; each
  after before() (untimed) where given."""
  def once() -> float:
    if before: before()
    return timed(fn)[0]
  return min(once() for _ in range(reps))

def timed(fn) -> tuple[float, object]:
  """One synchronized call of fn: its seconds, and what it returned."""
  t0 = synchronize()
  ret = fn()
  return synchronize() - t0, ret

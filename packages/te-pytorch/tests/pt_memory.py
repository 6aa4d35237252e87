"""Peak CPU memory of a piece of code, from torch.profiler's allocation records.

torch has no CPU allocator statistics, but torch.profiler(profile_memory=True)
records every CPU tensor allocation (+bytes) and free (-bytes) with its time;
the running sum in time order is the bytes live above the start, and its
maximum is the peak (what torch.cuda.max_memory_allocated measures on CUDA).
Memory allocated outside torch (none of te-core's CPU kernels' outputs) is
not seen.
"""

from __future__ import annotations

from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile


def _allocations(node, out: list) -> None:
    # Iterative: the op tree of one training step can be deep.
    stack = [node]
    while stack:
        n = stack.pop()
        if n.tag == _EventType.Allocation and n.extra_fields.device.type == "cpu":
            out.append((n.start_time_ns, n.extra_fields.alloc_size))
        stack.extend(n.children)


def cpu_peak_bytes(fn) -> tuple[int, int]:
    """(peak, final) CPU bytes live above the start while fn() runs (fn's own
    references are dropped when it returns, so `final` counts what outlives it)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events: list = []
    for root in prof.profiler.kineto_results.experimental_event_tree():
        _allocations(root, events)
    events.sort(key=lambda e: e[0])
    live = peak = 0
    for _, size in events:
        live += size
        peak = max(peak, live)
    return peak, live

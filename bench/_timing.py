"""The benchmarks' shared measuring tools: the CUDA-event timer, the result
table and the copy ceiling (a library: the drivers bench_core.py and the
per-family bench_*.py import it; it imports none of them).

Method: CUDA-event medians of 20 runs after 5 warm-ups (as shared targets).
"""

from __future__ import annotations

import statistics

import torch

ROWS, COLS = 32768, 4096


def time_ms(fn, warmup=5, iters=20, calls=10) -> float:
    """GPU time per call: the median over `iters` samples, each timing `calls`
    back-to-back calls between two CUDA events. (Timing single calls would
    count the host's launch latency of each -- the events are recorded on an
    idle GPU -- which is 10-20% of a 0.1 ms kernel; back to back, only the
    first call's latency is in a sample, divided by `calls`.)"""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


class Table:
    def __init__(self):
        self.rows = []

    def add(self, case, ms, rate, unit, ceiling_ratio, baseline_name="", baseline_ms=None, target=""):
        """ceiling_ratio: of the copy ceiling (memory-bound) or of the same-run baseline (GEMMs)."""
        vs = f"{baseline_ms / ms:.2f}x vs {baseline_name} ({baseline_ms:.3f} ms)" if baseline_ms else ""
        ratio = f"{ceiling_ratio:.0%}" if ceiling_ratio else "-"
        self.rows.append((case, f"{ms:.3f}", f"{rate:.0f} {unit}", ratio, vs, target))
        print(f"{case:58s} {ms:8.3f} ms  {rate:7.0f} {unit:7s} {ratio:>5s}  {vs}  {target}", flush=True)

    def markdown(self) -> str:
        head = (
            "| case | time (ms) | rate | of ceiling (copy, or same-run baseline for GEMMs) "
            "| speed-up vs baseline (same run) | target |\n|---|---|---|---|---|---|\n"
        )
        return head + "\n".join("| " + " | ".join(r) + " |" for r in self.rows) + "\n"


def copy_ceiling_gbs() -> float:
    x = torch.empty(2**29, dtype=torch.float16, device="cuda").uniform_()
    y = torch.empty_like(x)
    ms = time_ms(lambda: y.copy_(x))
    return 2 * x.numel() * 2 / ms / 1e6

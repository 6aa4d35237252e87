"""te.make_graphed_callables: time per training step of a graphed te.Linear.

Case (shared/reference/targets.md): te.Linear(1024, 1024), 256 tokens, BF16, under no recipe,
DelayedScaling and Float8CurrentScaling. A step is the graphed forward (one replay), the
backward (one replay) and the autograd bookkeeping around them, as a training loop calls it:
    y = graphed(x); y.backward(dy)
Columns: "graphed us": CUDA-event time per step over 200 back-to-back steps (median of 5
such runs); "eager us": the same loop with the eager module inside te.autocast. Target:
<= 60 us per graphed step (the reference: 336 us under DelayedScaling, same GPU).
GPU only (CUDA graphs).
"""

from __future__ import annotations

import argparse
import statistics

import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

RECIPES = {"bf16": None, "delayed": recipe.DelayedScaling(), "current": recipe.Float8CurrentScaling()}


def _per_step_us(step, steps: int = 200, runs: int = 5) -> float:
    for _ in range(10):
        step()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / steps)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_graphed.py needs a CUDA device")
    n, t = args.features, args.tokens
    print(f"torch {torch.__version__}; te.Linear({n}, {n}), {t} tokens, bf16")
    print(f"{'recipe':8s} {'graphed us':>11s} {'eager us':>9s} {'speedup':>8s}")
    for label, rec in RECIPES.items():
        layer = te.Linear(n, n, params_dtype=torch.bfloat16, device="cuda")
        eager = te.Linear(n, n, params_dtype=torch.bfloat16, device="cuda")
        x = torch.randn(t, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
        graphed = te.make_graphed_callables(layer, (x,), enabled=rec is not None, recipe=rec)

        def graphed_step():
            graphed(x).backward(dy)

        def eager_step():
            with te.autocast(enabled=rec is not None, recipe=rec):
                y = eager(x)
            y.backward(dy)

        g = _per_step_us(graphed_step)
        e = _per_step_us(eager_step)
        print(f"{label:8s} {g:11.1f} {e:9.1f} {e / g:7.2f}x")
    print("target: <= 60 us per graphed step")


if __name__ == "__main__":
    main()

"""Where te.make_graphed_callables' replays leave the eager steps (H200 diagnosis).

The model and steps of tests/test_make_graphed_callables.py; for each step it
prints, per output / input gradient / parameter gradient / FP8 state tensor,
max|graphed|, max|eager| and max|graphed - eager|, and the ratio of the two
where they differ (2.0: a gradient added twice; 0: one never written).

    python bench/diagnose_graphed.py [--recipe none|delayed|current|mxfp8] [--steps 3]
"""

from __future__ import annotations

import argparse
import copy

import torch

import transformer_engine.pytorch as te  # noqa: E402
from transformer_engine.common import recipe  # noqa: E402

RECIPES = {
    "none": None,
    "delayed": lambda: recipe.DelayedScaling(amax_history_len=4),
    "current": recipe.Float8CurrentScaling,
    "mxfp8": recipe.MXFP8BlockScaling,
}


def _states(model):
    out = []
    for name, m in model.named_modules():
        meta = getattr(m, "fp8_meta", None)
        if isinstance(meta, dict) and meta.get("scaling_fwd") is not None and hasattr(meta["scaling_fwd"], "scale"):
            for key in ("scaling_fwd", "scaling_bwd"):
                out += [
                    (f"{name}.{key}.scale", meta[key].scale),
                    (f"{name}.{key}.amax_history", meta[key].amax_history),
                ]
    return out


def _row(name, a, b):
    a, b = a.float(), b.float()
    diff = (a - b).abs().max().item()
    ratio = ""
    if diff > 0:
        nz = b.abs() > 1e-12
        if nz.any():
            r = (a[nz] / b[nz]).flatten()
            ratio = f"ratio median {r.median().item():.4g} min {r.min().item():.4g} max {r.max().item():.4g}"
    flag = "" if diff == 0 else "  <-- differs"
    print(f"  {name:48s} |g| {a.abs().max().item():.4g} |e| {b.abs().max().item():.4g} diff {diff:.3g} {ratio}{flag}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--recipe", default="none", choices=list(RECIPES))
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    torch.manual_seed(0)
    hidden = 128
    model = torch.nn.Sequential(
        te.LayerNormLinear(hidden, 2 * hidden, device="cuda"), te.Linear(2 * hidden, hidden, device="cuda")
    ).to(torch.bfloat16)
    eager = copy.deepcopy(model)
    make = RECIPES[args.recipe]
    rec = make() if make else None
    sample = torch.randn(64, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    graphed = te.make_graphed_callables(model, (sample,), num_warmup_iters=2, enabled=rec is not None, recipe=rec)
    print(f"recipe {args.recipe}: states after capture vs the eager copy's")
    for (n, a), (_, b) in zip(_states(graphed), _states(eager)):
        _row(n, a, b)
    names = [n for n, _ in graphed.named_parameters()]
    for step in range(args.steps):
        x = torch.randn(64, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        x2 = x.detach().clone().requires_grad_(True)
        for m in (graphed, eager):
            for prm in m.parameters():
                prm.grad = None if step == 0 else prm.grad.zero_()
        y = graphed(x)
        (y.float() ** 2).mean().backward()
        with te.autocast(enabled=rec is not None, recipe=rec):
            y2 = eager(x2)
        (y2.float() ** 2).mean().backward()
        torch.cuda.synchronize()
        print(f"step {step}")
        _row("output", y.detach(), y2.detach())
        _row("input grad", x.grad, x2.grad)
        for n, a, b in zip(names, graphed.parameters(), eager.parameters()):
            _row(f"grad {n}", a.grad, b.grad)
        for (n, a), (_, b) in zip(_states(graphed), _states(eager)):
            _row(n, a, b)
        with torch.no_grad():  # the same SGD step on both
            for a, b in zip(graphed.parameters(), eager.parameters()):
                a -= 0.1 * a.grad
                b -= 0.1 * b.grad


if __name__ == "__main__":
    main()

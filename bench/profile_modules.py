"""Where the time of a te-pytorch training step goes (GPU): torch.profiler over a few fwd+bwd
steps of te.Linear 4096->4096 (no bias, as the targets have it) and te.LayerNormMLP 4096/14336
(8192 tokens, bf16 params) under DelayedScaling and Float8CurrentScaling. Gradients are set to
None between steps (as optimizer.zero_grad does by default), so no accumulation kernels run.

Per case it prints the step's wall time, the GPU busy time, the kernels sorted by total GPU time,
then a timeline of one step started from an idle GPU (as a CUDA-event timing of one step sees
it): the step's GPU span and its largest idle gaps, each with the kernels around it and the op
that launched the next one -- the places where the host, not the GPU, sets the pace.

With --graph the step is captured as a CUDA graph and the replays are profiled instead (kernel
table only): the GPU's own time per step with no host in the way, kernel by kernel.

    python bench/profile_modules.py [--steps 5] [--top 14] [--gaps 8] [--graph] [--case mlp|linear]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict

import torch
from bench_te_pytorch_linear import _graph_step  # (bench/ is on sys.path when run as a script)
from torch.profiler import ProfilerActivity, profile

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

RECIPES = {"delayed": recipe.DelayedScaling(), "current": recipe.Float8CurrentScaling()}
CUDA = torch.autograd.DeviceType.CUDA
CPU = torch.autograd.DeviceType.CPU


def _cases():
    def linear():
        return te.Linear(4096, 4096, bias=False, params_dtype=torch.bfloat16, device="cuda"), 4096, 4096

    def mlp():
        layer = te.LayerNormMLP(
            4096, 14336, normalization="RMSNorm", activation="swiglu", params_dtype=torch.bfloat16, device="cuda"
        )
        return layer, 4096, 4096

    return {"linear": ("Linear 4096->4096", linear), "mlp": ("LayerNormMLP 4096/14336", mlp)}


def _step(layer, x, dy, fp8_recipe):
    x.grad = None
    layer.zero_grad(set_to_none=True)
    with te.autocast(recipe=fp8_recipe):
        y = layer(x)
    y.backward(dy)


def _kernel_table(prof, steps: int, top: int) -> None:
    kernels = defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type == CUDA:
            entry = kernels[event.name[:90]]
            entry[0] += event.device_time / 1e3 / steps  # ms per step
            entry[1] += 1
    busy = sum(v[0] for v in kernels.values())
    print(f"  GPU busy {busy:.3f} ms/step")
    for kernel, (ms, count) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {ms:7.3f} ms  x{count // steps:<3d} {kernel}")
    syncs = [
        e.name
        for e in prof.events()
        if e.device_type == CPU
        and any(s in e.name for s in ("Synchronize", "cudaMemcpy", "item", "_local_scalar_dense"))
    ]
    print(f"  host sync-like or copy calls per step: {len(syncs) / steps:.1f} {sorted(set(syncs))[:6]}")


def _trace_events(prof) -> list:
    """The profile's chrome-trace events (a format stable across torch versions)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f)["traceEvents"]


def _timeline(prof, gaps: int) -> None:
    """GPU span, busy time and the largest idle gaps of the profiled single step; each gap names
    the kernels around it and the CPU op that launched the next one (through the launch's
    correlation id), with how long after the step's start that launch happened."""
    events = [e for e in _trace_events(prof) if e.get("ph") == "X"]
    kernels = sorted(
        (e for e in events if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")), key=lambda e: e["ts"]
    )
    if not kernels:
        return
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    t0 = min(e["ts"] for e in ops) if ops else kernels[0]["ts"]

    def launcher(kernel) -> str:
        launch = launches.get(kernel.get("args", {}).get("correlation"))
        if launch is None:
            return "?"
        # The outermost op around the launch (te::gemm, aten::sum, autograd nodes, ...).
        around = [o for o in ops if o["ts"] <= launch["ts"] <= o["ts"] + o["dur"]]
        name = around[0]["name"] if around else launch["name"]
        return f"{name[:38]} launched at {launch['ts'] - t0:7.1f} us"

    span = kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]
    busy = sum(e["dur"] for e in kernels)
    print(
        f"  one step from an idle GPU: first kernel {kernels[0]['ts'] - t0:.1f} us after the step's first op; "
        f"span {span / 1e3:.3f} ms, busy {busy / 1e3:.3f} ms, idle {(span - busy) / 1e3:.3f} ms"
    )
    found = [
        (after["ts"] - (before["ts"] + before["dur"]), before, after) for before, after in zip(kernels, kernels[1:])
    ]
    for idle, before, after in sorted(found, key=lambda g: -g[0])[:gaps]:
        if idle <= 0:
            break
        names = f"before {after['name'][:44]:44s} after {before['name'][:30]:30s}"
        print(f"    {idle:7.1f} us idle {names} ({launcher(after)})")


def _profile_graph(title: str, step, args) -> None:
    """The step captured (after a side-stream warm-up) and its replays profiled back to back."""
    replay = _graph_step(step, torch.device("cuda"))
    for _ in range(3):
        replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(args.steps):
            replay()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) / args.steps * 1e3
    print(f"\n== {title}, CUDA graph: wall {wall_ms:.3f} ms/replay (profiled, back to back)")
    _kernel_table(prof, args.steps, args.top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=14)
    parser.add_argument("--gaps", type=int, default=8)
    parser.add_argument("--graph", action="store_true", help="profile CUDA-graph replays of the step")
    parser.add_argument("--case", choices=["all", *_cases()], default="all")
    args = parser.parse_args()
    cases = _cases() if args.case == "all" else {args.case: _cases()[args.case]}
    for case, make in cases.values():
        for name, fp8_recipe in RECIPES.items():
            layer, k, n = make()
            x = torch.randn(8192, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            dy = torch.randn(8192, n, device="cuda", dtype=torch.bfloat16)
            if args.graph:
                _profile_graph(f"{case}, {name}", lambda a=(layer, x, dy, fp8_recipe): _step(*a), args)
                del layer, x, dy
                torch.cuda.empty_cache()
                continue
            for _ in range(3):
                _step(layer, x, dy, fp8_recipe)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                start = time.perf_counter()
                for _ in range(args.steps):
                    _step(layer, x, dy, fp8_recipe)
                torch.cuda.synchronize()
                wall_ms = (time.perf_counter() - start) / args.steps * 1e3
            print(f"\n== {case}, {name}: wall {wall_ms:.3f} ms/step (profiled, back to back)")
            _kernel_table(prof, args.steps, args.top)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                _step(layer, x, dy, fp8_recipe)
                torch.cuda.synchronize()
            _timeline(prof, args.gaps)
            del layer, x, dy
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

"""Where the time of a te-pytorch training step goes (GPU): torch.profiler over a few fwd+bwd
steps of te.Linear 4096->4096 and te.LayerNormMLP 4096/14336 (8192 tokens, bf16 params) under
DelayedScaling and Float8CurrentScaling; prints, per case, the step's wall time, the GPU busy
time and the kernels sorted by total GPU time.

    python bench/profile_modules.py [--steps 5] [--top 14]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

RECIPES = {"delayed": recipe.DelayedScaling(), "current": recipe.Float8CurrentScaling()}


def _cases():
    def linear():
        return te.Linear(4096, 4096, params_dtype=torch.bfloat16, device="cuda"), 4096, 4096

    def mlp():
        layer = te.LayerNormMLP(
            4096, 14336, normalization="RMSNorm", activation="swiglu", params_dtype=torch.bfloat16, device="cuda"
        )
        return layer, 4096, 4096

    return {"Linear 4096->4096": linear, "LayerNormMLP 4096/14336": mlp}


def _step(layer, x, dy, fp8_recipe):
    with te.autocast(recipe=fp8_recipe):
        y = layer(x)
    y.backward(dy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=14)
    args = parser.parse_args()
    for case, make in _cases().items():
        for name, fp8_recipe in RECIPES.items():
            layer, k, n = make()
            x = torch.randn(8192, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            dy = torch.randn(8192, n, device="cuda", dtype=torch.bfloat16)
            for _ in range(3):
                _step(layer, x, dy, fp8_recipe)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                start = time.perf_counter()
                for _ in range(args.steps):
                    _step(layer, x, dy, fp8_recipe)
                torch.cuda.synchronize()
                wall_ms = (time.perf_counter() - start) / args.steps * 1e3
            kernels = defaultdict(lambda: [0.0, 0])
            for event in prof.events():
                if event.device_type == torch.autograd.DeviceType.CUDA:
                    entry = kernels[event.name[:90]]
                    entry[0] += event.device_time / 1e3 / args.steps  # ms per step
                    entry[1] += 1
            busy = sum(v[0] for v in kernels.values())
            print(f"\n== {case}, {name}: wall {wall_ms:.3f} ms/step (profiled), GPU busy {busy:.3f} ms/step")
            for kernel, (ms, count) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[: args.top]:
                print(f"  {ms:7.3f} ms  x{count // args.steps:<3d} {kernel}")
            syncs = [
                e.name
                for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CPU
                and any(s in e.name for s in ("Synchronize", "cudaMemcpy", "item", "_local_scalar_dense"))
            ]
            print(f"  host sync-like calls per step: {len(syncs) / args.steps:.1f} {sorted(set(syncs))[:6]}")
            del layer, x, dy
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

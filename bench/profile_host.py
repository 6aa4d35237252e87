"""Where the host (CPU) time of a small te.Linear training step goes: cProfile over many fwd+bwd
steps of Linear 1024->1024 on 256 tokens (bf16, the host-overhead case of the issue-4 targets; on
the CPU, 32->32 on 16 tokens in float32), per recipe, sorted by the time spent in each function
itself. On the GPU the time inside a te-core call ("call" in kernels/*.py) is the C++ side:
argument checks, cuBLASLt set-up and the kernel launches.

    python bench/profile_host.py [--device cpu|cuda] [--steps 2000] [--top 25] [--recipe delayed]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

RECIPES = {"bf16": None, "delayed": recipe.DelayedScaling(), "current": recipe.Float8CurrentScaling()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--recipe", choices=[*RECIPES, "all"], default="all")
    args = parser.parse_args()
    device = torch.device(args.device)
    features, tokens, dtype = (1024, 256, torch.bfloat16) if device.type == "cuda" else (32, 16, torch.float32)
    x = torch.randn(tokens, features, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn(tokens, features, device=device, dtype=dtype)
    names = list(RECIPES) if args.recipe == "all" else [args.recipe]
    for name in ["torch", *names]:
        if name == "torch":
            layer = torch.nn.Linear(features, features, device=device, dtype=dtype)
        else:
            layer = te.Linear(features, features, params_dtype=dtype, device=device)
        fp8_recipe = RECIPES.get(name)

        def step(layer=layer, fp8_recipe=fp8_recipe):
            x.grad = None
            layer.zero_grad(set_to_none=True)
            with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
                y = layer(x)
            y.backward(dy)

        for _ in range(50):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        us = (time.perf_counter() - start) / args.steps * 1e6
        print(f"\n== {name}: {us:.1f} us/step (unprofiled)")
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.steps):
            step()
        profiler.disable()
        if device.type == "cuda":
            torch.cuda.synchronize()
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()

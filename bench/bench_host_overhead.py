"""Host (CPU) overhead of te.Linear fwd+bwd against torch.nn.Linear (issue 4).

Targets, on the H200: te.Linear 1024->1024 on 256 tokens, bf16 params, FP8
eager (DelayedScaling and Float8CurrentScaling) <= 1.5x torch.nn.Linear BF16
eager in the same run; the CUDA-graphed FP8 training step <= 150 us.

Each case is a step `with te.autocast(...): y = layer(x)` then
`y.backward(dy)`; the time per step is the median over rounds of `iters`
back-to-back steps, synchronized around each round (wall time: for small
layers this is what the host can issue). Rows:
- cpu: tiny shapes (16 tokens, 32 -> 32, float32: torch's bf16 CPU matmul is
  slow enough to hide the overhead) -- Python/dispatcher cost, measurable
  without a GPU. --no-core replaces the te-core calls with no-ops, leaving
  only the Python and torch work of the te path.
- cuda eager and cuda graph: 1024 -> 1024, 256 tokens, bf16; the graph rows
  capture the whole step (autocast exit and the delayed-scaling updates
  included) with torch.cuda.graph and time replays.

    python bench/bench_host_overhead.py [--device cpu|cuda|all] [--iters N] [--no-core]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_te_pytorch_linear import RECIPES, _graph_step, _step_fn, _wall_us  # noqa: E402

import transformer_engine.pytorch as te  # noqa: E402


class _NoCore:
    """Stands in for te-core's binding module: every kernel call returns at once."""

    def __init__(self, lib) -> None:
        self._lib = lib

    def __getattr__(self, name):
        if name in ("TensorDesc", "AmaxComputeAlgo"):
            return getattr(self._lib, name)
        return (lambda *args: 0) if name.endswith("_size") else (lambda *args: None)


def _stub_core() -> None:
    import importlib

    for name in ("kernels.cast", "kernels.gemm", "kernels.recipe", "quantization"):
        module = importlib.import_module(f"transformer_engine.pytorch.{name}")
        if hasattr(module, "lib"):
            module.lib = _NoCore(module.lib)


def _cpu_process_us(step, iters: int, rounds: int = 7) -> float:
    """CPU time of this process per step (less disturbed by other processes than wall time)."""
    for _ in range(20):
        step()
    samples = []
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(iters):
            step()
        samples.append((time.process_time() - start) / iters * 1e6)
    return statistics.median(samples)


def _case(device: torch.device, tokens: int, features: int, dtype):
    """label -> step function for torch.nn.Linear and te.Linear under each recipe."""
    x = torch.randn(tokens, features, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn(tokens, features, device=device, dtype=dtype)
    steps = {"torch": _step_fn(torch.nn.Linear(features, features, device=device, dtype=dtype), x, dy, None)}
    for key, fp8_recipe in RECIPES.items():
        layer = te.Linear(features, features, params_dtype=dtype, device=device)
        steps["te no-fp8" if fp8_recipe is None else f"te {key}"] = _step_fn(layer, x, dy, fp8_recipe)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda", "all"), default="all")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--no-core", action="store_true", help="stub te-core calls (CPU rows: Python cost only)")
    args = parser.parse_args()
    if args.no_core:
        _stub_core()
    torch.set_num_threads(1)  # tiny CPU ops: OpenMP workers only add noise
    print(f"torch {torch.__version__}")
    print(f"{'device':6s} {'mode':6s} {'case':32s} {'layer':12s} {'us/step':>9s} {'vs torch':>9s}")
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    for name in devices:
        if name == "cuda" and not torch.cuda.is_available():
            print("cuda: not available, skipped")
            continue
        device = torch.device(name)
        if name == "cpu":
            shape, dtype = (16, 32), torch.float32
            modes = {"eager": lambda step: _cpu_process_us(step, args.iters * 5)}
        else:
            shape, dtype = (256, 1024), torch.bfloat16
            modes = {
                "eager": lambda step: _wall_us(step, device, args.iters),
                "graph": lambda step: _wall_us(_graph_step(step, device), device, args.iters),
            }
        case = f"Linear {shape[1]}->{shape[1]}, {shape[0]} tokens, {str(dtype)[6:]}"
        steps = _case(device, shape[0], shape[1], dtype)
        for mode, measure in modes.items():
            base = None
            for label, step in steps.items():
                if mode == "graph" and label == "te no-fp8":
                    continue
                us = measure(step)
                base = us if base is None else base
                print(f"{name:6s} {mode:6s} {case:32s} {label:12s} {us:9.1f} {us / base:8.2f}x")


if __name__ == "__main__":
    main()

"""te.Linear fwd+bwd against torch.nn.Linear in the same run (issue 4 targets).

Two measurements per case, both medians over several rounds:
- wall time per fwd+bwd iteration, averaged over `iters` back-to-back
  iterations then synchronized: for small layers this is host (launch) bound,
  the host-overhead target (FP8 eager <= 1.5x torch BF16 eager at 1024x1024,
  256 tokens);
- CUDA-event time of one iteration after warm-up, for large layers (the
  targets' method: the host's time to the first launches counts);
- graph ms: CUDA-event time of one replay of the step captured as a CUDA graph
  (torch.cuda.graph): the GPU's time alone, no host in the way; "b2b ms": the
  time per replay of 10 replays back to back (the steady state of a training
  loop, with the GPU's clocks up and no idle GPU between steps).
Runs on the CPU too (smoke test; the numbers then mean little):
    python bench/bench_te_pytorch_linear.py [--device cpu] [--iters N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

# (in, out, tokens): the host-overhead case, then the large layers.
CASES = [(1024, 1024, 256), (4096, 4096, 8192), (4096, 14336, 8192), (14336, 4096, 8192)]
RECIPES = {"bf16": None, "delayed": recipe.DelayedScaling(), "current": recipe.Float8CurrentScaling()}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _step_fn(layer, x, dy, fp8_recipe):
    def step():
        # Gradients start from None each step (optimizer.zero_grad's default), so
        # no accumulation kernels run: the work is the layer's fwd+bwd alone.
        x.grad = None
        layer.zero_grad(set_to_none=True)
        with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
            y = layer(x)
        y.backward(dy)

    return step


def _wall_us(step, device, iters: int, rounds: int = 5) -> float:
    for _ in range(3):
        step()
    _sync(device)
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iters):
            step()
        _sync(device)
        samples.append((time.perf_counter() - start) / iters * 1e6)
    return statistics.median(samples)


def _event_ms(step, device, iters: int) -> float:
    if device.type != "cuda":
        return float("nan")
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _warm_up_on_side_stream(step, device, steps: int = 3) -> None:
    """The warm-up torch.cuda.graph asks for before a capture: a few steps on a side stream."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(steps):
            step()
    torch.cuda.current_stream(device).wait_stream(side)


def _graph_step(step, device):
    """step captured with torch.cuda.graph (after a warm-up on a side stream): returns replay."""
    _warm_up_on_side_stream(step, device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def _graph_ms(step, device) -> tuple[float, float]:
    """(ms of one replay, median over 20; ms per replay of 10 back to back, median over 5)."""
    if device.type != "cuda":
        return float("nan"), float("nan")
    replay = _graph_step(step, device)

    def ten_replays():
        for _ in range(10):
            replay()

    return _event_ms(replay, device, 20), _event_ms(ten_replays, device, 5) / 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--small-only", action="store_true", help="only the host-overhead case")
    args = parser.parse_args()
    device = torch.device(args.device)
    cases = CASES[:1] if args.small_only or device.type == "cpu" else CASES
    print(f"torch {torch.__version__}, device {device}")
    print(
        f"{'case':43s} {'recipe':8s} {'wall us/iter':>12s} {'event ms':>9s} {'graph ms':>9s} {'b2b ms':>7s} "
        f"{'vs torch bf16':>14s}"
    )
    for k, n, tokens in cases:
        x = torch.randn(tokens, k, device=device, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(tokens, n, device=device, dtype=torch.bfloat16)
        bias = tokens < 8192  # the large cases are the targets' "no bias" layers
        baseline = torch.nn.Linear(k, n, bias=bias, device=device, dtype=torch.bfloat16)
        base_step = _step_fn(baseline, x, dy, None)
        base_wall = _wall_us(base_step, device, args.iters)
        name = f"Linear {k}->{n}, {tokens} tokens" + ("" if bias else ", no bias")
        base_event, (base_graph, base_b2b) = _event_ms(base_step, device, 20), _graph_ms(base_step, device)
        print(f"{name:43s} {'torch':8s} {base_wall:12.1f} {base_event:9.3f} {base_graph:9.3f} {base_b2b:7.3f}")
        for label, fp8_recipe in RECIPES.items():
            layer = te.Linear(k, n, bias=bias, params_dtype=torch.bfloat16, device=device)  # one per recipe
            step = _step_fn(layer, x, dy, fp8_recipe)
            wall = _wall_us(step, device, args.iters)
            event, (graph, b2b) = _event_ms(step, device, 20), _graph_ms(step, device)
            print(f"{name:43s} {label:8s} {wall:12.1f} {event:9.3f} {graph:9.3f} {b2b:7.3f} {wall / base_wall:13.2f}x")


if __name__ == "__main__":
    main()

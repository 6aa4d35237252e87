"""te.LayerNormMLP fwd+bwd against a torch BF16 composition in the same run.

Case (shared/reference/targets.md): RMSNorm + SwiGLU, hidden 4096, FFN 14336,
8192 tokens, BF16 parameters; recipes BF16 (no FP8), DelayedScaling and
Float8CurrentScaling. Columns:
- event ms: CUDA-event time of one fwd+bwd step, median after warm-up
  (target <= 6.9 ms under FP8; wall time on the CPU);
- graph ms: the same step captured as a CUDA graph, one replay (the GPU's
  time alone, without the host's launch latency); b2b ms: per replay of 10
  replays back to back (a training loop's steady state);
- saved MiB: memory allocated by the forward that is still held after it,
  less the output (what the step keeps for backward; the input and the
  parameters existed before), and "hooks MiB" the same counted through
  torch.autograd.graph.saved_tensors_hooks (tensors saved for backward, less
  the parameters and the input);
- peak MiB: peak allocated during one step above the memory before it
  (target under FP8: saved <= 0.7x and peak <= 1x the te BF16 run's).
"current sep-amax" is Float8CurrentScaling with the amax of the norm output,
activation output and activation gradient taken by separate passes
(module/_operand.FUSE_AMAX = False) instead of from the producing kernels;
"delayed/current sep-recompute" recompute fc2's wgrad operand (act(h) FP8
columnwise) in a pass of its own (module/_operand.FUSE_ACT_RECOMPUTE = False)
instead of taking it from the activation backward's pass.
Runs on the CPU too, on a small case (a smoke test; times mean little):
    python bench/bench_te_pytorch_mlp.py [--device cpu] [--iters N]
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback

import torch
from bench_te_pytorch_linear import _event_ms, _graph_ms  # (bench/ is on sys.path when run as a script)

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.module import _operand

GPU_CASE = (4096, 14336, 8192)  # hidden, ffn, tokens
CPU_CASE = (256, 512, 128)
RECIPES = {
    "te bf16": None,
    "delayed": recipe.DelayedScaling(),
    "current": recipe.Float8CurrentScaling(),
    "current sep-amax": recipe.Float8CurrentScaling(),
    "delayed sep-recompute": recipe.DelayedScaling(),
    "current sep-recompute": recipe.Float8CurrentScaling(),
}
MIB = 2.0**20


class TorchMLP(torch.nn.Module):
    """The plain torch composition: RMSNorm, fc1 (2F outputs), silu(a) * b, fc2."""

    def __init__(self, hidden, ffn, device):
        super().__init__()
        kw = {"device": device, "dtype": torch.bfloat16}
        self.norm = torch.nn.RMSNorm(hidden, eps=1e-5, **kw)
        self.fc1 = torch.nn.Linear(hidden, 2 * ffn, **kw)
        self.fc2 = torch.nn.Linear(ffn, hidden, **kw)

    def forward(self, x):
        a, b = self.fc1(self.norm(x)).chunk(2, dim=-1)
        return self.fc2(torch.nn.functional.silu(a) * b)


def _forward(layer, x, fp8_recipe):
    with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
        return layer(x)


def _time_ms(step, device, iters: int) -> float:
    """Median ms of one step after warm-up: CUDA events on the GPU, wall time on the CPU."""
    for _ in range(3):
        step()
    if device.type == "cuda":
        return _event_ms(step, device, iters)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _hook_bytes(layer, x, fp8_recipe) -> int:
    saved = []
    # (Packing t.detach(), not t: a saved output that holds its own grad_fn is a
    # reference cycle through C++ that keeps the whole graph alive.)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t.detach(), lambda t: t):
        y = _forward(layer, x, fp8_recipe)
    existing = {p.data_ptr() for p in layer.parameters()} | {x.data_ptr()}
    seen, total = set(), 0
    for t in saved:
        key = (t.data_ptr(), t.numel(), t.dtype)
        if t.data_ptr() not in existing and key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    del y
    return total


def _memory(layer, x, dy, fp8_recipe, device):
    """(saved bytes, peak bytes above the start) of one training step, CUDA only."""
    if device.type != "cuda":
        return float("nan"), float("nan")
    layer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y = _forward(layer, x, fp8_recipe)
    torch.cuda.synchronize()
    saved = torch.cuda.memory_allocated() - before - y.numel() * y.element_size()
    y.backward(dy)
    del y
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    layer.zero_grad(set_to_none=True)
    return saved, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    device = torch.device(args.device)
    hidden, ffn, tokens = GPU_CASE if device.type == "cuda" else CPU_CASE
    print(f"torch {torch.__version__}, device {device}")
    print(f"LayerNormMLP RMSNorm+SwiGLU {hidden}/{ffn}, {tokens} tokens, bf16 params")
    x_values = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
    dy = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
    header = (
        f"{'run':22s} {'event ms':>9s} {'vs torch':>9s} {'graph ms':>9s} {'b2b ms':>7s} {'saved MiB':>10s} "
        f"{'hooks MiB':>10s} {'peak MiB':>9s}"
    )
    print(header)
    rows = {}
    models = {"torch": (TorchMLP(hidden, ffn, device), None)}
    for label, fp8_recipe in RECIPES.items():
        layer = te.LayerNormMLP(
            hidden, ffn, normalization="RMSNorm", activation="swiglu", params_dtype=torch.bfloat16, device=device
        )
        models[label] = (layer, fp8_recipe)
    for label, (layer, fp8_recipe) in models.items():
        # Each run its own input leaf: a leaf's gradient accumulator keeps the
        # stream it was made on while a graph holds it; one kept from the
        # previous run's steps on the default stream made the capture wait on
        # that stream ("operation would make the legacy stream depend on a
        # capturing blocking stream"). In training the input is a fresh activation.
        x = x_values.clone().requires_grad_()
        _operand.FUSE_AMAX = label != "current sep-amax"
        _operand.FUSE_ACT_RECOMPUTE = not label.endswith("sep-recompute")

        def step(layer=layer, fp8_recipe=fp8_recipe, x=x):
            x.grad = None  # (no accumulation kernel: the step's own work alone)
            _forward(layer, x, fp8_recipe).backward(dy)
            layer.zero_grad(set_to_none=True)

        ms = _time_ms(step, device, args.iters)
        try:
            graph, b2b = _graph_ms(step, device)
        except RuntimeError as err:  # (reported, not fatal: the other columns still mean something)
            print(f"{label}: CUDA-graph capture failed: {str(err).splitlines()[0]}")
            traceback.print_exc()  # (to stderr: where in the step the capture broke)
            graph = b2b = float("nan")
        saved, peak = _memory(layer, x, dy, fp8_recipe, device)
        hooks = _hook_bytes(layer, x, fp8_recipe)
        rows[label] = (ms, saved, peak, hooks)
        ratio = ms / rows["torch"][0]
        mib = f"{saved / MIB:10.1f} {hooks / MIB:10.1f} {peak / MIB:9.1f}"
        print(f"{label:22s} {ms:9.3f} {ratio:8.2f}x {graph:9.3f} {b2b:7.3f} {mib}")
    bf16 = rows["te bf16"]
    for label in ("delayed", "current"):
        ms, saved, peak, hooks = rows[label]
        print(
            f"{label}: time {ms:.3f} ms (target <= 6.9), saved {saved / bf16[1]:.2f}x te bf16 "
            f"(hooks {hooks / bf16[3]:.2f}x; target <= 0.70), peak {peak / bf16[2]:.2f}x te bf16 (target <= 1.00)"
        )
    _operand.FUSE_AMAX = True
    _operand.FUSE_ACT_RECOMPUTE = True
    saving = rows["current sep-amax"][0] - rows["current"][0]
    print(f"current: the fused amax saves {saving:.3f} ms per step over separate amax passes")
    for label in ("delayed", "current"):
        saving = rows[f"{label} sep-recompute"][0] - rows[label][0]
        extra = (rows[label][2] - rows[f"{label} sep-recompute"][2]) / MIB
        print(
            f"{label}: the fused act recompute saves {saving:.3f} ms per step over its separate pass "
            f"(peak {extra:+.1f} MiB)"
        )


if __name__ == "__main__":
    main()

"""The main job: train a small transformer-style MLP block with Transformer Engine modules under
every recipe and compare the loss with high-precision training.

    python examples/train_demo.py [--steps 100] [--device cpu|cuda]

The task is a regression onto a fixed random "teacher" network (so the best loss is known to be
near 0 and every recipe can be compared on the same data stream). The student is

    h = x + LayerNormMLP(x)          (RMSNorm -> fc1 -> SwiGLU -> fc2)
    y = LayerNormLinear(h)           (LayerNorm -> Linear)

trained with Adam, the same seed, batches and initial weights for each recipe. On a machine
without a GPU everything runs on te-core's CPU backend (the same FP8 bytes a GPU would produce).
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

HIDDEN, FFN, TOKENS = 256, 512, 256

RECIPES = {
    "high precision": None,
    "DelayedScaling": recipe.DelayedScaling(),
    "Float8CurrentScaling": recipe.Float8CurrentScaling(),
    "Float8BlockScaling": recipe.Float8BlockScaling(),
    "MXFP8BlockScaling": recipe.MXFP8BlockScaling(),
    "NVFP4BlockScaling": recipe.NVFP4BlockScaling(),
}


class Block(torch.nn.Module):
    def __init__(self, device: str) -> None:
        super().__init__()
        self.mlp = te.LayerNormMLP(HIDDEN, FFN, normalization="RMSNorm", activation="swiglu", device=device)
        self.out = te.LayerNormLinear(HIDDEN, HIDDEN, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x + self.mlp(x))


def teacher(device: str):
    """A fixed random two-layer network: the target function."""
    g = torch.Generator().manual_seed(1)
    w1 = torch.randn(HIDDEN, HIDDEN, generator=g) / HIDDEN**0.5
    w2 = torch.randn(HIDDEN, HIDDEN, generator=g) / HIDDEN**0.5
    w1, w2 = w1.to(device), w2.to(device)
    return lambda x: torch.tanh(x @ w1) @ w2


def train(fp8_recipe, steps: int, device: str, target) -> tuple[list[float], float]:
    torch.manual_seed(0)
    model = Block(device)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    data = torch.Generator(device=device).manual_seed(2)
    losses = []
    start = time.perf_counter()
    for _ in range(steps):
        x = torch.randn(TOKENS, HIDDEN, device=device, generator=data)
        with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
            y = model(x)
        loss = torch.nn.functional.mse_loss(y.float(), target(x))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - start
    return losses, seconds / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    # (The one-time notes, e.g. that a block GEMM is emulated on this device, without source lines.)
    warnings.formatwarning = lambda message, category, *rest: f"  note: {message}\n"
    target = teacher(args.device)
    print(f"training {args.steps} steps of a {HIDDEN}/{FFN} MLP block on {TOKENS} tokens ({args.device})\n")
    header = ("recipe", "loss@1", "loss@25%", "loss@50%", "final", "vs high prec.", "ms/step")
    print("{:<22} {:>8} {:>9} {:>9} {:>8} {:>14} {:>8}".format(*header))
    baseline = None
    for name, fp8_recipe in RECIPES.items():
        losses, step_s = train(fp8_recipe, args.steps, args.device, target)
        final = sum(losses[-10:]) / len(losses[-10:])  # (mean of the last 10: less noisy)
        baseline = final if baseline is None else baseline
        marks = [losses[0], losses[args.steps // 4], losses[args.steps // 2]]
        print(
            f"{name:<22} {marks[0]:8.4f} {marks[1]:9.4f} {marks[2]:9.4f} {final:8.4f} "
            f"{final / baseline:13.2f}x {step_s * 1e3:8.1f}"
        )
    print("\n(final = mean loss of the last 10 steps; 'vs high prec.' = its ratio to the unquantized run)")


if __name__ == "__main__":
    main()

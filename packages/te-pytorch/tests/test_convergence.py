"""A tiny model trains as well under FP8 as in high precision.

A 3-layer te.Linear MLP (GELU) learns a random tanh teacher (32 -> 16) with
Adam for 300 steps of 64 samples, from the same initialization and data in
FP32, BF16 (torch.autocast) and FP8 with Float8CurrentScaling and
DelayedScaling. Losses are averaged over windows of 20 steps.

Tolerance: every window of an FP8 run is within 10% of the FP32 run's
(observed: 2.5-4% over several seeds; the E4M3 operands of the forward GEMMs
carry 2^-4 relative error and the E5M2 gradients 2^-3, which perturb each
update a little), BF16 within 2%, and FP32 must reduce the loss by 8x.
Runs on 2 CPU cores in a few seconds (conftest keeps torch to one intra-op
thread so that its spinning OpenMP workers do not compete with te-core's).
"""

from __future__ import annotations

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.module]

STEPS, BATCH, WINDOW = 300, 64, 20


def _train(seed: int, fp8_recipe=None, bf16: bool = False) -> list[float]:
    data = torch.Generator().manual_seed(seed)
    teacher = (torch.randn(32, 64, generator=data) / 32**0.5, torch.randn(64, 16, generator=data) / 8)
    inputs = torch.randn(STEPS, BATCH, 32, generator=data)
    targets = torch.tanh(inputs @ teacher[0]) @ teacher[1]
    torch.manual_seed(seed)
    layers = [te.Linear(32, 64, device="cpu"), te.Linear(64, 64, device="cpu"), te.Linear(64, 16, device="cpu")]
    for layer in layers:
        torch.nn.init.normal_(layer.weight, std=layer.in_features**-0.5)
    model = torch.nn.Sequential(layers[0], torch.nn.GELU(), layers[1], torch.nn.GELU(), layers[2])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for x, y in zip(inputs, targets):
        with (
            te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe),
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16),
        ):
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return [sum(losses[i : i + WINDOW]) / WINDOW for i in range(0, STEPS, WINDOW)]


def test_fp8_tracks_high_precision_loss():
    seed = int(torch.randint(0, 2**31, ()))
    baseline = _train(seed)
    assert baseline[-1] < baseline[0] / 8, f"the FP32 baseline did not learn: {baseline}"
    runs = {
        "bf16": (_train(seed, bf16=True), 0.02),
        "current": (_train(seed, recipe.Float8CurrentScaling()), 0.10),
        "delayed": (_train(seed, recipe.DelayedScaling(amax_history_len=16)), 0.10),
    }
    for name, (losses, tolerance) in runs.items():
        relative = [abs(a - b) / b for a, b in zip(losses, baseline)]
        assert max(relative) <= tolerance, (
            f"{name}: windowed loss differs from FP32 by up to {max(relative):.3f} "
            f"(tolerance {tolerance}); {name} {losses} vs FP32 {baseline}"
        )

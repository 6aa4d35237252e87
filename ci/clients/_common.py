"""What the client checks share: a small model, its data, and the proof that
FP8 ran (delayed scaling recorded amaxes in every converted te.Linear)."""

from __future__ import annotations

import torch

import transformer_engine.pytorch as te

# 8 tokens a batch: the reference's smallest per-tensor FP8 GEMM (Accelerate's
# own tests use it); feature sizes fit both te's and the clients' rules.
BATCH, IN, HIDDEN, OUT = 8, 32, 64, 16


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(IN, HIDDEN),
        torch.nn.LayerNorm(HIDDEN),
        torch.nn.GELU(),
        torch.nn.Linear(HIDDEN, OUT),
    )


def make_data(batches: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    target = torch.randn(IN, OUT, generator=generator) / IN**0.5
    data = []
    for _ in range(batches):
        x = torch.randn(BATCH, IN, generator=generator)
        data.append((x, x @ target))
    return data


def te_linears(model: torch.nn.Module) -> list[te.Linear]:
    return [m for m in model.modules() if isinstance(m, te.Linear)]


def assert_fp8_ran(model: torch.nn.Module, expected_linears: int) -> None:
    """Every te.Linear ran under DelayedScaling: its forward amax history holds nonzero amaxes."""
    linears = te_linears(model)
    assert len(linears) == expected_linears, f"{len(linears)} te.Linear layers, expected {expected_linears}"
    for layer in linears:
        state = layer.fp8_meta["scaling_fwd"]
        assert state is not None and state.delayed, f"{layer} never ran under a DelayedScaling recipe"
        assert bool((state.amax_history.abs().sum(0)[:2] > 0).all()), f"{layer}: no amax recorded for input/weight"


def assert_learned(losses: list[float], what: str) -> None:
    assert all(torch.isfinite(torch.tensor(losses))), f"{what}: non-finite loss {losses}"
    assert losses[-1] < losses[0], f"{what}: the loss did not go down: {losses}"
    print(f"{what}: loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps")

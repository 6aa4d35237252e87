"""Training one recipe: the same seed, initial weights and batches for every recipe, a tqdm bar
with the loss and tokens/s, then validation loss, a KV-cache text sample and the peak memory."""

from __future__ import annotations

import math
import resource
import time
import warnings
from contextlib import contextmanager

import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe as te_recipe

from .data import Batches
from .model import GPT, Config, generate

RECIPES = {
    "BF16": None,
    "DelayedScaling": te_recipe.DelayedScaling,
    "Float8CurrentScaling": te_recipe.Float8CurrentScaling,
    "Float8BlockScaling": te_recipe.Float8BlockScaling,
    "MXFP8BlockScaling": te_recipe.MXFP8BlockScaling,
    "NVFP4BlockScaling": te_recipe.NVFP4BlockScaling,
}
SEED = 0


@contextmanager
def precision(name: str, device: torch.device):
    """BF16 activations through torch.autocast for all; the FP8/FP4 recipes quantize the GEMM
    operands on top (the weights stay FP32 master weights, updated by the optimizer)."""
    factory = RECIPES[name]
    with torch.autocast(device.type, dtype=torch.bfloat16):
        with te.autocast(enabled=factory is not None, recipe=factory() if factory else None):
            yield


def lr_at(step: int, cfg: Config) -> float:
    """Linear warm-up over 10% of the steps, then cosine decay to 10% of the peak."""
    warm = max(1, cfg.steps // 10)
    if step < warm:
        return cfg.lr * (step + 1) / warm
    done = (step - warm) / max(1, cfg.steps - warm)
    return cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * done)))


def loss_of(model: GPT, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids[:, :-1])
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


class _Quiet:
    """The steps without a bar (tests; tqdm then need not be installed)."""

    def __init__(self, steps: int):
        self.steps = steps

    def __iter__(self):
        return iter(range(self.steps))

    def set_postfix(self, **_):
        pass


def progress_bar(steps: int, name: str):
    from tqdm import tqdm

    return tqdm(range(steps), desc=f"{name:>20}", unit="step", dynamic_ncols=True)


def train(
    name: str, cfg: Config, data: Batches, device: torch.device, progress: bool = True, seed: int = SEED, sample=True
) -> dict:
    """Trains cfg.steps steps under recipe `name` from initial weights drawn with `seed`; returns
    the losses and the measurements (with sample=False, no validation loss or text sample)."""
    torch.manual_seed(seed)
    model = GPT(cfg, str(device))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.01)
    losses, tokens = [], cfg.batch * cfg.seq
    bar = progress_bar(cfg.steps, name) if progress else _Quiet(cfg.steps)
    start, cpu_start = None, None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in bar:
            if step == 1:  # the first step (allocations, one-time setup) is left out of tokens/s
                start, cpu_start = time.perf_counter(), time.process_time()
            for group in opt.param_groups:
                group["lr"] = lr_at(step, cfg)
            ids = torch.from_numpy(data.train_batch(step)).to(device)
            with precision(name, device):
                loss = loss_of(model, ids)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
            if start is not None and step % 5 == 0:
                rate = tokens * step / max(time.perf_counter() - start, 1e-9)
                bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{rate:,.0f}")
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        result = dict(name=name, losses=losses, tokens_per_s=tokens * (cfg.steps - 1) / seconds)
        result.update(train_seconds=seconds, train_cpu_seconds=cpu_seconds)
        if sample:
            result.update(evaluate(model, name, cfg, data, device))
    result["warnings"] = sorted({str(w.message) for w in caught})
    result.update(peak_memory(device))
    return result


def evaluate(model: GPT, name: str, cfg: Config, data: Batches, device: torch.device) -> dict:
    """Validation loss (held-out 10% of the corpus) and a text sample, both under the recipe."""
    model.eval()
    with torch.no_grad(), precision(name, device):
        val = [loss_of(model, torch.from_numpy(b).to(device)).item() for b in data.val_batches()]
        prompts = torch.from_numpy(data.prompts(cfg.samples, cfg.prompt)).to(device)
        start = time.perf_counter()
        text = generate(model, prompts, cfg.new_tokens, seed=SEED)
        gen_seconds = time.perf_counter() - start
    sample = bytes(text[0].tolist()).decode("utf-8", errors="replace")
    return dict(val_loss=sum(val) / len(val), sample=sample, prompt_chars=cfg.prompt, gen_seconds=gen_seconds)


def peak_memory(device: torch.device) -> dict:
    """GPU: torch.cuda.max_memory_allocated (reset before each recipe). CPU: the peak resident set
    size of this process (getrusage ru_maxrss), which on the CPU runs one process per recipe."""
    if device.type == "cuda":
        return dict(
            peak_mib=torch.cuda.max_memory_allocated(device) / 2**20, memory_kind="torch.cuda.max_memory_allocated"
        )
    return dict(peak_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, memory_kind="peak RSS (ru_maxrss)")


def current_rss_mib() -> float | None:
    """This process's resident set size now (Linux /proc), or None where that is not available."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return None

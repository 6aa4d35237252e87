"""te.TransformerLayer fwd+bwd (Llama-3-8B-like) against a plain torch layer in the same run.

Case (shared/reference/targets.md, "Side by side"): hidden 4096, FFN 14336 SwiGLU, RMSNorm,
32 query / 8 KV heads (d 128), causal self-attention, s 4096, b 2, no bias, BF16 parameters,
attn_input_format "bshd"; recipes BF16 (no FP8), DelayedScaling, Float8CurrentScaling.
Targets: BF16 <= 18.0 ms, FP8 <= 11.0 ms per fwd+bwd; FP8 saved activations <= 0.6x and
peak <= 0.8x the te BF16 run's. Columns:
- event ms: CUDA-event time of one fwd+bwd step, median after warm-up;
- saved MiB: memory the forward still holds after it, less the output (what the step keeps
  for backward); peak MiB: peak allocated during one step above the memory before it.
The torch baseline: torch.nn.RMSNorm + nn.Linear (fused QKV) + SDPA (is_causal, GQA via
enable_gqa) + nn.Linear + the same SwiGLU MLP, BF16.
Runs on the CPU too on a small case (a smoke test; times mean little):
    python bench/bench_transformer_layer.py [--device cpu] [--iters N]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from bench_te_pytorch_mlp import _forward, _memory, _time_ms  # (bench/ is on sys.path when run as a script)

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

GPU_CASE = {"hidden": 4096, "ffn": 14336, "heads": 32, "kv_heads": 8, "seq": 4096, "batch": 2}
CPU_CASE = {"hidden": 256, "ffn": 512, "heads": 4, "kv_heads": 2, "seq": 64, "batch": 2}
RECIPES = {"te bf16": None, "delayed": recipe.DelayedScaling(), "current": recipe.Float8CurrentScaling()}
MIB = 2.0**20


class TorchLayer(torch.nn.Module):
    """Pre-norm Llama block from torch parts (bshd)."""

    def __init__(self, c, device):
        super().__init__()
        kw = {"device": device, "dtype": torch.bfloat16, "bias": False}
        h, d = c["hidden"], c["hidden"] // c["heads"]
        self.heads, self.kv_heads, self.d = c["heads"], c["kv_heads"], d
        self.norm1 = torch.nn.RMSNorm(h, eps=1e-5, device=device, dtype=torch.bfloat16)
        self.qkv = torch.nn.Linear(h, (c["heads"] + 2 * c["kv_heads"]) * d, **kw)
        self.proj = torch.nn.Linear(h, h, **kw)
        self.norm2 = torch.nn.RMSNorm(h, eps=1e-5, device=device, dtype=torch.bfloat16)
        self.fc1 = torch.nn.Linear(h, 2 * c["ffn"], **kw)
        self.fc2 = torch.nn.Linear(c["ffn"], h, **kw)

    def forward(self, x):
        b, s, _ = x.shape
        qkv = self.qkv(self.norm1(x))
        q, k, v = qkv.split([self.heads * self.d, self.kv_heads * self.d, self.kv_heads * self.d], dim=-1)
        q = q.view(b, s, self.heads, self.d).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.d).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.d).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.proj(o.transpose(1, 2).reshape(b, s, -1))
        a, g = self.fc1(self.norm2(x)).chunk(2, dim=-1)
        return x + self.fc2(F.silu(a) * g)


def _te_layer(c, device):
    return te.TransformerLayer(
        c["hidden"],
        c["ffn"],
        c["heads"],
        num_gqa_groups=c["kv_heads"],
        layernorm_epsilon=1e-5,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        self_attn_mask_type="causal",
        normalization="RMSNorm",
        activation="swiglu",
        bias=False,
        attn_input_format="bshd",
        params_dtype=torch.bfloat16,
        device=device,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    device = torch.device(args.device)
    c = GPU_CASE if device.type == "cuda" else CPU_CASE
    print(f"torch {torch.__version__}, device {device}")
    print(f"TransformerLayer {c}")
    x_values = torch.randn(c["batch"], c["seq"], c["hidden"], device=device, dtype=torch.bfloat16)
    dy = torch.randn_like(x_values)
    print(f"{'run':10s} {'event ms':>9s} {'vs torch':>9s} {'saved MiB':>10s} {'peak MiB':>9s}")
    rows = {}
    runs = [("torch", TorchLayer(c, device), None)] + [(k, _te_layer(c, device), r) for k, r in RECIPES.items()]
    for label, layer, fp8_recipe in runs:
        x = x_values.clone().requires_grad_()

        def step(layer=layer, fp8_recipe=fp8_recipe, x=x):
            x.grad = None
            _forward(layer, x, fp8_recipe).backward(dy)
            layer.zero_grad(set_to_none=True)

        ms = _time_ms(step, device, args.iters)
        saved, peak = _memory(layer, x, dy, fp8_recipe, device)
        rows[label] = (ms, saved, peak)
        print(f"{label:10s} {ms:9.3f} {ms / rows['torch'][0]:8.2f}x {saved / MIB:10.1f} {peak / MIB:9.1f}")
        del layer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    bf16 = rows["te bf16"]
    print(f"te bf16: {bf16[0]:.3f} ms (target <= 18.0)")
    for label in ("delayed", "current"):
        ms, saved, peak = rows[label]
        print(
            f"{label}: {ms:.3f} ms (target <= 11.0), saved {saved / bf16[1]:.2f}x te bf16 (target <= 0.6), "
            f"peak {peak / bf16[2]:.2f}x (target <= 0.8)"
        )


if __name__ == "__main__":
    main()

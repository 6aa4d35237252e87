"""The GPT: token embedding, N x te.TransformerLayer (pre-RMSNorm, causal GQA self-attention with
rotary position embeddings, SwiGLU MLP), a final te.RMSNorm and an LM head through te.Linear.
Sampling runs incrementally with the KV cache of te.InferenceParams."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

import transformer_engine.pytorch as te

from .data import VOCAB


@dataclass(frozen=True)
class Config:
    """Model and training sizes. Every GEMM dim (hidden, ffn, 2*ffn, the q/kv projections, the
    vocabulary) and the tokens per step (batch * seq) and per decoding step (the sample batch) are
    multiples of 32, the strictest rule of the recipes (MXFP8 and NVFP4; the FP8 ones need 16)."""

    layers: int
    hidden: int
    heads: int
    groups: int  # key/value heads (GQA)
    ffn: int
    seq: int
    batch: int
    steps: int
    lr: float
    samples: int = 32  # sequences generated at once (a multiple of 32: one token each per step)
    prompt: int = 32
    new_tokens: int = 96

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def check(self) -> None:
        dims = dict(hidden=self.hidden, ffn=self.ffn, kv=self.groups * self.head_dim, tokens=self.seq * self.batch)
        dims.update(samples=self.samples, prompt_tokens=self.samples * self.prompt)
        bad = {k: v for k, v in dims.items() if v % 32}
        if bad:
            raise ValueError(f"these sizes must be multiples of 32 for every recipe: {bad}")


# CPU: a few minutes for all six recipes on 2 cores. GPU: the size where FP8 GEMMs start to pay.
SMALL = Config(layers=2, hidden=64, heads=4, groups=2, ffn=128, seq=64, batch=8, steps=300, lr=3e-3)
LARGE = Config(layers=8, hidden=512, heads=8, groups=2, ffn=1536, seq=512, batch=16, steps=600, lr=1e-3)


class GPT(torch.nn.Module):
    def __init__(self, cfg: Config, device: str):
        super().__init__()
        self.cfg = cfg
        self.embed = torch.nn.Embedding(VOCAB, cfg.hidden, device=device)
        torch.nn.init.normal_(self.embed.weight, std=0.02)
        self.layers = torch.nn.ModuleList(
            te.TransformerLayer(
                cfg.hidden,
                cfg.ffn,
                cfg.heads,
                num_gqa_groups=cfg.groups,
                hidden_dropout=0.0,
                attention_dropout=0.0,
                layer_number=i + 1,  # the KV cache keys each layer by its number
                self_attn_mask_type="causal",
                normalization="RMSNorm",
                activation="swiglu",
                bias=False,
                attn_input_format="bshd",
                device=device,
            )
            for i in range(cfg.layers)
        )
        self.norm = te.RMSNorm(cfg.hidden, device=device)
        self.head = te.Linear(cfg.hidden, VOCAB, bias=False, device=device)
        longest = max(cfg.seq, cfg.prompt + cfg.new_tokens)
        rope = te.RotaryPositionEmbedding(cfg.head_dim)(longest)
        self.register_buffer("rope", rope.to(device), persistent=False)

    def forward(self, ids: torch.Tensor, inference_params=None) -> torch.Tensor:
        """ids [batch, s] -> logits [batch, s, VOCAB]. With inference_params, ids are the new tokens
        of each sequence and attention also sees the cached ones (positions continue from them)."""
        x = self.embed(ids)
        extra = {}
        if inference_params is not None:
            extra = dict(self_attn_mask_type="padding_causal", inference_params=inference_params)
        # Incremental steps take the whole table: the layers offset it by each sequence's cached length.
        rope = self.rope if inference_params is not None else self.rope[: ids.shape[1]]
        for layer in self.layers:
            x = layer(x, rotary_pos_emb=rope, **extra)
        return self.head(self.norm(x))


@torch.no_grad()
def generate(model: GPT, prompts: torch.Tensor, new_tokens: int, top_k: int = 5, seed: int = 0) -> torch.Tensor:
    """Top-k sampling (temperature 1, fixed seed) of new_tokens per prompt with the KV cache:
    the prompt runs once, then one token per sequence per step. Call it inside the autocast
    contexts the model trained under. Returns [n, prompt + new_tokens]."""
    cfg = model.cfg
    n, length = prompts.shape
    params = te.InferenceParams(
        n,
        length + new_tokens,
        num_heads_kv=cfg.groups,
        head_dim_k=cfg.head_dim,
        dtype=torch.bfloat16,
        qkv_format="bshd",
    )
    gen = torch.Generator(device=prompts.device).manual_seed(seed)
    params.pre_step(OrderedDict((i, length) for i in range(n)))
    logits = model(prompts, inference_params=params)[:, -1].float()
    out = [prompts]
    for _ in range(new_tokens):
        top, index = logits.topk(top_k, dim=-1)
        choice = torch.multinomial(torch.softmax(top, dim=-1), 1, generator=gen)
        token = index.gather(-1, choice)
        out.append(token)
        params.pre_step(OrderedDict((i, 1) for i in range(n)))
        logits = model(token, inference_params=params)[:, -1].float()
    return torch.cat(out, dim=1)

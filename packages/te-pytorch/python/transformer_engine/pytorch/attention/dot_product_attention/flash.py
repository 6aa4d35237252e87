"""The "flash" backend: torch.nn.functional.scaled_dot_product_attention.

The reference's FlashAttention backend calls the flash-attn package; here it is
torch's SDPA, whose CUDA kernels are FlashAttention-2 and memory-efficient
attention (and cuDNN's, where torch enables it). It covers the plain cases only
(no bias, vanilla softmax, no mask or a top-left causal mask, bshd/sbhd, GQA,
dropout), which are what most models run. Measured on the H200 (2026-12-02),
te-core's own CUDA kernel is about 200x slower than SDPA on the Llama shape,
and te-core's cuDNN path is opt-in until its crash is fixed: so on CUDA this
backend comes first when it can run the call. On the CPU it runs only when
NVTE_FLASH_ATTN=1 asks for it (te-core's CPU backend is the default there).
"""

from __future__ import annotations

import os

import torch

_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)  # SDPA's enable_gqa


def plan(cfg, call, q, k, v):
    """None when SDPA runs the call, else the reason it cannot (a string)."""
    if not q.is_cuda and os.environ.get("NVTE_FLASH_ATTN") != "1":
        return "the CPU (set NVTE_FLASH_ATTN=1 to use torch SDPA there)"
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"dtype {q.dtype}"
    if cfg.qkv_format not in ("bshd", "sbhd"):
        return f"qkv_format={cfg.qkv_format!r}"
    if cfg.bias_type != "no_bias" or cfg.softmax_type != "vanilla" or cfg.softcap > 0 or cfg.return_max_logit:
        return "a bias, a softmax variant, softcap or return_max_logit"
    sq, skv = (q.shape[1], k.shape[1]) if cfg.qkv_format == "bshd" else (q.shape[0], k.shape[0])
    causal = cfg.mask_type in ("causal", "causal_bottom_right")
    if cfg.mask_type not in ("no_mask", "causal", "causal_bottom_right"):
        return f"attn_mask_type={cfg.mask_type!r}"
    if causal and cfg.mask_type == "causal_bottom_right" and sq != skv:
        return "a bottom-right causal mask with unequal query and key lengths"
    if cfg.window not in ((-1, -1), (-1, 0)) or (cfg.window == (-1, 0) and not causal):
        return f"window_size={cfg.window}"
    if any(call.get(n) is not None for n in ("attention_mask", "cu_seqlens_q", "cu_seqlens_kv")):
        return "an attention_mask or cu_seqlens"
    if q.shape[-2] % k.shape[-2]:
        return "query heads not a multiple of the key/value heads"
    return None


def run(cfg, q, k, v, training: bool):
    """[b, s, h, d] / [s, b, h, d] in, the module's [b, s, h*dv] / [s, b, h*dv] out."""
    perm = (0, 2, 1, 3) if cfg.qkv_format == "bshd" else (1, 2, 0, 3)  # -> [b, h, s, d] views
    qh, kh, vh = (t.permute(*perm) for t in (q, k, v))
    kw = {}
    if qh.shape[1] != kh.shape[1]:
        if _GQA:
            kw["enable_gqa"] = True
        else:  # (torch < 2.5: the key/value heads repeated)
            group = qh.shape[1] // kh.shape[1]
            kh, vh = kh.repeat_interleave(group, dim=1), vh.repeat_interleave(group, dim=1)
    o = torch.nn.functional.scaled_dot_product_attention(
        qh,
        kh,
        vh,
        dropout_p=cfg.dropout if training else 0.0,
        is_causal=cfg.mask_type in ("causal", "causal_bottom_right"),
        scale=cfg.scale,
        **kw,
    )
    o = o.permute(0, 2, 1, 3) if cfg.qkv_format == "bshd" else o.permute(2, 0, 1, 3)
    return o.reshape(*o.shape[:2], -1)
